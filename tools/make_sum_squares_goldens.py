#!/usr/bin/env python3
"""torch's float32 sum of squares of long rows, the sum Gemma4RMSNorm's mean starts from.

Writes data/sum_squares/goldens.txt and data/sum_squares/VERSIONS.txt. Each line is "n bits": the
float32 bits (hex) of torch's x.pow(2).sum(-1) for a row of n values, x from the generator below (the
C test draws the same values). The tiny models' goldens check that sum on their short rows (hidden
sizes of 64-256); these reach the cascade's higher levels (ATen's cascade sum: levels of 2^p terms per
lane, p = max(4, ceil(log2 rows) / 4), rows = n / 32; its third level starts at 4096 rows, 131072
values), the vector tail and rows shorter than a vector.

torch must run its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU; the script checks), as
gemma4.h's sum follows them:

    ATEN_CPU_CAPABILITY=avx2 venv/bin/python tools/make_sum_squares_goldens.py
"""

import datetime
import os
import platform
import struct

import numpy as np
import torch

SIZES = [1, 7, 8, 31, 32, 33, 100, 511, 512, 513, 1536, 2048, 2560, 5376, 8191, 8192, 8200, 16384 + 96,
         65536 + 17, 131071, 131072, 131072 + 40, 262144 + 5, 600000]


def values(n, seed):
    """seed = seed * 1103515245 + 12345 (mod 2^32); x = (((seed >> 8) & 0xffff) / 32768 - 1) * 2^((seed >> 28) - 8)"""
    out = np.empty(n, dtype=np.float32)
    for i in range(n):
        seed = (seed * 1103515245 + 12345) & 0xFFFFFFFF
        out[i] = np.ldexp(((seed >> 8) & 0xFFFF) / 32768.0 - 1.0, (seed >> 28) - 8)
    return out


def main():
    assert torch.backends.cpu.get_cpu_capability() == "AVX2", "run with ATEN_CPU_CAPABILITY=avx2"
    torch.set_num_threads(1)
    os.makedirs("data/sum_squares", exist_ok=True)
    with open("data/sum_squares/goldens.txt", "w") as f:
        f.write("# n, then the float32 bits of torch's x.pow(2).sum(-1) (tools/make_sum_squares_goldens.py)\n")
        for n in SIZES:
            x = torch.from_numpy(values(n, 1000 + n))
            s = x.pow(2).sum(-1).item()
            f.write("%d %08x\n" % (n, struct.unpack("<I", struct.pack("<f", s))[0]))
    with open("data/sum_squares/VERSIONS.txt", "w") as f:
        f.write("made by tools/make_sum_squares_goldens.py on %s\n" % datetime.date.today().isoformat())
        f.write("torch %s (cpu capability %s, 1 thread), numpy %s, python %s\n"
                % (torch.__version__, torch.backends.cpu.get_cpu_capability(), np.__version__, platform.python_version()))


if __name__ == "__main__":
    main()
