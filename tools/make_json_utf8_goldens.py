#!/usr/bin/env python3
"""Which bytes inside (and outside) JSON strings the reference libraries accept, per file type.

Writes data/json/utf8_goldens.jsonl and data/json/VERSIONS.txt. Each reference reads a small document
with one payload spliced in (raw UTF-8 that is valid or not, \\u escapes with lone or paired surrogates,
\\u0000), and the line records whether it loaded:

    {"template": NAME, "file": F, "hex": H}
        a document (H: its bytes in hex) with the two bytes "@@" where a payload goes
    {"template": NAME, "label": L, "payload": P, "accepted": true|false, "error": E}
        P: the payload's bytes in hex; E: the reference's message (its first 60 characters), "" when accepted

The references, one per file type (what reads that file in transformers / tokenizers / safetensors):
    tokenizer.json                 tokenizers.Tokenizer.from_file (Rust serde_json over a String read as
                                   UTF-8). Templates: a vocab entry's name (member name), an added
                                   token's content (string value), the text before the top level object.
    config.json                    transformers.AutoConfig.from_pretrained: PretrainedConfig's
                                   _dict_from_json_file, open(encoding="utf-8") + json.loads.
                                   Templates: a value of an unknown member, an unknown member's name.
    model.safetensors (header)     safetensors.safe_open(..., "np") and .keys() / .metadata() (Rust
                                   serde_json over std::str::from_utf8 of the header). Templates: a tensor
                                   name, a __metadata__ value.
tokenizer_config.json, model.safetensors.index.json and adapter_config.json are read by Python's json
through open(encoding="utf-8") in transformers (peft: open() in the locale's encoding, UTF-8 here),
the same reader as config.json; messages JSON is gemma4.h's own input. They are not probed separately.

Usage (from the repository root): venv/bin/python tools/make_json_utf8_goldens.py
"""

import datetime
import json
import os
import platform
import struct
import sys
import tempfile

import numpy as np
import safetensors
import tokenizers
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer

assert tokenizers.__version__ == "0.23.3", tokenizers.__version__
assert transformers.__version__ == "5.23.0", transformers.__version__
assert safetensors.__version__ == "0.8.0", safetensors.__version__

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "data", "json")

# (label, payload bytes). Inside strings unless the template puts "@@" outside one.
PAYLOADS = [
    ("ascii", b"abc"),
    ("valid 2-byte (e9)", b"caf\xc3\xa9"),
    ("valid 4-byte (U+1F600)", b"\xf0\x9f\x98\x80"),
    ("U+FFFF noncharacter (ef bf bf)", b"\xef\xbf\xbf"),
    ("U+10FFFF (f4 8f bf bf)", b"\xf4\x8f\xbf\xbf"),
    ("raw ff", b"a\xffb"),
    ("raw fe", b"\xfe"),
    ("lone continuation 80", b"a\x80"),
    ("truncated 2-byte (c3 at end)", b"a\xc3"),
    ("truncated 3-byte (e2 82)", b"\xe2\x82"),
    ("truncated 4-byte (f0 9f 98)", b"\xf0\x9f\x98"),
    ("2-byte lead then ascii (c3 41)", b"\xc3A"),
    ("overlong '/' (c0 af)", b"\xc0\xaf"),
    ("overlong NUL (c0 80)", b"\xc0\x80"),
    ("overlong 3-byte (e0 80 af)", b"\xe0\x80\xaf"),
    ("overlong 4-byte (f0 80 80 af)", b"\xf0\x80\x80\xaf"),
    ("encoded surrogate U+D800 (ed a0 80)", b"\xed\xa0\x80"),
    ("encoded surrogate U+DFFF (ed bf bf)", b"\xed\xbf\xbf"),
    ("encoded surrogate pair (ed a0 bd ed b8 80)", b"\xed\xa0\xbd\xed\xb8\x80"),
    ("above U+10FFFF (f4 90 80 80)", b"\xf4\x90\x80\x80"),
    ("lead f5 (f5 80 80 80)", b"\xf5\x80\x80\x80"),
    ("escape \\u00e9", b"\\u00e9"),
    ("escape pair \\ud83d\\ude00", b"\\ud83d\\ude00"),
    ("escape pair uppercase \\uD83D\\uDE00", b"\\uD83D\\uDE00"),
    ("escape \\u0000", b"a\\u0000b"),
    ("escape \\uffff", b"\\uffff"),
    ("lone leading \\ud800", b"\\ud800"),
    ("lone leading \\ud800 then text", b"\\ud800x"),
    ("lone leading \\udbff at end", b"ab\\udbff"),
    ("lone trailing \\udc00", b"\\udc00"),
    ("lone trailing \\udfff then text", b"\\udfffx"),
    ("leading then non-surrogate escape \\ud800\\u0041", b"\\ud800\\u0041"),
    ("two leading \\ud800\\ud800", b"\\ud800\\ud800"),
    ("reversed pair \\ude00\\ud83d", b"\\ude00\\ud83d"),
    ("leading then bad escape \\ud800\\q", b"\\ud800\\q"),
]

# Payloads placed where whitespace may go (outside any string).
OUTSIDE = [
    ("space", b" "),
    ("raw ff", b"\xff"),
    ("valid U+00A0 (c2 a0)", b"\xc2\xa0"),
    ("UTF-8 byte order mark (ef bb bf)", b"\xef\xbb\xbf"),
]


def tokenizer_doc():
    """A small BPE tokenizer.json that both tokenizers and gemma4.h load (with "@@" spliced in later)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<0x41>": 4}
    for s in ["a", "b", "\u2581", "ab"]:
        vocab[s] = len(vocab)
    added = [dict(id=vocab[s], content=s, single_word=False, lstrip=False, rstrip=False, normalized=False,
                  special=True) for s in ["<pad>", "<eos>", "<bos>", "<unk>"]]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [["a", "b"]]},
    }


def dumps(doc):
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def templates():
    """NAME -> (file type, document bytes with one "@@")."""
    out = {}
    tok = tokenizer_doc()
    t = json.loads(json.dumps(tok))
    t["model"]["vocab"]["PAYLOAD"] = len(t["model"]["vocab"])
    out["tokenizer.json vocab name"] = ("tokenizer.json", dumps(t).replace(b"PAYLOAD", b"@@"))
    t = json.loads(json.dumps(tok))
    n = len(t["model"]["vocab"])
    t["model"]["vocab"]["added"] = n
    t["added_tokens"].append(dict(id=n, content="PAYLOAD", single_word=False, lstrip=False, rstrip=False,
                                  normalized=False, special=False))
    out["tokenizer.json added content"] = ("tokenizer.json", dumps(t).replace(b"PAYLOAD", b"@@"))
    out["tokenizer.json outside"] = ("tokenizer.json", b"@@" + dumps(tok))

    with open(os.path.join(ROOT, "data", "tiny", "plain", "config.json"), "rb") as f:
        cfg = json.loads(f.read())
    c = dict(cfg)
    c["note"] = "PAYLOAD"
    out["config.json value"] = ("config.json", dumps(c).replace(b"PAYLOAD", b"@@"))
    c = dict(cfg)
    c["PAYLOAD"] = 1
    out["config.json name"] = ("config.json", dumps(c).replace(b"PAYLOAD", b"@@"))
    out["config.json outside"] = ("config.json", b"@@" + dumps(cfg))

    hdr = {"PAYLOAD": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    out["safetensors tensor name"] = ("safetensors", dumps(hdr).replace(b"PAYLOAD", b"@@"))
    hdr = {"__metadata__": {"format": "PAYLOAD"}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    out["safetensors metadata value"] = ("safetensors", dumps(hdr).replace(b"PAYLOAD", b"@@"))
    hdr = {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    out["safetensors outside"] = ("safetensors", b"@@" + dumps(hdr))
    for name, (_, doc) in out.items():
        assert doc.count(b"@@") == 1, name
    return out


def first_line(e):
    s = "%s: %s" % (type(e).__name__, e)
    return s.split("\n")[0][:200]


def try_tokenizer(path, data):
    with open(path, "wb") as f:
        f.write(data)
    Tokenizer.from_file(path)


def try_config(d, data):
    with open(os.path.join(d, "config.json"), "wb") as f:
        f.write(data)
    transformers.AutoConfig.from_pretrained(d)


def try_safetensors(path, data):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(data)) + data + np.float32(1.5).tobytes())
    with safe_open(path, "np") as g:
        keys = list(g.keys())
        g.metadata()
        for k in keys:
            g.get_tensor(k)


def main():
    os.makedirs(OUT, exist_ok=True)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (ftype, doc) in templates().items():
            lines.append({"template": name, "file": ftype, "hex": doc.hex()})
            cases = OUTSIDE if name.endswith("outside") else PAYLOADS
            for label, payload in cases:
                data = doc.replace(b"@@", payload)
                try:
                    if ftype == "tokenizer.json":
                        try_tokenizer(os.path.join(tmp, "tokenizer.json"), data)
                    elif ftype == "config.json":
                        try_config(tmp, data)
                    else:
                        try_safetensors(os.path.join(tmp, "model.safetensors"), data)
                    ok, err = True, ""
                except Exception as e:  # every refusal, whatever its type, is recorded
                    ok, err = False, first_line(e)
                lines.append({"template": name, "label": label, "payload": payload.hex(), "accepted": ok,
                              "error": err[:60]})
                print("%-30s %-50s %s %s" % (name, label, "accept" if ok else "REJECT", err[:90]))
    with open(os.path.join(OUT, "utf8_goldens.jsonl"), "w") as f:
        for ln in lines:
            f.write(json.dumps(ln, ensure_ascii=True, separators=(",", ":")) + "\n")
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("tokenizers %s\ntransformers %s\nsafetensors %s\nnumpy %s\npython %s\ndate %s UTC\n"
                "command venv/bin/python tools/make_json_utf8_goldens.py\n" % (
                    tokenizers.__version__, transformers.__version__, safetensors.__version__, np.__version__,
                    platform.python_version(),
                    datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")))


if __name__ == "__main__":
    sys.exit(main())
