# gemma4.h - build, demo and tests.  `make` builds build/gemma4, `make run`
# shows the plan and logits of a tiny model, `make test` runs everything CI runs.
CC      ?= cc
CFLAGS  ?= -O2 -march=native
WARN     = -std=c99 -Wall -Wextra -Wpedantic -Werror
SAN      = -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
LDLIBS   = -lm -lpthread
DEMO     = data/tiny/e2b_like

.PHONY: all run test unit sanitize strict bench test-arm64 clean

all: build/gemma4

build/gemma4: examples/gemma4.c examples/compare.h examples/bench.h gemma4.h | build
	$(CC) $(WARN) $(CFLAGS) -o $@ examples/gemma4.c $(LDLIBS)

build/minimal: examples/minimal.c gemma4.h | build
	$(CC) $(WARN) $(CFLAGS) -o $@ examples/minimal.c $(LDLIBS)

build/test_gemma4: tests/test_gemma4.c examples/compare.h gemma4.h | build
	$(CC) $(WARN) $(CFLAGS) -g -o $@ tests/test_gemma4.c $(LDLIBS)

build/test_gemma4_san: tests/test_gemma4.c examples/compare.h gemma4.h | build
	$(CC) $(WARN) $(SAN) -o $@ tests/test_gemma4.c $(LDLIBS)

build/test_tokenizer: tests/test_tokenizer.c gemma4.h | build
	$(CC) $(WARN) $(CFLAGS) -g -o $@ tests/test_tokenizer.c $(LDLIBS)

build/test_tokenizer_san: tests/test_tokenizer.c gemma4.h | build
	$(CC) $(WARN) $(SAN) -o $@ tests/test_tokenizer.c $(LDLIBS)

build:
	mkdir -p build

# The demo: the KV-sharing plan of a tiny E2B-shaped model, then its logits.
run: build/gemma4
	./build/gemma4 info $(DEMO)
	./build/gemma4 logits $(DEMO) --ids 2,81,101,77,5 --out build/demo_logits.bin
	./build/gemma4 greedy $(DEMO) --ids 2,81,101 --new 8

# The header must compile clean as C99 and C++ under gcc and clang.
strict: | build
	sh tests/strict_compile.sh

unit: build/gemma4 build/test_gemma4 build/test_tokenizer
	./build/test_gemma4
	./build/test_tokenizer

sanitize: build/gemma4 build/test_gemma4_san build/test_tokenizer_san
	./build/test_gemma4_san
	./build/test_tokenizer_san

test: strict build/gemma4 build/minimal build/test_gemma4 build/test_gemma4_san build/test_tokenizer build/test_tokenizer_san
	@echo "== README example"
	./build/minimal $(DEMO)
	@echo "== tokenizer, chat, sampler and generate tests under AddressSanitizer + UndefinedBehaviorSanitizer"
	./build/test_tokenizer_san > build/sanitize_tokenizer.log 2>&1 || { cat build/sanitize_tokenizer.log; exit 1; }
	@tail -n 1 build/sanitize_tokenizer.log
	@echo "== tokenizer, chat, sampler and generate tests"
	./build/test_tokenizer
	@echo "== tests under AddressSanitizer + UndefinedBehaviorSanitizer"
	./build/test_gemma4_san > build/sanitize.log 2>&1 || { cat build/sanitize.log; exit 1; }
	@tail -n 1 build/sanitize.log
	@echo "== tests"
	./build/test_gemma4

build/membw: bench/membw.c | build
	$(CC) -O2 -march=native -o $@ bench/membw.c -lpthread

build/fmapeak: bench/fmapeak.c | build
	$(CC) -O2 -march=native -o $@ bench/fmapeak.c -lpthread

# The NEON kernels: the suite cross-built for AArch64 and run under qemu-user
# (needs gcc-aarch64-linux-gnu and qemu-user; .ci/run installs them).
test-arm64: build/gemma4 | build
	aarch64-linux-gnu-gcc $(WARN) -O2 -static -o build/test_gemma4_arm64 tests/test_gemma4.c $(LDLIBS)
	qemu-aarch64 ./build/test_gemma4_arm64

# Not a test: speed on an E2B-shaped random checkpoint vs the machine and peers (bench/run.sh).
bench: build/gemma4 build/membw build/fmapeak
	sh bench/run.sh

clean:
	rm -rf build
