"""The tokenizer, the built-in chat layout and chat templates (gemma4_processing.h's
g4_tokenizer_*, g4_chat_* and g4_template_*)."""

import ctypes as C
import json
import os

import numpy as np

from ._core import InputError, _Owned, _errbuf, _ids, _path, _ptr, _raise, lib

ADD_SPECIAL = 1      # G4_ENCODE_ADD_SPECIAL
SKIP_SPECIAL = 1     # G4_DECODE_SKIP_SPECIAL
CHAT_BOS, CHAT_THINKING, CHAT_OPEN_MODEL, CHAT_CONTINUE = 1, 2, 4, 8


class Tokenizer(_Owned):
    """A Hugging Face tokenizer.json (a file, or a directory holding one), encoding and
    decoding as the Python `tokenizers` library does."""

    _free = "g4py_tokenizer_free"

    def __init__(self, path):
        L = lib()
        h, err = C.c_void_p(), _errbuf()
        r = L.g4py_tokenizer_load(_path(path, "path"), C.byref(h), err)
        if r != 0:
            _raise(r, err)
        self._h = h
        sp = (C.c_int32 * 6)()
        self.vocab_size = L.g4py_tokenizer_info(h, sp)
        names = ("bos", "eos", "pad", "turn_open", "turn_close", "think")
        self.special = {k: (v if v >= 0 else None) for k, v in zip(names, sp)}
        self.bos_id, self.eos_id, self.pad_id = self.special["bos"], self.special["eos"], self.special["pad"]

    def encode(self, text, add_special_tokens=True):
        """int32 ids of text (str, or UTF-8 bytes); add_special_tokens: the post-processor
        template (e.g. <bos> first), as tokenizers' encode."""
        h = self._handle()
        b = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        cap = lib().g4py_tokenize_max(h, len(b))
        ids = np.empty(max(cap, 1), np.int32)
        n, err = C.c_size_t(), _errbuf()
        r = lib().g4py_tokenize(h, b, len(b), ADD_SPECIAL if add_special_tokens else 0, _ptr(ids), cap,
                                C.byref(n), err)
        if r != 0:
            _raise(r, err)
        return ids[:n.value].copy()

    def decode(self, ids, skip_special_tokens=False):
        """The text of ids, exactly as tokenizers' decode."""
        h = self._handle()
        a = _ids(ids, allow_empty=True, lo=-(2 ** 31))
        cap = 256 + 16 * len(a)
        for _ in range(3):
            buf = C.create_string_buffer(cap)
            n, err = C.c_size_t(), _errbuf()
            r = lib().g4py_detokenize(h, _ptr(a), len(a), 1 if skip_special_tokens else 0, buf, cap, C.byref(n), err)
            if r == 0:
                return buf.raw[:n.value].decode("utf-8")
            if r == -8 and n.value + 1 > cap:
                cap = n.value + 1
                continue
            _raise(r, err)
        raise InputError("decode: the text kept growing")

    def stream(self, skip_special_tokens=False):
        """A DecodeStream: feed ids one by one, get the text they complete (valid UTF-8
        pieces that concatenate to decode() of all the ids)."""
        return DecodeStream(self, skip_special_tokens)

    def token_id(self, token):
        """The id of a token by its exact string, or None."""
        i = lib().g4py_token_id(self._handle(), token.encode() if isinstance(token, str) else token)
        return None if i < 0 else int(i)

    def chat(self, messages, bos=True, thinking=False, open_model=True, continue_=False):
        """int32 ids of the built-in Gemma 4 chat layout (for checkpoints without a chat
        template): messages as [{"role": ..., "content": ...}]."""
        h = self._handle()
        roles, contents = [], []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise InputError(f"chat: every message needs a string role and content, not {m!r}")
            roles.append(m["role"].encode())
            contents.append(m["content"].encode("utf-8", "surrogatepass"))
        flags = (CHAT_BOS if bos else 0) | (CHAT_THINKING if thinking else 0) | \
                (CHAT_OPEN_MODEL if open_model else 0) | (CHAT_CONTINUE if continue_ else 0)
        R = (C.c_char_p * max(len(roles), 1))(*roles)
        T = (C.c_char_p * max(len(contents), 1))(*contents)
        cap = 64 + sum(lib().g4py_tokenize_max(h, len(c)) + 16 for c in contents)
        ids = np.empty(cap, np.int32)
        n, err = C.c_size_t(), _errbuf()
        r = lib().g4py_chat_encode(h, R, T, len(roles), flags, _ptr(ids), cap, C.byref(n), err)
        if r != 0:
            _raise(r, err)
        return ids[:n.value].copy()

    def is_stop(self, id):
        """True if generation stops at this id: <eos> or <turn|>."""
        return bool(lib().g4py_chat_is_stop(self._handle(), int(id)))



class DecodeStream(_Owned):
    """Text as ids arrive (g4_decode_next): add(id) -> the piece it completes (often ""),
    flush() -> the rest. Byte-token runs are held back until they are whole."""

    _free = "g4py_decode_free"

    def __init__(self, tokenizer, skip_special_tokens=False):
        self.tokenizer = tokenizer
        self.flags = SKIP_SPECIAL if skip_special_tokens else 0
        self._h = lib().g4py_decode_new()
        if not self._h:
            raise MemoryError("gemma4: cannot allocate a decode state")

    def _piece(self, r, p, n, err):
        if r != 0:
            _raise(r, err)
        return C.string_at(p, n.value).decode("utf-8") if n.value else ""

    def add(self, id):
        if not isinstance(id, (int, np.integer)) or not -(2 ** 31) <= id < 2 ** 31:
            raise InputError(f"decode: id {id!r} is not an int32")
        p, n, err = C.c_void_p(), C.c_size_t(), _errbuf()
        r = lib().g4py_decode_next(self.tokenizer._handle(), self._h, int(id), self.flags, C.byref(p), C.byref(n), err)
        return self._piece(r, p, n, err)

    def flush(self):
        p, n, err = C.c_void_p(), C.c_size_t(), _errbuf()
        r = lib().g4py_decode_flush(self._h, C.byref(p), C.byref(n), err)
        return self._piece(r, p, n, err)



class ChatTemplate(_Owned):
    """A checkpoint's chat template, rendered as transformers' apply_chat_template.

    ChatTemplate(dir) reads dir/chat_template.jinja or tokenizer_config.json's
    chat_template; ChatTemplate(source=text) parses template text. tokenizer (a
    Tokenizer) fills bos_token etc. and is what render(..., tokenize=True) encodes with."""

    _free = "g4py_template_free"

    def __init__(self, path=None, source=None, tokenizer=None, name=None):
        if (path is None) == (source is None):
            raise InputError("ChatTemplate: give a directory or source=, not both or neither")
        L = lib()
        h, err = C.c_void_p(), _errbuf()
        self.tokenizer = tokenizer
        tok = tokenizer._handle() if tokenizer is not None else None
        if source is not None:
            b = source.encode("utf-8", "surrogatepass") if isinstance(source, str) else bytes(source)
            r = L.g4py_template_new((name or "template").encode(), b, len(b), tok, C.byref(h), err)
        else:
            r = L.g4py_template_new(_path(path, "path"), None, 0, tok, C.byref(h), err)
        if r != 0:
            _raise(r, err)
        self._h = h

    def render(self, messages, add_generation_prompt=True, enable_thinking=None, tokenize=False, **kwargs):
        """The rendered text (or, with tokenize=True, its int32 ids: encoded without a
        second <bos>, as apply_chat_template(tokenize=True)). messages: the conversation
        (a list of dicts, or the JSON text of {"messages": [...], "tools": [...]}); tools= and
        other keyword arguments are passed to the template."""
        if self._h is None:
            raise InputError("this gemma4.ChatTemplate is closed")
        if tokenize and self.tokenizer is None:
            raise InputError("render(tokenize=True) needs the ChatTemplate made with a tokenizer")
        if isinstance(messages, (str, bytes)):  # a chat JSON text, passed as is ({"messages": ..., "tools": ...})
            if kwargs:
                raise InputError("render: keyword arguments go inside the JSON text when messages is one")
            b = messages.encode("utf-8", "surrogatepass") if isinstance(messages, str) else messages
        else:
            doc = dict(kwargs)
            doc["messages"] = messages
            b = json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")
        think = -1 if enable_thinking is None else int(bool(enable_thinking))
        text, tlen, ids, n, err = C.c_void_p(), C.c_size_t(), C.c_void_p(), C.c_size_t(), _errbuf()
        r = lib().g4py_template_apply(self._h, self.tokenizer._handle() if tokenize else None, b, len(b),
                                      int(bool(add_generation_prompt)), think, C.byref(text), C.byref(tlen),
                                      C.byref(ids), C.byref(n), err)
        if r != 0:
            _raise(r, err)
        try:
            if tokenize:
                return np.ctypeslib.as_array(C.cast(ids, C.POINTER(C.c_int32)), shape=(n.value,)).copy() \
                    if n.value else np.zeros(0, np.int32)
            return C.string_at(text, tlen.value).decode("utf-8")
        finally:
            lib().g4py_free_output(ids if tokenize else text)



def load_chat_template(path, tokenizer=None):
    """ChatTemplate(path, tokenizer=tokenizer), or None when the directory has no template."""
    if not os.path.exists(os.path.join(path, "chat_template.jinja")) and \
            not os.path.exists(os.path.join(path, "tokenizer_config.json")):
        return None
    return ChatTemplate(path, tokenizer=tokenizer)
