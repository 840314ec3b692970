#!/bin/bash
# The CUDA path at real shapes, on a GPU (tests/cuda_real.c): random
# checkpoints from `gemma4 synth` with the released E2B and 31B configs
# (vocab 262144, head dims 256/512; 31B cut to 6 layers to fit a disk), and a
# 10-layer E2B with a 4096 vocabulary for the long runs and 512-token chunks.
# Usage: tests/cuda_real.sh [LOGDIR] [MODELDIR]   (QUICK=1: the shorter list of tests/cuda_device.sh)
set -u
export G4_CUDA_REQUIRED=1 # here no CUDA device is a failure of tests/cuda_real.c, not a skip
out=${1:-build/cuda_real_logs}
models=${2:-build/cuda_real_models}
mkdir -p "$out" "$models" build
make -s build/gemma4 || exit 1
nvf=$(make -s --no-print-directory print-nvflags)
nvcc $nvf -DG4_TESTING -c gemma4_cuda.cu -o build/gemma4_cuda_real.o &
cc -O2 -std=c99 -Wall -Wextra -Wpedantic -Werror -ffp-contract=off -D_POSIX_C_SOURCE=200809L \
   -c tests/cuda_real.c -o build/cuda_real.o || exit 1
synth() { [ -f "$models/$1/model.safetensors" ] || ./build/gemma4 synth --config "data/configs/$2" --out "$models/$1" --dtype bf16 --force ${3:-}; }
synth e2b10 gemma-4-E2B.json "--layers 10 --vocab 4096" > /dev/null &
synth e2b gemma-4-E2B.json > /dev/null &
[ -n "${QUICK:-}" ] || synth 31b6 gemma-4-31B.json "--layers 6" > /dev/null &
wait
nvcc -o build/cuda_real build/cuda_real.o build/gemma4_cuda_real.o -lm -lpthread || exit 1
fail=0
t() { # name seconds args...
    local name=$1 secs=$2 s rc; shift 2
    s=$(date +%s)
    timeout "$secs" ./build/cuda_real "$@" > "$out/$name.txt" 2>&1; rc=$?
    echo "== $name: exit $rc in $(( $(date +%s) - s )) s"; grep -v "^ok -\|^device" "$out/$name.txt" | head -n 30
    [ $rc -eq 0 ] || fail=1
}
if [ -n "${QUICK:-}" ]; then # tests/cuda_device.sh's shorter list: at most 4 minutes of tests
    t cpu_e2b 60 cpu "$models/e2b" 24
    t threads 30 threads "$models/e2b10"
    t attn16k 30 attn "$models/e2b10" 16384
    t attn128k 60 attn "$models/e2b10" 131072
    t long 60 long "$models/e2b10" 16384
    exit $fail
fi
t cpu_e2b10 90 cpu "$models/e2b10" 520
t cpu_e2b 60 cpu "$models/e2b" 24
t cpu_31b6 60 cpu "$models/31b6" 24
t limits 30 limits "$models/e2b"
t threads 30 threads "$models/e2b10"
t attn16k 30 attn "$models/e2b10" 16384
t attn128k 60 attn "$models/e2b10" 131072
t long 60 long "$models/e2b10" 16384
t longfast 90 longfast "$models/e2b10" 102400
exit $fail
