#!/bin/bash
# The CUDA checks that need a GPU: the suite (tests/test_cuda.c) built with the
# default grids and with every grid capped at 1 and at 3 blocks (each build must
# pass the same bit-equality tests against the CPU), then compute-sanitizer's
# memcheck, racecheck, synccheck and initcheck over the suite.
# Usage: tests/cuda_device.sh [LOGDIR] [SECONDS_PER_SANITIZER]
#   SANITIZERS (default: all four), SAN_FILTER (only the tests whose name has it)
set -u
out=${1:-build/cuda_device}
budget=${2:-300}
mkdir -p "$out" build
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
nvcc --version | tail -n 1 | tee -a "$out/device.txt"
nvf=$(make -s --no-print-directory print-nvflags)
cc ${CFLAGS:--O2 -march=native} -std=c99 -Wall -Wextra -Wpedantic -Werror -ffp-contract=off -g \
   -c tests/test_cuda.c -o build/test_cuda.o || exit 1
for b in max 1 3; do
    d=""; [ "$b" != max ] && d="-DG4C_MAX_BLOCKS=$b"
    ( nvcc $nvf $d -DG4_TESTING -c gemma4_cuda.cu -o build/gemma4_cuda_$b.o &&
      nvcc -o build/test_cuda_$b build/test_cuda.o build/gemma4_cuda_$b.o -lm -lpthread ) > "$out/build_$b.txt" 2>&1 &
done
wait
fail=0
for b in max 1 3; do
    if [ ! -x build/test_cuda_$b ]; then echo "blocks $b: build failed"; tail -n 20 "$out/build_$b.txt"; fail=1; continue; fi
    s=$(date +%s)
    ./build/test_cuda_$b > "$out/test_$b.txt" 2>&1
    rc=$?
    echo "blocks $b: exit $rc in $(( $(date +%s) - s )) s: $(tail -n 1 "$out/test_$b.txt")"
    [ $rc -eq 0 ] || { grep -E "FAIL|failed" "$out/test_$b.txt" | head -n 20; fail=1; }
done
for t in ${SANITIZERS:-memcheck racecheck synccheck initcheck}; do
    s=$(date +%s)
    timeout "$budget" compute-sanitizer --tool "$t" --error-exitcode 99 ./build/test_cuda_max ${SAN_FILTER:+data "$SAN_FILTER"} \
        > "$out/san_$t.txt" 2>&1
    rc=$?
    echo "compute-sanitizer $t: exit $rc in $(( $(date +%s) - s )) s: $(grep -E 'ERROR SUMMARY|passed' "$out/san_$t.txt" | tail -n 2 | tr '\n' ' ')"
    [ $rc -eq 0 ] || fail=1
done
exit $fail
