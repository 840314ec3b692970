#!/bin/sh
# Compiles gemma4.h and gemma4_processing.h with their implementation as C99
# and as C++ (11 and 17; for each SIMD path the C++ compiles stop before code
# generation, which the C compiles of the same code run), with
# -Wall -Wextra -Wpedantic -Werror, under every compiler found; also with
# GEMMA4_STATIC, G4_NO_MMAP and G4_NO_THREADS, with the CUDA declarations
# (GEMMA4_CUDA, gemma4.h alone), and with each SIMD path (scalar, AVX2+FMA,
# AVX-512) on x86-64, and at -O2. Fails on any warning. Checks too that gemma4_processing.h
# refuses to compile without gemma4.h (its #error). The compiles run in parallel, one per CPU.
set -e
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/t.c" <<'SRC'
#define GEMMA4_IMPLEMENTATION
#include "gemma4.h"
#include "gemma4_processing.h"
int main(void) { g4_session_config c = g4_session_config_init(); return c.max_chunk == 64 ? 0 : 1; }
SRC
cat > "$tmp/s.c" <<'SRC'
#define GEMMA4_STATIC
#define G4_NO_MMAP
#define G4_NO_THREADS
#define GEMMA4_IMPLEMENTATION
#include "gemma4.h"
#include "gemma4_processing.h"
int main(void) { g4_config c; return g4_config_parse(&c, "{}", 2, "x") == G4_OK; }
SRC
cat > "$tmp/c.c" <<'SRC'
#define GEMMA4_CUDA
#define GEMMA4_IMPLEMENTATION
#include "gemma4.h"
int main(void) { g4_cuda_session s; s.matmul = G4_CUDA_MATMUL_PLAIN; return s.matmul == 1 && G4_ERR_CUDA != G4_OK ? 0 : 1; }
SRC
cp "$tmp/t.c" "$tmp/t.cpp"
cp "$tmp/c.c" "$tmp/c.cpp"
cp "$tmp/s.c" "$tmp/s.cpp"
W="-Wall -Wextra -Wpedantic -Werror -I."
n=0
: > "$tmp/jobs"
job() { n=$((n+1)); echo "$* -o $tmp/o$n" >> "$tmp/jobs"; } # one compile, run below
simd="-DG4_NO_SIMD"
case "$(uname -m)" in x86_64) simd="$simd -mavx2,-mfma,-mf16c -mavx512f -mavx512f,-mavx512bf16";; esac
for isa in $simd; do
  isa=$(echo "$isa" | tr ',' ' ')
  for cc in gcc clang; do
    command -v $cc >/dev/null || continue
    for f in t s c; do job $cc -std=c99 $W $isa -c "$tmp/$f.c"; done
  done
  # As C++, the front end's and (g++) the GIMPLE passes' diagnostics only, unused functions
  # and always_inline target mismatches included: the code generator's few checks ran on the
  # same code just above, as C (on the Zen 3, a g++ -c took 4.7 s, this 2.5 s; clang++ 2.2, 1.1).
  for cxx in g++ clang++; do
    command -v $cxx >/dev/null || continue
    case $cxx in g++) front="-flto -fno-fat-lto-objects";; *) front="-fsyntax-only";; esac
    for std in c++11 c++17; do
      for f in t s c; do job $cxx -std=$std $W $isa $front -c "$tmp/$f.cpp"; done
    done
  done
done
# Optimised, as users build it (-O2 finds what -O0 cannot: g++ 12 warned in its
# own AVX-512 headers there), with the widest kernel set on x86-64
opt="-O2"
case "$(uname -m)" in x86_64) opt="-O2 -mavx512f -mavx512bf16";; esac
for cc in gcc clang; do command -v $cc >/dev/null && job $cc -std=c99 $W $opt -c "$tmp/t.c"; done
for cxx in g++ clang++; do command -v $cxx >/dev/null && job $cxx -std=c++17 $W $opt -c "$tmp/t.cpp"; done
# The arena red zones of the sanitizer builds (G4_ASAN_ARENA, -fsanitize=address)
for cc in gcc clang; do
  command -v $cc >/dev/null || continue
  job $cc -std=c99 $W -fsanitize=address -DG4_ASAN_ARENA -c "$tmp/t.c"
done
for cxx in g++ clang++; do
  command -v $cxx >/dev/null || continue
  job $cxx -std=c++11 $W -fsanitize=address -DG4_ASAN_ARENA -c "$tmp/t.cpp"
done
# The AVX-512 kernels on the plain-C model of their intrinsics (tests/x86_emu.h; other_kernels.sh runs them)
for cc in gcc clang; do
  command -v $cc >/dev/null || continue
  job $cc -std=c99 $W -Wno-psabi "'-DG4_X86_EMU=\"tests/x86_emu.h\"'" -c "$tmp/t.c"
done
# The NEON kernels, cross-compiled for AArch64 where a cross compiler is present
arm=""
if command -v aarch64-linux-gnu-gcc >/dev/null; then
  for f in t s c; do job aarch64-linux-gnu-gcc -std=c99 $W -c "$tmp/$f.c"; done
  arm="/NEON (aarch64-linux-gnu-gcc)"
fi
# gemma4.h alone and static (nothing of it may go unused without gemma4_processing.h)
printf '#define GEMMA4_STATIC\n#define GEMMA4_IMPLEMENTATION\n#include "gemma4.h"\nint main(void) { return 0; }\n' > "$tmp/a.c"
for cc in gcc clang; do
  command -v $cc >/dev/null || continue
  job $cc -std=c99 $W -c "$tmp/a.c"
  job $cc -std=c99 $W -DG4_TESTING -c "$tmp/t.c" # the test suites' hooks
done
[ $n -gt 0 ] || { echo "strict_compile: no compiler found"; exit 1; }
# gemma4_processing.h without gemma4.h, or with gemma4.h's declarations but
# not its implementation, must stop at its #error
printf '#include "gemma4_processing.h"\n' > "$tmp/p1.c"
printf '#define GEMMA4_IMPLEMENTATION\n#include "gemma4_processing.h"\n' > "$tmp/p2.c"
printf '#include "gemma4.h"\n#define GEMMA4_IMPLEMENTATION\n#include "gemma4_processing.h"\n' > "$tmp/p3.c"
for p in p1 p2 p3; do
  cc=$(command -v gcc || command -v clang)
  if $cc -std=c99 -I. -c "$tmp/$p.c" -o "$tmp/$p.o" > "$tmp/$p.err" 2>&1; then
    echo "strict_compile: gemma4_processing.h compiled without gemma4.h (its implementation) first:"; cat "$tmp/$p.c"; exit 1
  fi
  grep -q 'error.*gemma4_processing.h: .*gemma4.h' "$tmp/$p.err" || { echo "strict_compile: not the #error expected:"; cat "$tmp/$p.err"; exit 1; }
done
# each line of jobs is one command; xargs exits nonzero if any of them did
tr '\n' '\0' < "$tmp/jobs" | xargs -0 -n 1 -P "$(nproc 2>/dev/null || echo 2)" sh -c
echo "strict_compile: $n clean builds (C99, C++11, C++17; gcc/clang as present; scalar/AVX2/AVX-512/AVX-512+BF16$arm/AVX-512 emulated; -O2; ASan arena red zones; gemma4.h alone; G4_TESTING; gemma4_processing.h alone refused)"
