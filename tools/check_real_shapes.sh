#!/bin/sh
# Real shapes against transformers: for each released config, a random
# checkpoint of its real widths (gemma4 synth: its first LAYERS layers, its
# vocabulary cut to VOCAB ids), dumped by transformers (tools/hf_dump.py, eager
# attention) in bfloat16 and in float32, then `gemma4 compare`:
#   - bf16-faithful mode at tolerance 0 (bit for bit), in one chunk and in chunks of 5;
#   - float32 mode: its report against transformers float32 (tolerance 1e-4 of each tap's
#     max), and both float32 runs against transformers in float64: on a random
#     network the two float32 orders drift apart layer after layer, and the float64
#     run says which is nearer the exact values.
# Not a test (it needs torch and several GB); the tiny goldens in data/ are the tests.
#   sh tools/check_real_shapes.sh [NAME[:LAYERS] ...]   default: E2B:10 E4B:12 31B:6 26B-A4B:6
#   VOCAB (default 4096), OUT (default build/real), PY (default venv/bin/python);
#   F32=0 skips float32, F64=0 the float64 run (it needs 8 bytes a parameter: 23 GB for 31B:6);
#   GRAD=1 adds the gradients (hf_dump.py --grad, float32 and float64)
set -e
VOCAB=${VOCAB:-4096}
OUT=${OUT:-build/real}
PY=${PY:-venv/bin/python}
IDS=2,818,1010,4000,77,900,123,3100,5,600,1700,250
[ $# -gt 0 ] || set -- E2B:10 E4B:12 31B:6 26B-A4B:6
make -s build/gemma4
status=0
for spec in "$@"; do
  name=${spec%%:*}
  layers=${spec#*:}
  [ "$layers" = "$spec" ] && layers=6
  dir=$OUT/$name-$layers
  echo "== gemma-4-$name: first $layers layers, vocabulary $VOCAB"
  mkdir -p "$dir"
  [ -f "$dir/model.safetensors" ] || ./build/gemma4 synth --config "data/configs/gemma-4-$name.json" --out "$dir" \
      --dtype bf16 --force --layers "$layers" --vocab "$VOCAB" > /dev/null
  ./build/gemma4 info "$dir" | sed -n 's/^kv sharing/  kv sharing/p'
  "$PY" tools/hf_dump.py "$dir" --ids $IDS --out "$dir/dump_bf16.safetensors" --dtype bfloat16 2>&1 | grep '^hf_dump' | sed 's/^/  /'
  for chunk in 12 5; do
    if ./build/gemma4 compare "$dir" "$dir/dump_bf16.safetensors" --bf16 --tolerance 0 --chunk $chunk > "$dir/compare_bf16_$chunk.txt" 2>&1; then r=ok; else r=FAIL; status=1; fi
    echo "  bf16-faithful, chunks of $chunk, tolerance 0: $(tail -n 1 "$dir/compare_bf16_$chunk.txt") [$r]"
  done
  if [ "${F32:-1}" != 0 ]; then
    # float32: gemma4.h and transformers' own float32 run, each against a float64 run
    "$PY" tools/hf_dump.py "$dir" --ids $IDS --out "$dir/dump_f32.safetensors" 2>&1 | grep '^hf_dump' | sed 's/^/  /'
    [ "${F64:-1}" = 0 ] || "$PY" tools/hf_dump.py "$dir" --ids $IDS --out "$dir/dump_f64.safetensors" --dtype float64 2>&1 | grep '^hf_dump' | sed 's/^/  /'
    ./build/gemma4 compare "$dir" "$dir/dump_f32.safetensors" > "$dir/compare_f32.txt" 2>&1 || true
    echo "  gemma4.h float32 vs transformers float32: $(tail -n 1 "$dir/compare_f32.txt"); logits $(grep '^logits ' "$dir/compare_f32.txt" | awk '{print $4}')"
    if [ -f "$dir/dump_f64.safetensors" ]; then
      ./build/gemma4 compare "$dir" "$dir/dump_f64.safetensors" > "$dir/compare_f64.txt" 2>&1 || true
      echo "  gemma4.h float32 vs transformers float64: $(tail -n 1 "$dir/compare_f64.txt"); logits $(grep '^logits ' "$dir/compare_f64.txt" | awk '{print $4}')"
      echo "  transformers float32 vs float64: $("$PY" tools/dump_diff.py "$dir/dump_f32.safetensors" "$dir/dump_f64.safetensors")"
    fi
  fi
  if [ "${GRAD:-0}" = 1 ]; then
    # the loss's gradients (labels = the ids): gemma4.h and transformers float32, each against float64
    "$PY" tools/hf_dump.py "$dir" --ids $IDS --out "$dir/dump_grad32.safetensors" --grad 2>&1 | grep '^hf_dump' | sed 's/^/  /'
    "$PY" tools/hf_dump.py "$dir" --ids $IDS --out "$dir/dump_grad64.safetensors" --grad --dtype float64 2>&1 | grep '^hf_dump' | sed 's/^/  /'
    ./build/gemma4 compare "$dir" "$dir/dump_grad64.safetensors" > "$dir/compare_grad64.txt" 2>&1 || true
    echo "  gemma4.h gradients vs transformers float64: $(tail -n 1 "$dir/compare_grad64.txt"); median $(awk '/^parameter gradients/{p=1; next} p && $1 ~ /^model\./ {print $3}' "$dir/compare_grad64.txt" | sort -g | awk '{v[NR] = $1} END {printf "%.3g", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'); worst $(awk '/^parameter gradients/{p=1; next} p && $1 ~ /^model\./ && $3 > m {m = $3; k = $1} END {print k, m}' "$dir/compare_grad64.txt")"
    echo "  transformers float32 gradients vs float64: $("$PY" tools/dump_diff.py "$dir/dump_grad32.safetensors" "$dir/dump_grad64.safetensors" | tail -n 1)"
  fi
  rm -f "$dir"/dump_*.safetensors
done
exit $status
