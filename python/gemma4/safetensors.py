"""A minimal safetensors reader and writer in numpy (the goldens, dumps and the
torch bridge's checkpoint export). BF16 is read as float32 (exact)."""

import json
import struct

import numpy as np

_DT = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
       "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_NAMES = {np.dtype(v): k for k, v in _DT.items()}


def load(path, bf16_as_float32=True):
    """{name: ndarray} and the metadata dict of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (too short)")
    (hl,) = struct.unpack("<Q", raw[:8])
    if hl > len(raw) - 8:
        raise ValueError(f"{path}: header length {hl} beyond the file")
    header = json.loads(raw[8:8 + hl])
    base = 8 + hl
    out, meta = {}, header.pop("__metadata__", {}) or {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        buf = raw[base + a:base + b]
        if e["dtype"] == "BF16":
            u = np.frombuffer(buf, np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32) if bf16_as_float32 else np.frombuffer(buf, np.uint16)
        else:
            arr = np.frombuffer(buf, _DT[e["dtype"]])
        out[name] = arr.reshape(e["shape"])
    return out, meta


def save(path, tensors, metadata=None):
    """Writes {name: ndarray} (float32, float16, int32, ...) as a safetensors file."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        b = a.tobytes()
        header[name] = {"dtype": _NAMES[np.dtype(a.dtype)], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
