#!/bin/bash
# Every CUDA check that needs a GPU, in one run of about 10 minutes, writing at
# most 8 files into LOGDIR (the build logs go to build/):
#   device.txt      the card, driver, nvcc; the three builds
#   suite.txt       tests/test_cuda.c built with the default grids and with every
#                   grid capped at 1 and at 3 blocks (-DG4C_MAX_BLOCKS): each must
#                   pass the same bit-equality tests against the CPU
#   sanitizers.txt  compute-sanitizer memcheck, racecheck, synccheck, initcheck over
#                   the sized suite (G4_CUDA_SUITE=sized: the models that take every
#                   kernel and shape, fewer inputs; docs/cuda.md), the four at once
#   real.txt        tests/cuda_real.sh's real shapes (QUICK=1: its shorter list)
#   bench.txt       bench/cuda_bench.c on a random E2B-shaped checkpoint: exact,
#                   fast, fast bf16; flash-decoding sized from the card vs 16 splits
#   summary.txt     one line per stage, pass or fail
# Usage: tests/cuda_device.sh [LOGDIR] [SECONDS_PER_SANITIZER]
#   SANITIZERS (default: all four), SAN_FILTER (only the tests whose name has it),
#   SKIP (stages to skip, any of: suite san real bench). Worst case (every timeout
#   reached) about 14 minutes; a device call of at most 10 minutes can run
#   SKIP="real bench" first, then SKIP="suite san" (the builds are redone: 1 min).
set -u
export G4_CUDA_REQUIRED=1 # here no CUDA device is a failure of tests/test_cuda.c and tests/cuda_real.c, not a skip
out=${1:-build/cuda_device}
budget=${2:-150}
skip=" ${SKIP:-} "
mkdir -p "$out" build
sum="$out/summary.txt"
: > "$sum"
say() { echo "$*" | tee -a "$sum"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -n 1; } \
    > "$out/device.txt" 2>&1
cat "$out/device.txt"
nvf=$(make -s --no-print-directory print-nvflags)
cc ${CFLAGS:--O2 -march=native} -std=c99 -Wall -Wextra -Wpedantic -Werror -ffp-contract=off -g \
   -c tests/test_cuda.c -o build/test_cuda.o || exit 1
for b in max 1 3; do
    d=""; [ "$b" != max ] && d="-DG4C_MAX_BLOCKS=$b"
    ( nvcc $nvf $d -DG4_TESTING -c gemma4_cuda.cu -o build/gemma4_cuda_$b.o &&
      nvcc -o build/test_cuda_$b build/test_cuda.o build/gemma4_cuda_$b.o -lm -lpthread ) > "build/cuda_build_$b.txt" 2>&1 &
done
wait
fail=0
for b in max 1 3; do
    if [ -x build/test_cuda_$b ]; then echo "build blocks=$b: ok" >> "$out/device.txt"
    else { echo "build blocks=$b: FAILED"; tail -n 20 "build/cuda_build_$b.txt"; } >> "$out/device.txt"; fail=1; fi
done
if [[ $skip != *" suite "* ]]; then
    : > "$out/suite.txt"
    for b in max 1 3; do
        [ -x build/test_cuda_$b ] || continue
        s=$(date +%s)
        echo "== blocks $b" >> "$out/suite.txt"
        timeout 120 ./build/test_cuda_$b >> "$out/suite.txt" 2>&1
        rc=$?
        say "suite, blocks $b: exit $rc in $(( $(date +%s) - s )) s: $(tail -n 1 "$out/suite.txt")"
        [ $rc -eq 0 ] || fail=1
    done
fi
if [[ $skip != *" san "* ]] && [ -x build/test_cuda_max ]; then
    : > "$out/sanitizers.txt"
    s=$(date +%s)
    for t in ${SANITIZERS:-memcheck racecheck synccheck initcheck}; do # the four at once (mostly host-bound)
        ( G4_CUDA_SUITE=sized timeout "$budget" compute-sanitizer --tool "$t" --error-exitcode 99 ./build/test_cuda_max \
              ${SAN_FILTER:+data "$SAN_FILTER"} > "build/cuda_san_$t.txt" 2>&1
          echo $? > "build/cuda_san_$t.rc" ) &
    done
    wait
    for t in ${SANITIZERS:-memcheck racecheck synccheck initcheck}; do
        rc=$(cat "build/cuda_san_$t.rc")
        { echo "== $t: exit $rc"; cat "build/cuda_san_$t.txt"; } >> "$out/sanitizers.txt"
        say "compute-sanitizer $t (sized suite): exit $rc (124: past ${budget} s): $(grep -E 'ERROR SUMMARY|passed' \
            "build/cuda_san_$t.txt" | tail -n 2 | tr '\n' ' ')"
        [ "$rc" = 0 ] || fail=1
    done
    say "sanitizers: $(( $(date +%s) - s )) s in all"
fi
if [[ $skip != *" real "* ]]; then
    s=$(date +%s)
    QUICK=1 tests/cuda_real.sh build/cuda_real_logs > "$out/real.txt" 2>&1
    rc=$?
    say "cuda_real.sh (QUICK): exit $rc in $(( $(date +%s) - s )) s"
    [ $rc -eq 0 ] || fail=1
fi
if [[ $skip != *" bench "* ]]; then
    s=$(date +%s)
    m=build/cuda_real_models/e2b   # made by cuda_real.sh (the released E2B config, random bf16)
    {
        make -s build/gemma4 &&
        nvcc $nvf -c gemma4_cuda.cu -o build/gemma4_cuda_bench.o &&
        cc -O2 -march=native -std=c99 -Wall -Wextra -Werror -ffp-contract=off -D_POSIX_C_SOURCE=200809L \
           -c bench/cuda_bench.c -o build/cuda_bench.o &&
        nvcc -o build/cuda_bench build/cuda_bench.o build/gemma4_cuda_bench.o -lm -lpthread &&
        { [ -f "$m/model.safetensors" ] || ./build/gemma4 synth --config data/configs/gemma-4-E2B.json --out "$m" \
            --dtype bf16 --force > /dev/null; } &&
        echo "== E2B fast, fast-bf16: flash-decoding sized from the card" &&
        timeout 90 ./build/cuda_bench "$m" --modes fast,fast-bf16 --ctx 0,8192 --gen 16 &&
        echo "== E2B fast: 16 splits (the earlier fixed sizing)" &&
        timeout 45 ./build/cuda_bench "$m" --modes fast --ctx 8192 --gen 16 --splits 16 | grep -v ^device &&
        echo "== E2B exact" &&
        timeout 30 ./build/cuda_bench "$m" --modes exact --ctx 0 --gen 8 | grep -v ^device
    } > "$out/bench.txt" 2>&1
    say "bench: exit $? in $(( $(date +%s) - s )) s (not a test)"
fi
say "cuda_device.sh: $([ $fail -eq 0 ] && echo pass || echo FAIL)"
exit $fail
