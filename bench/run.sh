#!/bin/sh
# make bench: gemma4.h on an E2B-shaped random checkpoint against the machine's
# limits and against peers on the same machine. Ratios, not absolute times:
# the machines are shared and noisy.
#   BENCH_CONFIG  config to shape the model (data/configs/gemma-4-E2B.json)
#   BENCH_LAYERS / BENCH_VOCAB  shrink it (default: full size, ~10 GB on disk)
#   BENCH_DIR     where the synthetic checkpoint goes (build/bench-model)
#   THREADS PROMPT GEN  (PROMPT2: the long prompt, 512 tokens in one chunk)
#   MEMBW_MIB     the bandwidth probe's buffer (default 2048 MiB; make bench-smoke: 16)
#   BENCH_PY      a python with torch + transformers for the PyTorch peer
#   LLAMA_BENCH   a llama.cpp llama-bench binary and BENCH_GGUF its model, for that peer
#   TOWER_CONFIGS the multimodal configs whose towers bench-towers times (random weights in
#                 memory; with the default BENCH_CONFIG the E2B and 31B configs, else none;
#                 "none" skips them); TOWER_ARGS more options for it (make bench-smoke: fewer patches);
#                 TOWER_BF16=1 times them in the bf16-faithful mode too (lines tagged <config>-bf16)
set -e
CONFIG=${BENCH_CONFIG:-data/configs/gemma-4-E2B.json}
DIR=${BENCH_DIR:-build/bench-model}
THREADS=${THREADS:-$(nproc)}
PROMPT=${PROMPT:-64}
PROMPT2=${PROMPT2:-512}
GEN=${GEN:-16}
opts=""
[ -n "$BENCH_LAYERS" ] && opts="$opts --layers $BENCH_LAYERS"
[ -n "$BENCH_VOCAB" ] && opts="$opts --vocab $BENCH_VOCAB"
if [ ! -f "$DIR/model.safetensors" ]; then
  echo "== writing a random $(basename "$CONFIG" .json)-shaped checkpoint to $DIR"
  ./build/gemma4 synth --config "$CONFIG" --out "$DIR" --dtype bf16 --force $opts
fi
bw=$(./build/membw "$THREADS" "${MEMBW_MIB:-2048}" | sed 's/read: \([0-9.]*\).*/\1/')
./build/fmapeak "$THREADS" > build/bench-fma.txt
fma=$(sed -n 's/^fma: \([0-9.]*\).*/\1/p' build/bench-fma.txt)
fma_cpu=$(sed -n 's/^fma per CPU-second: \([0-9.]*\).*/\1/p' build/bench-fma.txt)
echo "== gemma4.h"
./build/gemma4 bench "$DIR" --threads "$THREADS" --prompt "$PROMPT" --gen "$GEN" | tee build/bench-g4.txt
g_pre=$(sed -n 's/^prefill: \([0-9.]*\) tok\/s, \([0-9.]*\) GFLOP.*/\1/p' build/bench-g4.txt)
g_flops=$(sed -n 's/^prefill: [0-9.]* tok\/s, \([0-9.]*\) GFLOP.*/\1/p' build/bench-g4.txt)
g_fcpu=$(sed -n 's/^prefill per CPU-second: \([0-9.]*\) GFLOP.*/\1/p' build/bench-g4.txt)
# the prefill's parts (every row's FLOPs and bytes of weights, the last row's bytes and FLOPs): its roofline below
parts='s/^prefill parts: every row \([0-9]*\) FLOP on \([0-9]*\) bytes.* only \([0-9]*\) bytes of weights (\([0-9]*\) FLOP).*/\1 \2 \3 \4/p'
g_parts=$(sed -n "$parts" build/bench-g4.txt)
g_dec=$(sed -n 's/^decode: \([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1/p' build/bench-g4.txt)
g_gbs=$(sed -n 's/^decode: [0-9.]* tok\/s, \([0-9.]*\) GB.*/\1/p' build/bench-g4.txt)
echo "== gemma4.h, a $PROMPT2-token prompt in one chunk"
./build/gemma4 bench "$DIR" --threads "$THREADS" --prompt "$PROMPT2" --gen 1 | tee build/bench-g4long.txt
h_pre=$(sed -n 's/^prefill: \([0-9.]*\) tok\/s, \([0-9.]*\) GFLOP.*/\1/p' build/bench-g4long.txt)
h_flops=$(sed -n 's/^prefill: [0-9.]* tok\/s, \([0-9.]*\) GFLOP.*/\1/p' build/bench-g4long.txt)
h_fcpu=$(sed -n 's/^prefill per CPU-second: \([0-9.]*\) GFLOP.*/\1/p' build/bench-g4long.txt)
h_parts=$(sed -n "$parts" build/bench-g4long.txt)
if [ "$(basename "$CONFIG")" = "gemma-4-E2B.json" ] && [ -z "$BENCH_LAYERS$BENCH_VOCAB" ] && [ -z "$NO_DRAFTER" ]; then
  # speculative decoding: a drafter of an assumed E2B-drafter shape (bench/e2b-drafter.json;
  # Google's config is not in this repository), random weights, so acceptance is forced
  DDIR=${BENCH_DRAFTER_DIR:-build/bench-drafter}
  [ -f "$DDIR/model.safetensors" ] || ./build/gemma4 synth --config bench/e2b-drafter.json --out "$DDIR" --dtype bf16 --force
  echo "== gemma4.h with a drafter (k 4)"
  ./build/gemma4 bench "$DIR" --threads "$THREADS" --prompt "$PROMPT" --gen "$GEN" --drafter "$DDIR" --draft-tokens 4 | tee build/bench-g4-drafter.txt
fi
echo "== gemma4.h, bf16-faithful mode (bf16 activations; avx512_bf16 dot products where the CPU has them)"
./build/gemma4 bench "$DIR" --threads "$THREADS" --prompt "$PROMPT" --gen "$GEN" --bf16 | tee build/bench-g4bf16.txt
b_pre=$(sed -n 's/^prefill: \([0-9.]*\) tok\/s.*/\1/p' build/bench-g4bf16.txt)
b_dec=$(sed -n 's/^decode: \([0-9.]*\) tok\/s.*/\1/p' build/bench-g4bf16.txt)
f_pre="-"; f_dec="-"; f_cpu="-"; fl_pre="-"; fl_cpu="-"
if grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null; then
  echo "== gemma4.h, bf16 mode with bf16_fast (VDPBF16PS: its own summation order, within 3e-2 of the faithful mode)"
  ./build/gemma4 bench "$DIR" --threads "$THREADS" --prompt "$PROMPT" --gen "$GEN" --bf16-fast | tee build/bench-g4bf16fast.txt
  f_pre=$(sed -n 's/^prefill: \([0-9.]*\) tok\/s.*/\1/p' build/bench-g4bf16fast.txt)
  f_dec=$(sed -n 's/^decode: \([0-9.]*\) tok\/s.*/\1/p' build/bench-g4bf16fast.txt)
  f_cpu=$(sed -n 's/^prefill per CPU-second: .* (\([0-9.]*\) CPU-s.*/\1/p' build/bench-g4bf16fast.txt)
  echo "== gemma4.h, bf16_fast, a $PROMPT2-token prompt in one chunk"
  ./build/gemma4 bench "$DIR" --threads "$THREADS" --prompt "$PROMPT2" --gen 1 --bf16-fast | tee build/bench-g4bf16fastlong.txt
  fl_pre=$(sed -n 's/^prefill: \([0-9.]*\) tok\/s.*/\1/p' build/bench-g4bf16fastlong.txt)
  fl_cpu=$(sed -n 's/^prefill per CPU-second: .* (\([0-9.]*\) CPU-s.*/\1/p' build/bench-g4bf16fastlong.txt)
fi
# the towers: ms per image at 280 soft tokens (2520 patches) and per second of audio
if [ -z "$TOWER_CONFIGS" ]; then
  TOWER_CONFIGS=none
  [ "$CONFIG" = data/configs/gemma-4-E2B.json ] && TOWER_CONFIGS="data/configs/gemma-4-E2B.json data/configs/gemma-4-31B.json"
fi
: > build/bench-towers.txt
if [ "$TOWER_CONFIGS" != none ]; then
  for tc in $TOWER_CONFIGS; do
    tn=$(basename "$tc" .json)
    [ "$tn" = config ] && tn=$(basename "$(dirname "$tc")") # a model directory's config.json: the directory's name
    echo "== gemma4.h towers, $tn-shaped, random bf16 weights"
    ./build/gemma4 bench-towers --config "$tc" --threads "$THREADS" $TOWER_ARGS | tee build/bench-tower.txt
    sed "s/^/$tn /" build/bench-tower.txt >> build/bench-towers.txt
    if [ "${TOWER_BF16:-0}" = 1 ]; then
      echo "== gemma4.h towers, $tn-shaped, random bf16 weights, bf16-faithful mode"
      ./build/gemma4 bench-towers --config "$tc" --threads "$THREADS" --bf16 $TOWER_ARGS | tee build/bench-tower.txt
      sed "s/^/$tn-bf16 /" build/bench-tower.txt >> build/bench-towers.txt
    fi
  done
fi
t_pre="-"; t_dec="-"; t_cpu="-"; tl_pre="-"; tl_cpu="-"
if [ -n "$BENCH_PY" ]; then
  echo "== PyTorch eager (transformers), bf16"
  if "$BENCH_PY" bench/bench_torch.py "$DIR" --threads "$THREADS" --prompt "$PROMPT" --gen "$GEN" > build/bench-torch.txt 2>&1; then
    cat build/bench-torch.txt | grep -v Loading
    t_pre=$(sed -n 's/^prefill: \([0-9.]*\) tok.*/\1/p' build/bench-torch.txt)
    t_dec=$(sed -n 's/^decode: \([0-9.]*\) tok.*/\1/p' build/bench-torch.txt)
    t_cpu=$(sed -n 's/^prefill per CPU-second: .* (\([0-9.]*\) CPU-s.*/\1/p' build/bench-torch.txt)
  else tail -3 build/bench-torch.txt; fi
  if [ "$f_pre" != "-" ]; then # the peer of bf16_fast's long prompt
    echo "== PyTorch eager (transformers), bf16, a $PROMPT2-token prompt"
    if "$BENCH_PY" bench/bench_torch.py "$DIR" --threads "$THREADS" --prompt "$PROMPT2" --gen 1 > build/bench-torchlong.txt 2>&1; then
      cat build/bench-torchlong.txt | grep -v Loading
      tl_pre=$(sed -n 's/^prefill: \([0-9.]*\) tok.*/\1/p' build/bench-torchlong.txt)
      tl_cpu=$(sed -n 's/^prefill per CPU-second: .* (\([0-9.]*\) CPU-s.*/\1/p' build/bench-torchlong.txt)
    else tail -3 build/bench-torchlong.txt; fi
  fi
fi
l_pre="-"; l_dec="-"; l_long="-"
if [ -n "$LLAMA_BENCH" ] && [ -n "$BENCH_GGUF" ]; then
  echo "== llama.cpp (llama-bench, its defaults otherwise: prompts $PROMPT and $PROMPT2; decode $GEN tokens after a $PROMPT-token prompt, as gemma4.h's)"
  if "$LLAMA_BENCH" -m "$BENCH_GGUF" -t "$THREADS" -p "$PROMPT,$PROMPT2" -n 0 -r 3 -o json > build/bench-llama.json 2> build/bench-llama.err &&
     "$LLAMA_BENCH" -m "$BENCH_GGUF" -t "$THREADS" -p 0 -n "$GEN" -d "$PROMPT" -r 3 -o json > build/bench-llama-tg.json 2>> build/bench-llama.err; then
    # the best of its 3 repetitions, as for gemma4.h and PyTorch
    python3 -c '
import json, sys
for r in json.load(open(sys.argv[1])) + json.load(open(sys.argv[2])):
    kind = "prefill %d" % r["n_prompt"] if r["n_prompt"] else "decode"
    print("%s: %.2f tok/s (best of %s: %s; build %s)" % (kind, max(r["samples_ts"]), len(r["samples_ts"]),
          ", ".join("%.2f" % t for t in r["samples_ts"]), r["build_commit"]))
' build/bench-llama.json build/bench-llama-tg.json > build/bench-llama.txt || echo "could not read build/bench-llama.json"
    cat build/bench-llama.txt
    l_pre=$(sed -n "s/^prefill $PROMPT: \([0-9.]*\) tok.*/\1/p" build/bench-llama.txt)
    l_long=$(sed -n "s/^prefill $PROMPT2: \([0-9.]*\) tok.*/\1/p" build/bench-llama.txt)
    l_dec=$(sed -n 's/^decode: \([0-9.]*\) tok.*/\1/p' build/bench-llama.txt)
  else echo "llama-bench failed:"; tail -5 build/bench-llama.err; fi
fi
echo
echo "== $(basename "$CONFIG" .json)-shaped bf16 model, $THREADS threads, prompt $PROMPT, decode $GEN"
printf "%-28s %14s %14s\n" "" "prefill tok/s" "decode tok/s"
printf "%-28s %14s %14s\n" "gemma4.h ($(sed -n 's/.*, \([a-z0-9]*\) kernels.*/\1/p' build/bench-g4.txt))" "$g_pre" "$g_dec"
printf "%-28s %14s %14s\n" "gemma4.h, $PROMPT2-token prompt" "$h_pre" "-"
printf "%-28s %14s %14s\n" "gemma4.h bf16-faithful mode" "$b_pre" "$b_dec"
printf "%-28s %14s %14s\n" "gemma4.h bf16_fast" "$f_pre" "$f_dec"
printf "%-28s %14s %14s\n" "gemma4.h bf16_fast, $PROMPT2-token" "$fl_pre" "-"
printf "%-28s %14s %14s\n" "PyTorch eager bf16" "$t_pre" "$t_dec"
printf "%-28s %14s %14s\n" "PyTorch eager bf16, $PROMPT2-token" "${tl_pre:--}" "-"
printf "%-28s %14s %14s\n" "llama.cpp bf16" "${l_pre:--}" "${l_dec:--}"
printf "%-28s %14s %14s\n" "llama.cpp, $PROMPT2-token prompt" "${l_long:--}" "-"
if [ -s build/bench-towers.txt ]; then
  echo
  echo "== towers, $THREADS threads (random bf16 weights of each config's shapes)"
  sed -n 's/^\([^ ]*\) vision: .* -> \([0-9]*\) soft tokens: \([0-9.]*\) ms per image (\([0-9.]*\) CPU-ms.*/\1 vision tower: \3 ms per image of \2 soft tokens (\4 CPU-ms)/p
         s/^\([^ ]*\) audio: .*: \([0-9.]*\) ms per second of audio (\([0-9.]*\) CPU-ms.*/\1 audio tower: \2 ms per second of audio (\3 CPU-ms)/p' build/bench-towers.txt
fi
echo
# the ranking against the peers depends on the CPU and its ISA: name them beside the figures
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
# (an if, not `grep && printf`: the loop's status is its last grep's, and set -e ends the script on it)
isa=$(for f in avx2 fma f16c avx512f avx512_bf16 asimd; do if grep -qw "$f" /proc/cpuinfo 2>/dev/null; then printf '%s ' "$f"; fi; done)
echo "cpu: ${cpu:-unknown} ($(nproc) CPUs); ISA: ${isa:-none of avx2 fma f16c avx512f avx512_bf16 asimd}"
awk -v bw="$bw" -v gbs="$g_gbs" -v fma="$fma" -v fl="$g_flops" -v tp="$t_pre" -v td="$t_dec" -v gp="$g_pre" -v gd="$g_dec" \
    -v fcpu="$fma_cpu" -v gfc="$g_fcpu" -v hfl="$h_flops" -v hfc="$h_fcpu" -v p1="$PROMPT" -v p2="$PROMPT2" -v th="$THREADS" \
    -v lp="${l_pre:--}" -v ld="${l_dec:--}" -v ll="${l_long:--}" -v hp="$h_pre" -v bp="${b_pre:--}" -v bd="${b_dec:--}" \
    -v fp="${f_pre:--}" -v fd="${f_dec:--}" -v fc="${f_cpu:--}" -v tc="${t_cpu:--}" -v gpa="$g_parts" -v hpa="$h_parts" \
    -v flp="${fl_pre:--}" -v flc="${fl_cpu:--}" -v tlp="${tl_pre:--}" -v tlc="${tl_cpu:--}" '
# the prefill roofline: every row at the FMA peak (or its weights at the read bandwidth, if slower),
# then the last row only (the KV-reader layers and lm_head on G4_LOGITS_LAST) at the read bandwidth
function roof(p, parts, fl,   a, t) {
  if (split(parts, a, " ") != 4 || fma <= 0 || bw <= 0) return
  a[1] /= 1e9; a[2] /= 1e9; a[3] /= 1e9; a[4] /= 1e9 # GFLOP, GB
  t = (a[1] / fma > a[2] / bw ? a[1] / fma : a[2] / bw) + a[3] / bw
  if (t <= 0) return
  printf "prefill, %d tokens: roofline %.1f GFLOP/s = %.0f%% of the FMA peak (%.3g GFLOP on every row at the peak, %.3g GB for the last row only at the read bandwidth); measured %.0f%% of it\n", p, (a[1] + a[4]) / t, 100 * (a[1] + a[4]) / t / fma, a[1], a[3], 100 * fl * t / (a[1] + a[4])
}
BEGIN {
  printf "machine: read bandwidth %.1f GB/s, FMA peak %.1f GFLOP/s (float32, measured)\n", bw, fma
  printf "         FMA peak per CPU-second %.1f GFLOP per thread\n", fcpu
  printf "decode:  %.1f GB/s of weights = %.0f%% of the read bandwidth (target 85%%)\n", gbs, 100 * gbs / bw
  printf "prefill, %d tokens:  %.1f GFLOP/s = %.0f%% of the FMA peak (target 80%%); per CPU-second %.1f GFLOP = %.0f%% of the peak per CPU-second\n", p1, fl, 100 * fl / fma, gfc, 100 * gfc / fcpu
  printf "prefill, %d tokens: %.1f GFLOP/s = %.0f%% of the FMA peak (target 80%%); per CPU-second %.1f GFLOP = %.0f%% of the peak per CPU-second\n", p2, hfl, 100 * hfl / fma, hfc, 100 * hfc / fcpu
  roof(p1, gpa, fl)
  roof(p2, hpa, hfl)
  if (tp != "-" && tp > 0) printf "gemma4.h vs PyTorch: prefill %.2fx, decode %.2fx\n", gp / tp, gd / td
  if (lp != "-" && lp > 0) printf "gemma4.h vs llama.cpp: prefill %.2fx, decode %.2fx\n", gp / lp, gd / ld
  if (ll != "-" && ll > 0) printf "gemma4.h vs llama.cpp, %d-token prompt: prefill %.2fx\n", p2, hp / ll
  if (tp != "-" && tp > 0 && bp != "-") printf "bf16-faithful mode vs PyTorch: prefill %.2fx, decode %.2fx\n", bp / tp, bd / td
  if (tp != "-" && tp > 0 && fp != "-") printf "bf16_fast vs PyTorch: prefill %.2fx (target 1.1x), decode %.2fx\n", fp / tp, fd / td
  if (tc != "-" && tc > 0 && fc != "-" && fc > 0) printf "bf16_fast vs PyTorch per CPU-second of each process (all its threads): prefill %.2fx\n", tc / fc
  if (tlp != "-" && tlp > 0 && flp != "-") printf "bf16_fast vs PyTorch, %d-token prompt: prefill %.2fx (target 1.1x)\n", p2, flp / tlp
  if (tlc != "-" && tlc > 0 && flc != "-" && flc > 0) printf "bf16_fast vs PyTorch, %d-token prompt, per CPU-second of each process: prefill %.2fx\n", p2, tlc / flc
  if (lp != "-" && lp > 0 && bp != "-") printf "bf16-faithful mode vs llama.cpp: prefill %.2fx, decode %.2fx\n", bp / lp, bd / ld
}'
