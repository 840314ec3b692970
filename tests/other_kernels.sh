#!/bin/sh
# The core suite built for the kernels -march=native does not pick: the scalar
# reference (G4_NO_SIMD) always, and AVX2+FMA when this x86-64 CPU has it. Each
# build's SIMD-vs-scalar and decode-vs-prefill-tile tests then run on that
# kernel. (NEON runs under qemu: make test-arm64.) Usage: other_kernels.sh CC "WARN"
set -e
CC=${1:-cc}
WARN=${2:--std=c99 -Wall -Wextra -Wpedantic -Werror}
builds="-DG4_NO_SIMD"
if [ "$(uname -m)" = x86_64 ] && grep -q ' avx2 ' /proc/cpuinfo && grep -q ' fma ' /proc/cpuinfo; then
  builds="$builds -mavx2,-mfma,-mf16c"
else
  echo "# skip: AVX2 build (this CPU has no AVX2+FMA)"
fi
mkdir -p build
for b in $builds; do
  flags=$(echo "$b" | tr ',' ' ')
  $CC $WARN -O2 $flags -g -o build/test_gemma4_k tests/test_gemma4.c -lm -lpthread
  echo "# kernels built with $flags"
  st=0; ./build/test_gemma4_k > build/test_gemma4_k.log 2>&1 || st=$?
  grep -E '^  kernels:|^not ok|^[0-9]+ passed' build/test_gemma4_k.log
  [ $st -eq 0 ] || exit $st
done
