#!/bin/sh
# The core suite built for the kernels -march=native does not pick: the scalar
# reference (G4_NO_SIMD) always, AVX2+FMA when this x86-64 CPU has it, and the
# AVX-512 and avx512_bf16 kernels on the plain-C model of their intrinsics
# (tests/x86_emu.h; reported as "avx512-emulated": it tests the kernels' logic,
# not a CPU's instructions). Each build's SIMD-vs-scalar and
# decode-vs-prefill-tile tests then run on that kernel; the emulated build also
# runs test_train and test_lora. (NEON runs under qemu:
# make test-arm64.) Usage: other_kernels.sh CC "WARN"
set -e
CC=${1:-cc}
WARN=${2:--std=c99 -Wall -Wextra -Wpedantic -Werror}
builds="-DG4_NO_SIMD"
if [ "$(uname -m)" = x86_64 ] && grep -q ' avx2 ' /proc/cpuinfo && grep -q ' fma ' /proc/cpuinfo; then
  builds="$builds -mavx2,-mfma,-mf16c"
else
  echo "# skip: AVX2 build (this CPU has no AVX2+FMA)"
fi
# the emulation is the whole instruction set: no -m flags (-Wno-psabi: see x86_emu.h)
builds="$builds -DG4_X86_EMU=\"tests/x86_emu.h\",-Wno-psabi"
mkdir -p build
for b in $builds; do
  flags=$(echo "$b" | tr ',' ' ')
  $CC $WARN -O2 $flags -g -o build/test_gemma4_k tests/test_gemma4.c -lm -lpthread
  echo "# kernels built with $flags"
  st=0; ./build/test_gemma4_k > build/test_gemma4_k.log 2>&1 || st=$?
  grep -E '^  kernels:|^  bf16 mode:|^not ok|^[0-9]+ passed' build/test_gemma4_k.log
  [ $st -eq 0 ] || exit $st
  case "$b" in *G4_X86_EMU*) # and the training reference and LoRA, whose backward GEMM and adapter kernels run the
                             # AVX-512 code too, with a CLI built the same way (its arena sizes follow the kernels)
    $CC $WARN -O2 $flags -o build/gemma4_k examples/gemma4.c -lm -lpthread
    for t in train lora; do
      $CC $WARN -O2 $flags -o build/test_${t}_k tests/test_$t.c -lm -lpthread
      st=0; ./build/test_${t}_k data build/gemma4_k > build/test_${t}_k.log 2>&1 || st=$?
      echo "# test_$t built with $flags"
      grep -E '^not ok|^[0-9]+ passed' build/test_${t}_k.log
      [ $st -eq 0 ] || exit $st
    done;;
  esac
done
