#!/bin/sh
# Sets up the peers `make bench` compares against, from this machine's package
# registries only (PyPI), under build/peers/:
#   - a venv with torch 2.15.0 + transformers 5.23.0 (PyTorch eager);
#   - llama.cpp built from source: the sources vendored in the llama-cpp-python
#     0.3.36 sdist, llama-bench built with cmake (-DGGML_NATIVE=ON);
#   - the benchmark checkpoint converted to GGUF bf16 with llama.cpp's own
#     convert_hf_to_gguf.py. The converter needs a tokenizer: the full Gemma 3
#     tokenizer (data/external/gemma3-tokenizer/, see README) is used, trimmed
#     to the model's 262144 ids; TOKENIZER_DIR names another folder.
# Then:  BENCH_PY=build/peers/venv/bin/python LLAMA_BENCH=build/peers/llama-bench \
#        BENCH_GGUF=build/peers/model-bf16.gguf make bench
set -e
DIR=${BENCH_DIR:-build/bench-model}
P=build/peers
TOK=${TOKENIZER_DIR:-data/external/gemma3-tokenizer}
mkdir -p $P
[ -x $P/venv/bin/python ] || python3 -m venv $P/venv
$P/venv/bin/pip install -q torch==2.15.0 transformers==5.23.0 safetensors numpy sentencepiece scikit-build-core
if [ ! -x $P/llama-bench ]; then
  $P/venv/bin/pip download -q --no-deps --no-binary :all: --no-build-isolation llama-cpp-python==0.3.36 -d $P
  tar xzf $P/llama_cpp_python-0.3.36.tar.gz -C $P
  L=$P/llama_cpp_python-0.3.36/vendor/llama.cpp
  cmake -S $L -B $L/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
  cmake --build $L/build --target llama-bench -j"$(nproc)"
  ln -sf "$(pwd)/$L/build/bin/llama-bench" $P/llama-bench
  $P/venv/bin/pip install -q "$L/gguf-py"
fi
if [ ! -f $P/model-bf16.gguf ]; then
  [ -f "$DIR/model.safetensors" ] || { echo "peers.sh: run make bench once first (it writes $DIR)"; exit 1; }
  $P/venv/bin/python - "$TOK" "$DIR" <<'PY'
import json, sys
src, dst = sys.argv[1], sys.argv[2]
V = json.load(open(dst + "/config.json"))["vocab_size"]
t = json.load(open(src + "/tokenizer.json"))
t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < V]
t["model"]["vocab"] = {k: i for k, i in t["model"]["vocab"].items() if i < V}
json.dump(t, open(dst + "/tokenizer.json", "w"), ensure_ascii=False)
c = json.load(open(src + "/tokenizer_config.json"))
c["added_tokens_decoder"] = {k: v for k, v in c.get("added_tokens_decoder", {}).items() if int(k) < V}
c.pop("image_token", None)  # <image_soft_token> is id 262144: transformers would add it back
c.get("extra_special_tokens", {}).pop("image_token", None)
json.dump(c, open(dst + "/tokenizer_config.json", "w"), ensure_ascii=False)
PY
  $P/venv/bin/python $P/llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py "$DIR" --outtype bf16 --outfile $P/model-bf16.gguf
fi
echo "peers ready: BENCH_PY=$P/venv/bin/python LLAMA_BENCH=$P/llama-bench BENCH_GGUF=$P/model-bf16.gguf"
