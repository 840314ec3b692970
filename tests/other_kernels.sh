#!/bin/sh
# The core suite built for the kernels -march=native does not pick: the scalar
# reference (G4_NO_SIMD) always, AVX2+FMA when this x86-64 CPU has it, and the
# AVX-512 and avx512_bf16 kernels on the plain-C model of their intrinsics
# (tests/x86_emu.h; reported as "avx512-emulated": it tests the kernels' logic,
# not a CPU's instructions). Each build's SIMD-vs-scalar and
# decode-vs-prefill-tile tests then run on that kernel; the emulated build also
# runs test_train and test_lora, whose backward GEMM and adapter kernels run the
# AVX-512 code too, with a CLI built the same way (its arena sizes follow the
# kernels). (NEON runs under qemu: make test-arm64.) The binaries are the
# Makefile's (build/test_gemma4_scalar, _avx2, _emu, build/gemma4_emu,
# build/test_train_emu, build/test_lora_emu; make test builds them in parallel
# with the rest); this script makes any that is missing or stale, then runs them.
# Usage: other_kernels.sh CC "WARN"
set -e
CC=${1:-cc}
WARN=${2:--std=c99 -Wall -Wextra -Wpedantic -Werror}
builds="scalar"
if [ "$(uname -m)" = x86_64 ] && grep -q ' avx2 ' /proc/cpuinfo && grep -q ' fma ' /proc/cpuinfo; then
  builds="$builds avx2"
else
  echo "# skip: AVX2 build (this CPU has no AVX2+FMA)"
fi
builds="$builds emu"
bins=""
for b in $builds; do bins="$bins build/test_gemma4_$b"; done
MAKEFLAGS= ${MAKE:-make} --no-print-directory -s CC="$CC" WARN="$WARN" $bins build/gemma4_emu build/test_train_emu build/test_lora_emu
for b in $builds; do
  case $b in scalar) flags="-DG4_NO_SIMD";; avx2) flags="-mavx2 -mfma -mf16c";;
             emu) flags="-DG4_X86_EMU=\"tests/x86_emu.h\" -Wno-psabi";; esac
  echo "# kernels built with $flags"
  st=0; ./build/test_gemma4_$b > build/test_gemma4_$b.log 2>&1 || st=$?
  grep -E '^  kernels:|^  bf16 mode:|^  bf16_fast|^  bf16 goldens:|^not ok|^[0-9]+ passed' build/test_gemma4_$b.log
  [ $st -eq 0 ] || exit $st
  if [ $b = emu ]; then
    for t in train lora; do
      st=0; ./build/test_${t}_emu data build/gemma4_emu > build/test_${t}_emu.log 2>&1 || st=$?
      echo "# test_$t built with $flags"
      grep -E '^not ok|^[0-9]+ passed' build/test_${t}_emu.log
      [ $st -eq 0 ] || exit $st
    done
  fi
done
