"""ctypes bindings of _gemma4.so (built from _lib.c) and the numpy API over them.

Every call into the library goes through ctypes.CDLL, which releases the GIL
for its duration; the only Python code that runs inside one is a tap callback
(Model.taps), which takes the GIL back for its copy.
"""

import ctypes as C
import fnmatch
import json
import os
import threading
import weakref

import numpy as np

from . import _build

# ----------------------------------------------------------------- errors

RESULTS = {0: "G4_OK", -1: "G4_ERR_IO", -2: "G4_ERR_JSON", -3: "G4_ERR_CONFIG", -4: "G4_ERR_PLAN",
           -5: "G4_ERR_SAFETENSORS", -6: "G4_ERR_WEIGHTS", -7: "G4_ERR_ARENA", -8: "G4_ERR_INPUT",
           -9: "G4_ERR_NOMEM"}


class Error(Exception):
    """A gemma4.h error: the library's message; .code is its g4_result (negative), .name its name."""

    def __init__(self, message, code=-8):
        super().__init__(message)
        self.code = code
        self.name = RESULTS.get(code, str(code))


class InputError(Error, ValueError):
    """A bad argument (G4_ERR_INPUT): a token id, a length, a label, a shape."""


class LoadError(Error, OSError):
    """A file that cannot be read or is malformed (IO, JSON, config, plan, safetensors, weights)."""


def _raise(code, err):
    msg = err.value.decode("utf-8", "replace") if hasattr(err, "value") else str(err)
    if code == -8:
        raise InputError(msg, code)
    if code in (-1, -2, -3, -4, -5, -6):
        raise LoadError(msg, code)
    raise Error(msg, code)


# ---------------------------------------------------------------- library

_lib = None
_lib_lock = threading.Lock()
TAP_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_char_p, C.c_int, C.POINTER(C.c_float), C.c_int, C.c_int, C.c_int)
_P = C.c_void_p
_ERR = C.c_char_p  # a create_string_buffer passed as char *


def _library_path():
    if os.environ.get("GEMMA4_LIB"):
        return os.environ["GEMMA4_LIB"]
    return os.path.join(_build.HERE, _build.LIB_NAME)


def lib():
    """The loaded library (built on first use when the package runs from its source tree)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = _library_path()
        if not os.path.isfile(path):
            _build.build(path)
        L = C.CDLL(path)
        sig = {
            "g4py_abi": (C.c_int, []),
            "g4py_error_max": (C.c_int, []),
            "g4py_simd_name": (C.c_char_p, []),
            "g4py_model_load": (C.c_int, [C.c_char_p, C.c_char_p, C.POINTER(_P), _ERR]),
            "g4py_model_free": (None, [_P]),
            "g4py_model_json": (C.c_size_t, [_P, C.c_char_p, C.c_size_t]),
            "g4py_session_new": (C.c_int, [_P, C.c_int, C.c_int, C.c_int, C.c_int, C.c_int, TAP_FN, _P,
                                           C.POINTER(_P), _ERR]),
            "g4py_session_free": (None, [_P]),
            "g4py_session_set_tap": (None, [_P, TAP_FN, _P]),
            "g4py_session_forward": (C.c_int, [_P, _P, C.c_int, _P, C.c_int, _P, _ERR]),
            "g4py_session_forward_mm": (C.c_int, [_P, _P, C.c_int, _P, C.c_int, _P, C.c_int, _P, _ERR]),
            "g4py_vision_encode": (C.c_int, [_P, _P, _P, C.c_int, C.c_int, _P, C.POINTER(C.c_int), _ERR]),
            "g4py_audio_tokens_max": (C.c_int, [C.c_int]),
            "g4py_image_config": (C.c_int, [C.c_char_p, _P, C.POINTER(C.c_int), C.POINTER(C.c_int), _ERR]),
            "g4py_image_preprocess": (C.c_int, [C.c_char_p, _P, _P, C.c_int, C.c_int, C.c_int, _P, _P,
                                                C.POINTER(C.c_int), _ERR]),
            "g4py_mm_expand_images": (C.c_int, [_P, _P, C.c_int, _P, C.c_int, _P, C.c_size_t, C.POINTER(C.c_size_t),
                                                _ERR]),
            "g4py_audio_encode": (C.c_int, [_P, _P, _P, C.c_int, _P, C.POINTER(C.c_int), _ERR]),
            "g4py_audio_frames": (C.c_int, [C.c_int, C.POINTER(C.c_int), _ERR]),
            "g4py_audio_features": (C.c_int, [_P, C.c_int, C.c_int, _P, _P, C.c_int, C.POINTER(C.c_int), _ERR]),
            "g4py_wav_parse": (C.c_int, [C.c_char_p, C.c_size_t, _P, C.c_size_t, C.POINTER(C.c_size_t),
                                         C.POINTER(C.c_int), _ERR]),
            "g4py_session_pos": (C.c_int, [_P]),
            "g4py_session_max_context": (C.c_int, [_P]),
            "g4py_session_arena_bytes": (C.c_size_t, [_P]),
            "g4py_session_reset": (None, [_P]),
            "g4py_session_rewind": (C.c_int, [_P, C.c_int, _ERR]),
            "g4py_train_new": (C.c_int, [_P, C.c_int, C.c_int, C.c_int, C.POINTER(_P), C.POINTER(C.c_size_t),
                                         C.POINTER(C.c_int), _ERR]),
            "g4py_train_free": (None, [_P]),
            "g4py_train_grad_info": (C.c_int, [_P, C.c_int, C.c_char_p, C.POINTER(C.c_size_t),
                                               C.POINTER(C.c_size_t), C.POINTER(C.c_int), C.POINTER(C.c_int64)]),
            "g4py_loss_and_grad": (C.c_int, [_P, _P, _P, C.c_int, C.POINTER(C.c_float), _P, _ERR]),
            "g4py_sampler_new": (C.c_int, [C.c_int, C.c_float, C.c_int, C.c_float, C.c_float, C.c_float,
                                           C.c_uint64, C.POINTER(_P), _ERR]),
            "g4py_sampler_free": (None, [_P]),
            "g4py_sampler_accept": (None, [_P, C.c_int32]),
            "g4py_sampler_sample": (C.c_int32, [_P, _P, _ERR]),
            "g4py_tokenizer_load": (C.c_int, [C.c_char_p, C.POINTER(_P), _ERR]),
            "g4py_tokenizer_free": (None, [_P]),
            "g4py_tokenizer_info": (C.c_int, [_P, C.POINTER(C.c_int32)]),
            "g4py_token_id": (C.c_int32, [_P, C.c_char_p]),
            "g4py_tokenize_max": (C.c_size_t, [_P, C.c_size_t]),
            "g4py_tokenize": (C.c_int, [_P, C.c_char_p, C.c_size_t, C.c_int, _P, C.c_size_t,
                                        C.POINTER(C.c_size_t), _ERR]),
            "g4py_detokenize": (C.c_int, [_P, _P, C.c_size_t, C.c_int, C.c_char_p, C.c_size_t,
                                          C.POINTER(C.c_size_t), _ERR]),
            "g4py_chat_encode": (C.c_int, [_P, C.POINTER(C.c_char_p), C.POINTER(C.c_char_p), C.c_int, C.c_int, _P,
                                           C.c_size_t, C.POINTER(C.c_size_t), _ERR]),
            "g4py_chat_is_stop": (C.c_int, [_P, C.c_int32]),
            "g4py_decode_new": (_P, []),
            "g4py_decode_free": (None, [_P]),
            "g4py_decode_next": (C.c_int, [_P, _P, C.c_int32, C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_size_t),
                                           _ERR]),
            "g4py_decode_flush": (C.c_int, [_P, C.POINTER(C.c_void_p), C.POINTER(C.c_size_t), _ERR]),
            "g4py_template_new": (C.c_int, [C.c_char_p, C.c_char_p, C.c_size_t, _P, C.POINTER(_P), _ERR]),
            "g4py_template_free": (None, [_P]),
            "g4py_template_apply": (C.c_int, [_P, _P, C.c_char_p, C.c_size_t, C.c_int, C.c_int,
                                              C.POINTER(C.c_void_p), C.POINTER(C.c_size_t),
                                              C.POINTER(C.c_void_p), C.POINTER(C.c_size_t), _ERR]),
            "g4py_free_output": (None, [_P]),
        }
        for name, (res, args) in sig.items():
            f = getattr(L, name)
            f.restype = res
            f.argtypes = args
        if L.g4py_abi() != 1:
            raise Error(f"gemma4: {path} is a library of another version (rebuild it)", -8)
        _lib = L
        return L


def _errbuf():
    return C.create_string_buffer(512)


def _path(p, what):
    if isinstance(p, os.PathLike):
        p = os.fspath(p)
    if isinstance(p, bytes):
        return p
    if not isinstance(p, str):
        raise TypeError(f"{what} must be a path (str or os.PathLike), not {type(p).__name__}")
    if "\0" in p:
        raise InputError(f"{what} holds a NUL character: {p!r}")
    return p.encode()


INT32_MAX = 2 ** 31 - 1


def _ids(ids, what="ids", allow_empty=False, lo=0):
    """ids as a contiguous int32 array (no copy when already one); values outside
    int32 or below lo are refused here (they would wrap); the library checks the vocabulary."""
    a = np.asarray(ids)
    if a.dtype == object or a.dtype.kind not in "iu":
        if a.size == 0 and a.dtype.kind == "f":
            a = a.astype(np.int32)
        else:
            raise InputError(f"{what} must be integers, not {a.dtype}")
    if a.ndim != 1:
        raise InputError(f"{what} must be one sequence (1-D), not shape {a.shape}")
    if a.size == 0 and not allow_empty:
        raise InputError(f"{what} is empty")
    if a.size:
        mn, mx = int(a.min()), int(a.max())
        if mn < lo or mx > INT32_MAX:
            bad = mn if mn < lo else mx
            i = int(np.argmax(a == bad))
            raise InputError(f"{what}: {bad} at index {i} is outside [{lo}, {INT32_MAX}]")
    return np.ascontiguousarray(a, dtype=np.int32)


def _ptr(a):
    return a.ctypes.data_as(C.c_void_p)



class _Owned:
    """One C handle owned by a Python object: close() frees it once (the lib() function
    named by _free), `with` closes it, and the garbage collector closes what was left."""
    _h = None
    _free = None  # the name of the g4py_*_free function

    def _handle(self):
        if self._h is None:
            raise Error(f"this gemma4.{type(self).__name__} is closed")
        return self._h

    def _before_close(self):
        pass

    def close(self):
        if self._h is None:
            return
        self._before_close()
        getattr(lib(), self._free)(self._h)
        self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


# ------------------------------------------------------------------ model

class Model(_Owned):
    """A Gemma 4 checkpoint (a directory: config.json + safetensors), read in place.

    adapter: a PEFT LoRA adapter directory, applied as peft applies it.
    bf16: sessions reproduce transformers run in bfloat16 (bit for bit on the
    test models) instead of float32. threads: the threads each session or
    training step uses (default: every CPU; threads never change a result bit).
    """

    _free = "g4py_model_free"

    def __init__(self, path, adapter=None, bf16=False, threads=None):
        L = lib()
        self.path = os.fspath(path) if isinstance(path, os.PathLike) else path
        self.adapter = adapter
        self.bf16 = bool(bf16)
        if threads is None:
            threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if not isinstance(threads, (int, np.integer)) or not 1 <= threads <= 1024:
            raise InputError(f"threads must be an integer in [1, 1024] (the pool's limit), not {threads!r}")
        threads = int(threads)
        self.threads = threads
        h, err = C.c_void_p(), _errbuf()
        r = L.g4py_model_load(_path(path, "path"), None if adapter is None else _path(adapter, "adapter"),
                              C.byref(h), err)
        if r != 0:
            _raise(r, err)
        self._h = h
        self._children = weakref.WeakSet()
        self._trainer = None
        self._train_lock = threading.Lock()  # one g4_train, used by one thread at a time
        n = L.g4py_model_json(h, None, 0)
        buf = C.create_string_buffer(n + 1)
        L.g4py_model_json(h, buf, n + 1)
        info = json.loads(buf.value.decode())
        self.config = info["config"]
        self._plan = info["plan"]
        self.prefix = info["prefix"]
        self.n_lora = info["n_lora"]
        self.vocab_size = self.config["vocab_size"]

    # -- lifetime: close() also frees every session and trainer made from it
    def _before_close(self):
        for c in list(self._children):
            c.close()
        self._trainer = None

    def __repr__(self):
        c = self.config
        return (f"gemma4.Model({self.path!r}: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
                f"vocab {c['vocab_size']}{', adapter ' + repr(self.adapter) if self.adapter else ''}"
                f"{', bf16' if self.bf16 else ''})")

    # -- the plan
    def plan(self):
        """The shared-KV plan: first_shared, n_slots and per layer its type, head_dim, kv_heads,
        has_v_proj, reads (-1: owns its K/V, else the owner layer it reads), kv_slot, mlp_width, moe."""
        return json.loads(json.dumps(self._plan))

    def plan_text(self):
        """The plan as `gemma4 info` prints its layer lines."""
        lines = []
        for i, l in enumerate(self._plan["layers"]):
            kind = "full" if l["type"] == "full_attention" else "sliding"
            who = "owner" if l["reads"] == -1 else f"reads {l['reads']}"
            lines.append(f"layer {i} {kind} head_dim {l['head_dim']} kv_heads {l['kv_heads']} {who} "
                         f"mlp {l['mlp_width']}")
        return "\n".join(lines)

    # -- forward
    def session(self, max_context=None, chunk=None, bf16=None, lora_bf16=False, threads=None):
        """A Session for incremental decoding (it owns its arena)."""
        return Session(self, max_context=max_context, chunk=chunk, bf16=bf16, lora_bf16=lora_bf16,
                       threads=threads)

    def logits(self, ids, chunk=None, soft=None):
        """float32 [S, V]: the logits of every position of ids, one sequence from position 0
        (chunk: tokens per internal step; the bits do not depend on it). soft: the soft
        tokens [n, H] of the ids' image/audio placeholder rows, in order (encode_image,
        encode_audio), merged as Gemma4Model.forward merges them."""
        ids = _ids(ids)
        with Session(self, max_context=len(ids), chunk=chunk) as s:
            return s.forward(ids, logits="all", soft=soft)

    # -- images and audio
    def encode_image(self, pixel_values, positions):
        """One image's soft tokens, float32 [n, H]: pixel_values [n_patches, 3 p^2] and
        positions [n_patches, 2] as Gemma 4's image processor gives them (a leading batch
        axis of 1 is accepted), through the vision tower and embed_vision."""
        pv = np.ascontiguousarray(np.asarray(pixel_values, np.float32))
        pos = np.asarray(positions)
        if pv.ndim == 3 and pv.shape[0] == 1:
            pv = pv[0]
        if pos.ndim == 3 and pos.shape[0] == 1:
            pos = pos[0]
        if pv.ndim != 2 or pos.ndim != 2 or pos.shape != (pv.shape[0], 2):
            raise InputError(f"encode_image: pixel_values [n, 3 p^2] and positions [n, 2], not {pv.shape} and {pos.shape}")
        v = self.config["vision"]
        if not v["present"]:
            raise InputError(f"encode_image: {self.path} has no vision tower")
        P = 3 * v["patch_size"] ** 2  # the library reads n_patches * P values: the shape is checked here
        if pv.shape[1] != P:
            raise InputError(f"encode_image: pixel_values has {pv.shape[1]} values per patch; patch_size "
                             f"{v['patch_size']} needs 3 * {v['patch_size']}^2 = {P}")
        pos = np.ascontiguousarray(_ids(pos.reshape(-1), "positions", lo=-1))
        H = self.config["hidden_size"]
        soft = np.empty((max(pv.shape[0], 1), H), np.float32)
        n, err = C.c_int(), _errbuf()
        r = lib().g4py_vision_encode(self._handle(), _ptr(pv), _ptr(pos), pv.shape[0], self.threads, _ptr(soft),
                                     C.byref(n), err)
        if r != 0:
            _raise(r, err)
        return soft[:n.value].copy()

    def preprocess_image(self, image, processor=None):
        """Gemma4ImageProcessor on one image, bit for bit: image uint8 [h, w, 3 or 4] (RGB or
        RGBA) -> (pixel_values float32 [max_patches, 3 p^2], positions int32 [max_patches, 2],
        n_soft: its soft tokens). processor: a directory or file with processor_config.json
        / preprocessor_config.json (default: the model's directory, else the defaults)."""
        img = np.asarray(image)
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] not in (3, 4):
            raise InputError(f"preprocess_image: a uint8 [h, w, 3 or 4] image, not {img.dtype} {img.shape}")
        img = np.ascontiguousarray(img)
        if processor is None and isinstance(self.path, str) and any(
                os.path.isfile(os.path.join(self.path, f)) for f in ("processor_config.json", "preprocessor_config.json")):
            processor = self.path
        p = None if processor is None else _path(processor, "processor")
        ps, mp, err = C.c_int(), C.c_int(), _errbuf()
        r = lib().g4py_image_config(p, self._handle(), C.byref(ps), C.byref(mp), err)
        if r != 0:
            _raise(r, err)
        pv = np.empty((mp.value, 3 * ps.value ** 2), np.float32)
        pos = np.empty((mp.value, 2), np.int32)
        n = C.c_int()
        r = lib().g4py_image_preprocess(p, self._handle(), _ptr(img), img.shape[0], img.shape[1], img.shape[2], _ptr(pv),
                                        _ptr(pos), C.byref(n), err)
        if r != 0:
            _raise(r, err)
        return pv, pos, n.value

    def expand_images(self, ids, n_soft):
        """Gemma4Processor's ids: every image placeholder id becomes boi, n_soft[k] image
        tokens, eoi (k counts the images)."""
        ids = _ids(ids)
        ns = np.ascontiguousarray(np.asarray(n_soft, np.int32).reshape(-1))
        cap = len(ids) + int(ns.sum()) + 2 * len(ns) + 1
        out = np.empty(cap, np.int32)
        n, err = C.c_size_t(), _errbuf()
        r = lib().g4py_mm_expand_images(self._handle(), _ptr(ids), len(ids), _ptr(ns), len(ns), _ptr(out), cap,
                                        C.byref(n), err)
        if r != 0:
            _raise(r, err)
        return out[:n.value].copy()

    def encode_audio(self, features, mask=None):
        """One clip's soft tokens, float32 [n, H]: log-mel features [frames, 128] and their
        valid-frame mask (gemma4.audio_features gives both) through the audio tower and
        embed_audio."""
        f = np.ascontiguousarray(np.asarray(features, np.float32))
        if f.ndim == 3 and f.shape[0] == 1:
            f = f[0]
        if f.ndim != 2:
            raise InputError(f"encode_audio: features [frames, bins], not {f.shape}")
        a = self.config["audio"]
        if not a["present"]:
            raise InputError(f"encode_audio: {self.path} has no audio tower")
        if f.shape[1] != a["mel_bins"]:  # the library reads frames * mel_bins values: the shape is checked here
            raise InputError(f"encode_audio: features have {f.shape[1]} bins per frame; the tower takes {a['mel_bins']}")
        if mask is None:
            raise InputError("encode_audio: the valid-frame mask is required (transformers skips audio without one)")
        mk = np.asarray(mask).reshape(-1)
        if mk.shape != (f.shape[0],):
            raise InputError(f"encode_audio: mask of {mk.size} entries for {f.shape[0]} frames")
        mk = np.ascontiguousarray(mk != 0, dtype=np.uint8)
        H = self.config["hidden_size"]
        soft = np.empty((max(lib().g4py_audio_tokens_max(f.shape[0]), 1), H), np.float32)
        n, err = C.c_int(), _errbuf()
        r = lib().g4py_audio_encode(self._handle(), _ptr(f), _ptr(mk), f.shape[0], _ptr(soft), C.byref(n), err)
        if r != 0:
            _raise(r, err)
        return soft[:n.value].copy()

    def taps(self, ids, names=None, chunk=None):
        """{name: float32 [S, cols]} of every module output transformers has, under the
        module names `gemma4 compare` and tools/hf_dump.py use (embed_tokens,
        layers.3.self_attn.q, layers.3.mlp, norm, logits, ...), in forward order.
        names: a list of names or fnmatch patterns to keep (default: all)."""
        ids = _ids(ids)
        S = len(ids)
        pats = None if names is None else ([names] if isinstance(names, str) else list(names))
        out = {}
        failure = []

        def keep(name):
            return pats is None or any(name == p or fnmatch.fnmatchcase(name, p) for p in pats)

        def tap(user, name, layer, data, rows, cols, pos0):
            try:
                n = name.decode()
                if not keep(n):
                    return
                a = out.get(n)
                if a is None:
                    a = out[n] = np.zeros((S, cols), np.float32)
                src = np.ctypeslib.as_array(data, shape=(rows * cols,)).reshape(rows, cols)
                a[pos0:pos0 + rows] = src
            except BaseException as e:  # an exception cannot cross the C frames
                failure.append(e)

        fn = TAP_FN(tap)
        with Session(self, max_context=S, chunk=chunk, _tap=fn) as s:
            s.forward(ids, logits="all")
        if failure:
            raise failure[0]
        return out

    def generate(self, ids, max_new_tokens, stop=None, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                 repetition_penalty=1.0, seed=0, chunk=None, callback=None):
        """The new token ids (int32 array, at most max_new_tokens) after the prompt ids.

        temperature 0 (the default) is greedy decoding, as transformers' generate without
        do_sample; otherwise gemma4.h's sampler (repetition penalty, temperature, top-k,
        top-p, min-p, seeded). stop: ids that end generation (included in the output).
        callback(id) is called with every new id as it comes; returning True stops."""
        ids = _ids(ids)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be a non-negative integer, not {max_new_tokens!r}")
        stop = set() if stop is None else {int(x) for x in ([stop] if isinstance(stop, int) else stop)}
        out = []
        if max_new_tokens == 0:
            return np.zeros(0, np.int32)
        smp = Sampler(self.vocab_size, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                      repetition_penalty=repetition_penalty, seed=seed)
        with Session(self, max_context=len(ids) + max_new_tokens - 1, chunk=chunk) as s:
            for t in ids:
                smp.accept(int(t))
            logits = s.forward(ids, logits="last")
            while True:
                nxt = smp.sample(logits)
                smp.accept(nxt)
                out.append(nxt)
                if nxt in stop or len(out) >= max_new_tokens or (callback is not None and callback(nxt)):
                    break
                logits = s.forward([nxt], logits="last")
        return np.array(out, np.int32)

    # -- training
    def loss_and_grad(self, ids, labels=None, recompute=False):
        """(loss, {name: float32 ndarray}): transformers' model(ids, labels=labels).loss and
        torch autograd's gradient of every trained parameter, named as in the checkpoint
        (the tied lm_head under embed_tokens; with an adapter, only the adapter's lora_A and
        lora_B). labels: default the ids; -100 is ignored; labels[0] is never used (shifted
        inside, as transformers). recompute: activation checkpointing (bit-identical)."""
        ids = _ids(ids)
        n = len(ids)
        lab = None
        if labels is not None:
            lab = _ids(labels, "labels", lo=-100)
            if len(lab) != n:
                raise InputError(f"{len(lab)} labels for {n} ids")
        with self._train_lock:
            t = self._trainer
            if t is None or t.max_seq < n or t.recompute != bool(recompute):
                if t is not None:
                    t.close()
                self._trainer = t = _Trainer(self, n, bool(recompute))
            return t.run(ids, lab)


class _Trainer(_Owned):
    """g4_train with its arena and the gradient entries (one per trained tensor)."""

    _free = "g4py_train_free"

    def __init__(self, model, max_seq, recompute):
        L = lib()
        self.model, self.max_seq, self.recompute = model, max_seq, recompute
        h, floats, ng, err = C.c_void_p(), C.c_size_t(), C.c_int(), _errbuf()
        r = L.g4py_train_new(model._handle(), max_seq, int(recompute), model.threads, C.byref(h),
                             C.byref(floats), C.byref(ng), err)
        if r != 0:
            _raise(r, err)
        self._h = h
        model._children.add(self)
        self.grad_floats = floats.value
        self.entries = []
        name = C.create_string_buffer(128)
        off, cnt, nd, shape = C.c_size_t(), C.c_size_t(), C.c_int(), (C.c_int64 * 3)()
        for i in range(ng.value):
            L.g4py_train_grad_info(h, i, name, C.byref(off), C.byref(cnt), C.byref(nd), shape)
            self.entries.append((name.value.decode(), off.value, cnt.value, tuple(shape[:nd.value])))

    def run(self, ids, labels):
        if self._h is None:
            raise Error("this trainer is closed")
        G = np.empty(self.grad_floats, np.float32)  # the gradient block; the arrays returned are views of it
        loss, err = C.c_float(), _errbuf()
        r = lib().g4py_loss_and_grad(self._h, _ptr(ids), None if labels is None else _ptr(labels), len(ids),
                                     C.byref(loss), _ptr(G), err)
        if r != 0:
            _raise(r, err)
        grads = {name: G[off:off + cnt].reshape(shape) for name, off, cnt, shape in self.entries}
        return float(loss.value), grads



# ---------------------------------------------------------------- session

_LOGITS = {"none": 0, None: 0, "last": 1, "all": 2}


class Session(_Owned):
    """Incremental decoding on one model: positions accumulate across forward calls.
    It owns its arena (the K/V of the owner layers, the shared-KV table, scratch),
    sized for max_context positions. Use from one thread at a time."""

    _free = "g4py_session_free"

    def __init__(self, model, max_context=None, chunk=None, bf16=None, lora_bf16=False, threads=None, _tap=None):
        L = lib()
        if max_context is None:
            max_context = min(model.config["max_position_embeddings"] or 4096, 4096)
        for what, v in (("max_context", max_context), ("chunk", chunk)):
            if v is not None and (not isinstance(v, (int, np.integer)) or v < 1 or v > INT32_MAX):
                raise InputError(f"{what} must be a positive integer, not {v!r}")
        self.model = model
        self.bf16 = model.bf16 if bf16 is None else bool(bf16)
        threads = model.threads if threads is None else threads
        if not isinstance(threads, (int, np.integer)) or not 1 <= threads <= 1024:
            raise InputError(f"threads must be an integer in [1, 1024] (the pool's limit), not {threads!r}")
        self._tap = _tap if _tap is not None else TAP_FN()
        h, err = C.c_void_p(), _errbuf()
        r = L.g4py_session_new(model._handle(), int(max_context), int(chunk or 0), int(self.bf16), int(bool(lora_bf16)),
                               int(threads), self._tap, None, C.byref(h), err)
        if r != 0:
            _raise(r, err)
        self._h = h
        model._children.add(self)
        self.max_context = int(max_context)

    @property
    def pos(self):
        """Positions consumed so far."""
        return lib().g4py_session_pos(self._handle())

    @property
    def arena_bytes(self):
        return lib().g4py_session_arena_bytes(self._handle())

    def forward(self, ids, logits="last", out=None, hidden=False, soft=None):
        """Runs ids at positions pos .. pos+n-1. logits: "last" -> float32 [V], "all" -> [n, V],
        "none" -> None. out: an optional float32 C-contiguous array to write them into.
        hidden=True also returns the final norm's output of the same rows: (logits, hidden).
        soft: float32 [n_soft, H], the soft tokens of the ids' image/audio placeholder rows."""
        h = self._handle()
        ids = _ids(ids)
        if logits not in _LOGITS:
            raise InputError(f"logits must be 'last', 'all' or 'none', not {logits!r}")
        mode, V, n = _LOGITS[logits], self.model.vocab_size, len(ids)
        shape = (V,) if mode == 1 else (n, V) if mode == 2 else None
        if shape is not None:
            if out is None:
                out = np.empty(shape, np.float32)
            elif not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == shape
                      and out.flags.c_contiguous and out.flags.writeable):
                raise InputError(f"out must be a writeable C-contiguous float32 array of shape {shape}")
        elif hidden:
            raise InputError("hidden=True needs logits 'last' or 'all'")
        hid = None
        if hidden:
            H = self.model.config["hidden_size"]
            hid = np.empty((H,) if mode == 1 else (n, H), np.float32)
        err = _errbuf()
        if soft is not None:
            sf = np.ascontiguousarray(np.asarray(soft, np.float32))
            H = self.model.config["hidden_size"]
            if sf.ndim != 2 or sf.shape[1] != H:
                raise InputError(f"soft must be [n, {H}] (the hidden size), not {sf.shape}")
            r = lib().g4py_session_forward_mm(h, _ptr(ids), n, _ptr(sf), sf.shape[0],
                                              None if shape is None else _ptr(out), mode,
                                              None if hid is None else _ptr(hid), err)
        else:
            r = lib().g4py_session_forward(h, _ptr(ids), n, None if shape is None else _ptr(out), mode,
                                           None if hid is None else _ptr(hid), err)
        if r != 0:
            _raise(r, err)
        return (out, hid) if hidden else out

    def reset(self):
        """Forgets every position."""
        lib().g4py_session_reset(self._handle())

    def rewind(self, pos):
        """Back to pos positions (see g4_session_rewind)."""
        if not isinstance(pos, (int, np.integer)) or pos < 0 or pos > INT32_MAX:
            raise InputError(f"rewind: pos must be a non-negative integer, not {pos!r}")
        err = _errbuf()
        r = lib().g4py_session_rewind(self._handle(), int(pos), err)
        if r != 0:
            _raise(r, err)



# ---------------------------------------------------------------- sampler

class Sampler(_Owned):
    """gemma4.h's sampler: repetition penalty, temperature, top-k, top-p, min-p, then a
    seeded draw (temperature 0 or top_k 1: greedy, lowest id on ties)."""

    _free = "g4py_sampler_free"

    def __init__(self, vocab, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=0):
        L = lib()
        h, err = C.c_void_p(), _errbuf()
        if not isinstance(vocab, (int, np.integer)) or vocab < 1 or vocab > INT32_MAX:
            raise InputError(f"vocab must be a positive integer, not {vocab!r}")
        if not isinstance(top_k, (int, np.integer)) or not -INT32_MAX <= top_k <= INT32_MAX:
            raise InputError(f"top_k must be an integer, not {top_k!r}")
        if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 64:
            raise InputError(f"seed must be an integer in [0, 2^64), not {seed!r}")
        r = L.g4py_sampler_new(int(vocab), float(temperature), int(top_k), float(top_p), float(min_p),
                               float(repetition_penalty), int(seed), C.byref(h), err)
        if r != 0:
            _raise(r, err)
        self._h, self.vocab = h, int(vocab)

    def accept(self, id):
        lib().g4py_sampler_accept(self._h, int(id))

    def sample(self, logits):
        """The next id from float32 logits [vocab] (not modified: a copy is sampled)."""
        a = np.array(logits, dtype=np.float32, copy=True).reshape(-1)
        if a.shape != (self.vocab,):
            raise InputError(f"logits must have {self.vocab} entries, not {a.size}")
        err = _errbuf()
        i = lib().g4py_sampler_sample(self._h, _ptr(a), err)
        if i < 0:
            _raise(-8, err)
        return int(i)



def read_wav(source):
    """(float32 PCM, sample rate) of a WAV file (a path or its bytes): PCM16 or float32, mono."""
    data = source if isinstance(source, (bytes, bytearray)) else open(_path(source, "path").decode(), "rb").read()
    data = bytes(data)
    n, rate, err = C.c_size_t(), C.c_int(), _errbuf()
    r = lib().g4py_wav_parse(data, len(data), None, 0, C.byref(n), C.byref(rate), err)
    if r != 0:
        _raise(r, err)
    out = np.empty(max(n.value, 1), np.float32)
    r = lib().g4py_wav_parse(data, len(data), _ptr(out), n.value, C.byref(n), C.byref(rate), err)
    if r != 0:
        _raise(r, err)
    return out[:n.value].copy(), rate.value


def audio_features(pcm, sample_rate=16000):
    """(features float32 [frames, 128], mask bool [frames]): Gemma4AudioFeatureExtractor's
    log-mel features of 16 kHz mono PCM, as transformers computes them."""
    a = np.ascontiguousarray(np.asarray(pcm, np.float32).reshape(-1))
    if a.size > INT32_MAX:
        raise InputError("audio_features: too many samples")
    bins, err = C.c_int(), _errbuf()
    frames = lib().g4py_audio_frames(a.size, C.byref(bins), err)
    if frames < 0:
        _raise(-9, err)
    feats = np.empty((max(frames, 1), bins.value), np.float32)
    mask = np.empty(max(frames, 1), np.uint8)
    n = C.c_int()
    r = lib().g4py_audio_features(_ptr(a), a.size, int(sample_rate), _ptr(feats), _ptr(mask), max(frames, 1),
                                  C.byref(n), err)
    if r != 0:
        _raise(r, err)
    return feats[:n.value].copy(), mask[:n.value].astype(bool)


def simd_name():
    """The kernels the library was built with: "avx512", "avx2", "neon" or "scalar"."""
    return lib().g4py_simd_name().decode()
