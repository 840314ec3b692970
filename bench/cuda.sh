#!/bin/bash
# make bench-cuda: the CUDA path's decode and prefill on random E2B-shaped and
# 31B-shaped (6 of its 60 layers) bf16 checkpoints, beside the card's measured
# bandwidth and bf16 matmul peak and PyTorch eager bf16 on the same card, in
# the same run. Not a test. Needs a GPU, nvcc and (for the peer) a python with
# torch + transformers >= 5.5 (BENCH_PY, default python3).
#   BENCH_MODELS  where the checkpoints go (build/cuda_bench_models)
set -u
models=${BENCH_MODELS:-build/cuda_bench_models}
py=${BENCH_PY:-python3}
mkdir -p "$models" build
make -s build/gemma4 || exit 1
nvf=$(make -s --no-print-directory print-nvflags)
[ -f build/gemma4_cuda_bench.o ] || nvcc $nvf -c gemma4_cuda.cu -o build/gemma4_cuda_bench.o || exit 1
cc -O2 -march=native -std=c99 -Wall -Wextra -Werror -ffp-contract=off -D_POSIX_C_SOURCE=200809L -c bench/cuda_bench.c \
   -o build/cuda_bench.o && nvcc -o build/cuda_bench build/cuda_bench.o build/gemma4_cuda_bench.o -lm -lpthread || exit 1
synth() { [ -f "$models/$1/model.safetensors" ] || ./build/gemma4 synth --config "data/configs/$2" --out "$models/$1" --dtype bf16 --force ${3:-} > /dev/null; }
synth e2b gemma-4-E2B.json &
synth 31b6 gemma-4-31B.json "--layers 6" &
wait
"$py" bench/bench_torch_cuda.py none --no-model | tee build/cuda_limits.txt
bw=$(sed -n 's/^bandwidth: \([0-9.]*\).*/\1/p' build/cuda_limits.txt)
peak=$(sed -n 's/^bf16 peak: \([0-9.]*\).*/\1/p' build/cuda_limits.txt)
for m in e2b 31b6; do
    echo "== $m"
    ./build/cuda_bench "$models/$m" --modes fast,fast-bf16 --ctx ${CTX:-0,8192,32768} --bw "$bw" --peak "$peak"
    ./build/cuda_bench "$models/$m" --modes exact --ctx ${CTX_EXACT:-0,8192} --bw "$bw" --peak "$peak" | grep -v ^device
    "$py" bench/bench_torch_cuda.py "$models/$m" --ctx ${CTX:-0,8192,32768} 2>&1 | grep -E "^torch|^PyTorch|Error|error" | grep -v "^bandwidth\|^bf16"
done
