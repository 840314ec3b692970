#!/usr/bin/env python3
"""Two tap dumps (tools/hf_dump.py) against each other, as `gemma4 compare`
measures gemma4.h against one: per tap, max |a - b| over max |b|.

    venv/bin/python tools/dump_diff.py A.safetensors B.safetensors [--tolerance 1e-4]

Prints the logits' figure, the median and the worst tap and how many taps
exceed the tolerance; the same for the parameter gradients of a --grad dump. Used by tools/check_real_shapes.sh to put transformers' own
float32 run beside gemma4.h's, both against a float64 run."""
import argparse

import numpy as np
from safetensors.numpy import load_file

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--tolerance", type=float, default=1e-4)
args = ap.parse_args()
a, b = load_file(args.a), load_file(args.b)
rel = {}
for k in a:
    if k == "input_ids" or k not in b:
        continue
    x, y = a[k].astype(np.float64), b[k].astype(np.float64)
    rel[k] = float(np.abs(x - y).max() / max(float(np.abs(y).max()), 1e-30))


def report(keys, what):
    if not keys:
        return
    worst = max(keys, key=rel.get)
    over = sum(rel[k] > args.tolerance for k in keys)
    median = float(np.median([rel[k] for k in keys]))
    print(f"{len(keys)} {what} compared, {over} over tolerance {args.tolerance:g}; median {median:.3g}; worst {worst} {rel[worst]:.3g}", end="")
    print(f"; logits {rel['logits']:.3g}" if "logits" in keys else "")


report([k for k in rel if not k.startswith("grad.") and k not in ("loss", "labels")], "taps")
report([k for k in rel if k.startswith("grad.model.")], "parameter gradients")
