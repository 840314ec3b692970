#!/bin/sh
# Where prefill's time goes (bench/split.c): the matmuls against the rest, per
# run, on a checkpoint (gemma4 synth makes one). Not a test.
#   sh bench/split.sh MODEL_DIR THREADS TOKENS [RUNS]
set -e
mkdir -p build
python3 bench/split.py gemma4.h build/gemma4_split.h
${CC:-cc} ${CFLAGS:--O2 -march=native} -Ibuild -o build/split bench/split.c -lm -lpthread
./build/split "$@"
