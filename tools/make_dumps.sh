#!/bin/sh
# Tap dumps from transformers for the compare / bf16 tests (data/dumps/).
# From the repository root, with the venv of docs/verification.md
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
# the 12B-style unified model (tools/make_unified_goldens.py): its text decoder, float32 and bf16
$PY tools/hf_dump.py data/tiny/unified_like --ids $IDS --out data/dumps/unified_like_f32.safetensors
$PY tools/hf_dump.py data/tiny/unified_like --ids $IDS --out data/dumps/unified_like_bf16.safetensors --dtype bfloat16
# Three small bf16 dumps for the bf16-faithful mode's hard cases (docs/bf16.md;
# test_bf16_bit_identical), a few taps each (--taps; input_ids and logits always kept):
# 31b_like 32 tokens, 4x the sliding window (RMSNorm sum and matmul order, first at layers.5.self_attn.k)
$PY tools/hf_dump.py data/tiny/31b_like --dtype bfloat16 --out data/dumps/31b_like_bf16_long.safetensors \
    --ids 2,69,405,129,140,268,160,392,191,68,432,167,272,99,55,255,63,459,468,56,288,386,388,483,124,438,474,27,430,199,59,159 \
    --taps 'layers.*.self_attn.k,norm,logits'
# 26b_like 24 tokens: the layers.3.input_layernorm ulp and an exact router tie
$PY tools/hf_dump.py data/tiny/26b_like --dtype bfloat16 --out data/dumps/26b_like_bf16_ulp.safetensors \
    --ids 2,308,17,465,453,253,47,63,186,63,338,266,479,385,368,83,455,368,146,244,80,54,54,490 \
    --taps 'layers.*.input_layernorm,layers.*.experts,norm,logits'
# 26b_like 24 tokens: a router tie torch.topk breaks to the higher expert id (layer 1, token 9: experts 2 and 4)
$PY tools/hf_dump.py data/tiny/26b_like --dtype bfloat16 --out data/dumps/26b_like_bf16_tie.safetensors \
    --ids 2,170,130,245,373,323,245,38,67,50,308,245,78,221,277,485,423,407,344,141,492,408,178,262 \
    --taps 'layers.*.experts,logits'
