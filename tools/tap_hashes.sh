#!/bin/sh
# Prints tools/tap_hashes.c's fingerprint of every tap, logit and gradient over
# the tiny models, built against the gemma4.h of the current directory (or of
# the git revision given: tools/tap_hashes.sh main). Diff two runs: a refactor
# that claims to change no bit must print the same lines.
#     tools/tap_hashes.sh main > build/tap_before; tools/tap_hashes.sh > build/tap_after; diff build/tap_before build/tap_after
# TAP_FLAGS replaces -march=native (TAP_FLAGS=-DG4_NO_SIMD: the scalar kernels).
set -e
CC=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=.
if [ -n "$1" ]; then
  git archive "$1" | tar -x -C "$tmp"
  mkdir -p "$tmp/tools" && cp tools/tap_hashes.c "$tmp/tools/"
  src=$tmp
fi
$CC -std=c99 -Wall -Wextra -Wpedantic -Werror -ffp-contract=off -O2 ${TAP_FLAGS:--march=native} -I"$src" \
  -o "$tmp/tap_hashes" tools/tap_hashes.c -lm -lpthread
t=data/tiny
models=""
for d in $t/*/; do
  d=${d%/}
  grep -q gemma4_assistant "$d/config.json" && continue
  models="$models $d"
done
"$tmp/tap_hashes" $models data/vision/e2b_mm data/vision/31b_mm $t/e2b_drafter=$t/e2b_like $t/e2b_drafter_plain=$t/e2b_like $t/31b_drafter=$t/31b_like
