#!/bin/sh
# The suites that run the SIMD kernels (the packed GEMM, the decode rows) under
# ASan + UBSan: the *_san builds use the baseline ISA, so without this the SIMD
# kernels never run under the sanitizers.
#   - test_gemma4, test_threads, test_train (the loss's SIMD row) and test_lora
#     built for AVX2+FMA (skipped,
#     saying so, on a CPU without AVX2+FMA or not x86-64);
#   - test_gemma4 on the emulated AVX-512 intrinsics (tests/x86_emu.h, any
#     CPU): the AVX-512 and avx512_bf16 kernels' loads, stores and edges.
# The binaries are the Makefile's (build/test_<suite>_san_<isa>; make test
# builds them in parallel with the rest); this script makes any that is
# missing or stale, then runs them. Each suite's log is
# build/san_<isa>_<suite>.log; its closing "N passed, M failed" line is printed.
# Usage: san_avx2.sh CC "WARN" "SAN"   (CPUINFO=file replaces /proc/cpuinfo)
set -e
CC=${1:-cc}
WARN=${2:--std=c99 -Wall -Wextra -Wpedantic -Werror}
SAN=${3:--O1 -g1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer}
CPUINFO=${CPUINFO:-/proc/cpuinfo}
mkdir -p build
builds="emu:gemma4" # isa:suite
if [ "$(uname -m)" != x86_64 ] || ! grep -q ' avx2 ' "$CPUINFO" || ! grep -q ' fma ' "$CPUINFO"; then
  echo "# skip: the AVX2+FMA sanitizer builds (this CPU has no AVX2+FMA; the baseline *_san builds ran)"
else
  builds="$builds avx2:gemma4 avx2:threads avx2:train avx2:lora" # (train: the loss's SIMD row; lora: the adapter kernels on g4__dot and g4__axpy)
fi
bins=""
for b in $builds; do bins="$bins build/test_${b#*:}_san_${b%%:*}"; done
MAKEFLAGS= ${MAKE:-make} --no-print-directory -s CC="$CC" WARN="$WARN" SAN="$SAN" $bins
for b in $builds; do
  isa=${b%%:*}; t=${b#*:}
  args=""; [ $t != train ] || args="data build/gemma4" # (test_train's CLI cases, on the plain CLI: none skipped)
  st=0; ./build/test_${t}_san_$isa $args > build/san_${isa}_$t.log 2>&1 || st=$?
  if [ $st -ne 0 ]; then cat build/san_${isa}_$t.log; exit $st; fi
  if [ $isa = emu ]; then echo "# test_$t on the emulated AVX-512 intrinsics (tests/x86_emu.h), under ASan+UBSan"
  else echo "# test_$t built -mavx2 -mfma -mf16c, under ASan+UBSan"; fi
  grep -E '^  kernels:' build/san_${isa}_$t.log || true
  tail -n 1 build/san_${isa}_$t.log
done
# the core suite says which kernels it ran: they must be the ones asked for
grep -q '^  kernels: avx512-emulated' build/san_emu_gemma4.log || { echo "san_avx2: the emulated build did not run the AVX-512 kernels"; exit 1; }
[ ! -f build/san_avx2_gemma4.log ] || case "$builds" in *avx2:gemma4*)
  grep -q '^  kernels: avx2' build/san_avx2_gemma4.log || { echo "san_avx2: test_gemma4 did not run the AVX2 kernels"; exit 1; };; esac
