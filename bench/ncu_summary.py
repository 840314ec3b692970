#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel:
    python3 bench/ncu_summary.py LOG.csv
(bench/cuda.sh's profile of one decode step; see docs/cuda.md)."""
import csv
import sys
from collections import defaultdict

tot, cnt = defaultdict(float), defaultdict(int)
unit = ""
with open(sys.argv[1]) as f:
    rows = [line for line in f if line.startswith('"')]
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0].split("<")[0]
    v = float(r["Metric Value"].replace(",", ""))
    unit = r["Metric Unit"]
    tot[name] += v
    cnt[name] += 1
all_t = sum(tot.values())
print(f"{sum(cnt.values())} kernels, {all_t:.0f} {unit} in all")
for name, t in sorted(tot.items(), key=lambda kv: -kv[1])[:15]:
    print(f"{name:28s} {cnt[name]:5d} launches {t:12.0f} {unit} {100 * t / all_t:5.1f}%")
