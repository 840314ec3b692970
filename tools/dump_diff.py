#!/usr/bin/env python3
"""Two tap dumps (tools/hf_dump.py) against each other, as `gemma4 compare`
measures gemma4.h against one: per tap, max |a - b| over max |b|.

    venv/bin/python tools/dump_diff.py A.safetensors B.safetensors [--tolerance 1e-4]

Prints the logits' figure, the worst tap and how many taps exceed the
tolerance. Used by tools/check_real_shapes.sh to put transformers' own
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
worst = max(rel, key=rel.get)
over = sum(r > args.tolerance for r in rel.values())
print(f"{len(rel)} taps compared, {over} over tolerance {args.tolerance:g}; worst {worst} {rel[worst]:.3g}; logits {rel.get('logits', float('nan')):.3g}")
