#!/bin/sh
# Sets up the peers `make bench` compares against, from this machine's package
# registries only (PyPI), under build/peers/:
#   - a venv with torch 2.15.0 + transformers 5.23.0 (PyTorch eager);
#   - llama.cpp built from source: the sources vendored in the llama-cpp-python
#     0.3.36 sdist (llama.cpp commit 0c1e57098, per the sdist's CHANGELOG), only
#     llama-bench and what it links (static, -DGGML_NATIVE=ON, Release);
#   - the benchmark checkpoint converted to GGUF bf16 with that llama.cpp's own
#     convert_hf_to_gguf.py. The converter needs a tokenizer: the full Gemma 3
#     tokenizer (data/external/gemma3-tokenizer/, see docs/text.md) is used, trimmed
#     to the model's vocab_size; TOKENIZER_DIR names another folder;
#   - a check that the GGUF is the same model: bench/llama_logits.cpp runs a
#     prompt through llama.cpp and bench/peers_check.py compares its logits
#     with gemma4.h's on the same ids, against the model's own float32-to-bf16
#     gap (gemma4.h's float32 run against its bf16-faithful one, measured here).
# JOBS sets the build's parallelism (default: all CPUs). On a shared machine:
#   JOBS=2 nice -n 15 sh bench/peers.sh
# Run it with the same BENCH_DIR / BENCH_LAYERS / BENCH_VOCAB as make bench;
# it writes the checkpoint if it is not there yet. Then:
#   BENCH_PY=build/peers/venv/bin/python LLAMA_BENCH=build/peers/llama-bench \
#   BENCH_GGUF=build/peers/model-bf16.gguf make bench
set -e
CONFIG=${BENCH_CONFIG:-data/configs/gemma-4-E2B.json}
DIR=${BENCH_DIR:-build/bench-model}
P=build/peers
TOK=${TOKENIZER_DIR:-data/external/gemma3-tokenizer}
JOBS=${JOBS:-$(nproc)}
V=0.3.36
LLAMA_COMMIT=0c1e57098
L=$P/llama_cpp_python-$V/vendor/llama.cpp
mkdir -p $P
[ -f "$TOK/tokenizer.json" ] && [ -f "$TOK/tokenizer_config.json" ] || {
  echo "peers.sh: no tokenizer.json + tokenizer_config.json in $TOK (see docs/text.md; or set TOKENIZER_DIR)"; exit 1; }
[ -x $P/venv/bin/python ] || python3 -m venv $P/venv
$P/venv/bin/pip install -q torch==2.15.0 transformers==5.23.0 safetensors numpy sentencepiece scikit-build-core

# llama.cpp: llama-bench and the check program, nothing else (no server, tools, tests, examples)
if [ ! -x $P/llama-bench ] || [ ! -x $P/llama_logits ]; then
  [ -f $P/llama_cpp_python-$V.tar.gz ] ||
    $P/venv/bin/pip download -q --no-deps --no-binary :all: --no-build-isolation llama-cpp-python==$V -d $P
  [ -f $L/CMakeLists.txt ] || tar xzf $P/llama_cpp_python-$V.tar.gz -C $P
  cmake -S $L -B $L/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_COMMIT=$LLAMA_COMMIT -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF > $P/cmake.log
  cmake --build $L/build --target llama-bench -j"$JOBS"
  cp $L/build/bin/llama-bench $P/llama-bench
  c++ -O2 -std=c++17 -I$L/include -I$L/ggml/include bench/llama_logits.cpp -o $P/llama_logits \
    $L/build/src/libllama.a $L/build/ggml/src/libggml.a $L/build/ggml/src/libggml-cpu.a \
    $L/build/ggml/src/libggml-base.a -fopenmp -lpthread -ldl -lm
fi

if [ ! -f "$DIR/model.safetensors" ]; then
  opts=""
  [ -n "$BENCH_LAYERS" ] && opts="$opts --layers $BENCH_LAYERS"
  [ -n "$BENCH_VOCAB" ] && opts="$opts --vocab $BENCH_VOCAB"
  make build/gemma4
  ./build/gemma4 synth --config "$CONFIG" --out "$DIR" --dtype bf16 --force $opts
fi
if [ ! -f $P/model-bf16.gguf ] || [ $P/model-bf16.gguf -ot "$DIR/model.safetensors" ]; then
  $P/venv/bin/python - "$TOK" "$DIR" <<'PY'
import json, sys
src, dst = sys.argv[1], sys.argv[2]
V = json.load(open(dst + "/config.json"))["vocab_size"]
t = json.load(open(src + "/tokenizer.json"))
full_vocab, full_added = t["model"]["vocab"], t["added_tokens"]
t["added_tokens"] = [a for a in full_added if a["id"] < V]
vocab = t["model"]["vocab"] = {k: i for k, i in full_vocab.items() if i < V}
# a merge whose parts or result lie past V: BPE refuses it ("Token `X` out of vocabulary")
t["model"]["merges"] = [m for m in t["model"]["merges"]
                        for a, b in [m.split(" ", 1) if isinstance(m, str) else m]
                        if a in vocab and b in vocab and a + b in vocab]
json.dump(t, open(dst + "/tokenizer.json", "w"), ensure_ascii=False)
c = json.load(open(src + "/tokenizer_config.json"))
c["added_tokens_decoder"] = {k: v for k, v in c.get("added_tokens_decoder", {}).items() if int(k) < V}
# special tokens named by a key (image_token: id 262144, boi_token, eoi_token, ...) past V or absent:
# transformers would add them back as new ids, and the GGUF's vocabulary would outgrow the model's
ids = dict(full_vocab, **{a["content"]: a["id"] for a in full_added})
for d in (c, c.get("extra_special_tokens", {})):
    for k in [k for k, v in d.items() if isinstance(v, str) and ids.get(v, V) >= V]:
        del d[k]
json.dump(c, open(dst + "/tokenizer_config.json", "w"), ensure_ascii=False)
PY
  $P/venv/bin/python $L/convert_hf_to_gguf.py "$DIR" --outtype bf16 --outfile $P/model-bf16.gguf.tmp
  mv $P/model-bf16.gguf.tmp $P/model-bf16.gguf
fi

# the same model? llama.cpp's logits against gemma4.h's on one prompt of ids
make build/gemma4
IDS=2,818,1010,4096,17,3000,25000,123,9999,31000,5,77
./build/gemma4 logits "$DIR" --ids $IDS --out $P/check-g4.f32 > /dev/null
./build/gemma4 logits "$DIR" --ids $IDS --out $P/check-g4-bf16.f32 --bf16 > /dev/null
$P/llama_logits $P/model-bf16.gguf $IDS 0 $P/check-llama.f32 > /dev/null 2> $P/check-llama.log ||
  { tail -5 $P/check-llama.log; exit 1; }
python3 bench/peers_check.py "$DIR/config.json" $P/check-g4.f32 $P/check-llama.f32 $P/check-g4-bf16.f32
echo "peers ready: BENCH_PY=$P/venv/bin/python LLAMA_BENCH=$P/llama-bench BENCH_GGUF=$P/model-bf16.gguf"
