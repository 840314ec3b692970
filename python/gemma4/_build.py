"""Builds gemma4/_gemma4.so from _lib.c, gemma4.h and gemma4_processing.h with the system C compiler.

Used by python/setup.py at `pip install` time, and by gemma4/_core.py at import
when the package runs from the source tree without an installed library
(python -m pytest with PYTHONPATH=python). Standard library only.

The header is looked for in $GEMMA4_SOURCE, then next to this package's source
(python/gemma4/../.. is the repository root). $CC picks the compiler (default
cc); $GEMMA4_CFLAGS replaces the optimisation flags (default -O2 -march=native,
as the Makefile's CFLAGS). -ffp-contract=off is always passed, as the
Makefile's WARN does: a contracted multiply-add would change the float32 bits
the goldens are checked with.
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile

LIB_NAME = "_gemma4.so"
HERE = os.path.dirname(os.path.abspath(__file__))


def find_header_dir(extra=()):
    """The directory holding gemma4.h, or None."""
    cands = []
    if os.environ.get("GEMMA4_SOURCE"):
        cands.append(os.environ["GEMMA4_SOURCE"])
    cands.extend(extra)
    cands.extend([HERE, os.path.dirname(HERE), os.path.dirname(os.path.dirname(HERE))])
    for d in cands:
        if d and os.path.isfile(os.path.join(d, "gemma4.h")):
            return os.path.abspath(d)
    return None


def build(out_path, header_dir=None, verbose=False):
    """Compiles _lib.c into out_path; raises RuntimeError with the compiler's output."""
    header_dir = header_dir or find_header_dir()
    if not header_dir:
        raise RuntimeError("gemma4: cannot find gemma4.h (set GEMMA4_SOURCE to the repository root)")
    cc = shlex.split(os.environ.get("CC", "cc"))
    if not shutil.which(cc[0]):
        raise RuntimeError(f"gemma4: no C compiler '{cc[0]}' (set CC)")
    opt = shlex.split(os.environ.get("GEMMA4_CFLAGS", "-O2 -march=native"))
    if not os.path.isfile(os.path.join(header_dir, "gemma4_processing.h")):
        raise RuntimeError(f"gemma4: {header_dir} has gemma4.h but no gemma4_processing.h")
    src = os.path.join(HERE, "_lib.c")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(os.path.abspath(out_path)))
    os.close(fd)
    cmd = cc + ["-std=c99", *opt, "-ffp-contract=off", "-fPIC", "-shared", "-fvisibility=hidden",
                "-I", header_dir, "-o", tmp, src, "-lm", "-lpthread"]
    if verbose:
        print("gemma4: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError("gemma4: building the library failed:\n" + " ".join(cmd) + "\n" + p.stdout)
    os.replace(tmp, out_path)  # atomic: a concurrent import never sees half a file
    return out_path


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, LIB_NAME), verbose=True))
