#!/bin/sh
# Tap dumps from transformers for the compare / bf16 tests (data/dumps/).
# From the repository root, with the venv of README's *What is verified*
# (tools/requirements.txt):
#   sh tools/make_dumps.sh          (PY=other/python sh tools/make_dumps.sh for another one)
set -e
PY=${PY:-venv/bin/python}
IDS=2,81,101,77,5,9,300,41,12,7,99,100   # 12 tokens, past the sliding window of 8
mkdir -p data/dumps
$PY tools/hf_dump.py data/tiny/e2b_like --ids $IDS --out data/dumps/e2b_like_f32.safetensors
$PY tools/hf_dump.py data/tiny/e2b_like --ids $IDS --out data/dumps/e2b_like_bf16.safetensors --dtype bfloat16
$PY tools/hf_dump.py data/tiny/26b_like --ids $IDS --out data/dumps/26b_like_bf16.safetensors --dtype bfloat16
$PY tools/hf_dump.py data/tiny/31b_like --ids $IDS --out data/dumps/31b_like_bf16.safetensors --dtype bfloat16
$PY tools/hf_dump.py data/tiny/e4b_like --ids $IDS --out data/dumps/e4b_like_bf16.safetensors --dtype bfloat16
# plain (f16) and legacy_keys (f32) store non-bf16 weights, so their dumps are float32
$PY tools/hf_dump.py data/tiny/plain --ids $IDS --out data/dumps/plain_f32.safetensors
$PY tools/hf_dump.py data/tiny/legacy_keys --ids $IDS --out data/dumps/legacy_keys_f32.safetensors
