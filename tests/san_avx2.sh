#!/bin/sh
# The suites that run the SIMD kernels (the packed GEMM, the decode rows) under
# ASan + UBSan, built for AVX2+FMA: the *_san builds use the baseline ISA, so
# without this the AVX2 kernels never run under the sanitizers. Skips, saying
# so, on a CPU without AVX2+FMA (or not x86-64). Each suite's log is
# build/san_avx2_<suite>.log; its closing "N passed, M failed" line is printed.
# Usage: san_avx2.sh CC "WARN" "SAN"   (CPUINFO=file replaces /proc/cpuinfo)
set -e
CC=${1:-cc}
WARN=${2:--std=c99 -Wall -Wextra -Wpedantic -Werror}
SAN=${3:--O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer}
CPUINFO=${CPUINFO:-/proc/cpuinfo}
if [ "$(uname -m)" != x86_64 ] || ! grep -q ' avx2 ' "$CPUINFO" || ! grep -q ' fma ' "$CPUINFO"; then
  echo "# skip: the AVX2+FMA sanitizer builds (this CPU has no AVX2+FMA; the baseline *_san builds ran)"
  exit 0
fi
mkdir -p build
suites="gemma4 threads lora" # (lora: the adapter kernels on g4__dot and g4__axpy)
pids=""
for t in $suites; do # the compiles side by side (each ~20 s of one core)
  rm -f build/test_${t}_san_avx2
  $CC $WARN $SAN -mavx2 -mfma -mf16c -pthread -o build/test_${t}_san_avx2 tests/test_$t.c -lm -lpthread &
  pids="$pids $!"
done
for p in $pids; do wait $p || { echo "san_avx2: a build failed"; exit 1; }; done
for t in $suites; do
  st=0; ./build/test_${t}_san_avx2 > build/san_avx2_$t.log 2>&1 || st=$?
  if [ $st -ne 0 ]; then cat build/san_avx2_$t.log; exit $st; fi
  echo "# test_$t built -mavx2 -mfma -mf16c, under ASan+UBSan"
  grep -E '^  kernels:' build/san_avx2_$t.log || true
  tail -n 1 build/san_avx2_$t.log
done
# the core suite says which kernels it ran: they must be the AVX2 ones
grep -q '^  kernels: avx2' build/san_avx2_gemma4.log || { echo "san_avx2: test_gemma4 did not run the AVX2 kernels"; exit 1; }
