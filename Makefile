# gemma4.h - build, demo and tests.  `make` builds build/gemma4, `make run`
# shows the plan and logits of a tiny model, `make test` runs every test suite
# and the strict compiles. CI (.ci/run) also runs make fuzz, tsan, valgrind,
# test-arm64 and, where nvcc is, cuda.
CC      ?= cc
CFLAGS  ?= -O2 -march=native
# the test builds' debug information: line tables only (-g1), enough for file:line in
# ASan, UBSan and valgrind reports and in gdb backtraces; -g's variable locations
# (var-tracking) took about a quarter of each build (test_bad_inputs_san 34 -> 25 s,
# test_bad_inputs 22 -> 16 s, gcc 12, Zen 3). make DEBUG=-g for a debugging session.
DEBUG    = -g1
WARN     = -std=c99 -Wall -Wextra -Wpedantic -Werror -ffp-contract=off
SAN      = -O1 $(DEBUG) -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -DG4_ASAN_ARENA
LDLIBS   = -lm -lpthread
# The test builds compile the library static (GEMMA4_STATIC): a suite's single translation
# unit then drops the API functions it never calls before optimizing them, where extern
# ones were compiled into every binary (on the Zen 3: test_cli_san 17 -> 3 s, test_template_san
# 21 -> 9 s). Same code, same bits; make strict compiles the extern and the static forms.
TEST_DEFS = -DGEMMA4_STATIC
IMG_LIBS = -lpng -ljpeg   # libpng-dev, libjpeg62-turbo-dev: the CLI's and test_vision's image decoders
DEMO     = data/tiny/e2b_like

.PHONY: all run test test-python test-python-san test-python-torch test-builds unit sanitize strict bench bench-smoke test-arm64 clean fuzz valgrind tsan cuda test-cuda test-cuda-emu sanitize-cuda-emu test-cuda-device bench-cuda print-nvflags

all: build/gemma4

build/gemma4: examples/gemma4.c examples/args.h examples/compare.h examples/bench.h examples/bench_bytes.h examples/train.h examples/image.h examples/mm.h gemma4.h gemma4_processing.h | build
	$(CC) $(WARN) $(CFLAGS) -o $@ examples/gemma4.c $(LDLIBS) $(IMG_LIBS)

build/minimal: examples/minimal.c gemma4.h | build
	$(CC) $(WARN) $(CFLAGS) -I. -o $@ examples/minimal.c $(LDLIBS)

# The suites: tests/test_X.c builds as build/test_X (-O2 -g1) and as build/test_X_san
# (ASan + UBSan) by the two pattern rules; each suite's extra headers, and the CLI it
# runs, are prerequisite lines of their own below. XFLAGS: extra flags of a suite
# ($(strip): no double space where it is empty).
G4_HEADERS = gemma4.h gemma4_processing.h
build/test_%: tests/test_%.c tests/harness.h $(G4_HEADERS) | build
	$(strip $(CC) $(WARN) $(CFLAGS) $(DEBUG) $(TEST_DEFS) $(XFLAGS) -o $@ $< $(LDLIBS))

build/test_%_san: tests/test_%.c tests/harness.h $(G4_HEADERS) | build
	$(strip $(CC) $(WARN) $(SAN) $(TEST_DEFS) $(XFLAGS) -o $@ $< $(LDLIBS))

# A suite that runs the CLI has it as an order-only prerequisite, so that
# `make build/test_X && ./build/test_X` runs a CLI as new as the header, and a
# newer CLI does not relink the suite: build/gemma4 (test_gemma4 and its _san
# build run it by name; the others default to it), and for a _san suite that
# takes the CLI's path also build/gemma4_san, the path make passes it.
build/test_gemma4 build/test_gemma4_san: tests/fixtures.h tests/invariants.h examples/compare.h | build/gemma4
build/test_drafter: tests/fixtures.h examples/compare.h | build/gemma4
build/test_drafter_san: tests/fixtures.h examples/compare.h | build/gemma4_san
# The training reference: backward ops, gradients against torch autograd (data/tiny/*/grad_golden.safetensors).
# Its CLI cases run build/gemma4 (build/gemma4_san under the sanitizers): the path is argv[2].
build/test_train: tests/fixtures.h | build/gemma4
build/test_train_san: tests/fixtures.h | build/gemma4_san
# PEFT LoRA adapters: binding, forward and greedy against transformers + peft (data/lora/).
build/test_lora: tests/fixtures.h examples/compare.h | build/gemma4
build/test_lora_san: tests/fixtures.h examples/compare.h | build/gemma4 build/gemma4_san
# The 12B unified model's config, embedders and merge against transformers (data/tiny/unified_*).
build/test_unified build/test_unified_san: tests/fixtures.h
build/test_unified: | build/gemma4
build/test_unified_san: | build/gemma4_san
# The bad-input catalogue (tests/test_bad_inputs.c) drives the CLI too:
# build/gemma4 in the plain run, build/gemma4_san under the sanitizers.
build/test_bad_inputs: | build/gemma4
build/test_bad_inputs_san: | build/gemma4 build/gemma4_san
# The command line as a daily tool (tests/test_cli.c): help, errors, --threads, statuses,
# progress; it runs build/gemma4 (build/gemma4_san under the sanitizers), and make bench's
# script on a tiny model (build/membw, build/fmapeak: its smoke form, a check that it exits 0).
build/test_cli: | build/gemma4 build/membw build/fmapeak
build/test_cli_san: | build/gemma4 build/gemma4_san build/membw build/fmapeak
# Chat templates: the goldens through the API and the CLI (build/gemma4, or
# build/gemma4_san under the sanitizers).
build/test_template: | build/gemma4
build/test_template_san: | build/gemma4 build/gemma4_san
# The audio tower and feature extractor against transformers (data/tiny/e2b_audio);
# the vision tower and the merge (data/vision).
build/test_audio build/test_audio_san build/test_vision build/test_vision_san: tests/fixtures.h
build/test_audio build/test_audio_scalar: | build/gemma4
build/test_audio_san: | build/gemma4_san
# Two sessions on one model from two threads (-pthread only here and in test_vision).
build/test_threads build/test_threads_san build/test_vision build/test_vision_san: XFLAGS = -pthread
# test_vision also runs the CLI's image decoders (examples/image.h: libpng, libjpeg)
build/test_vision build/test_vision_san: examples/image.h
build/test_vision build/test_vision_san: LDLIBS += $(IMG_LIBS)
build/test_vision: | build/gemma4
build/test_vision_san: | build/gemma4_san
# Images and audio together through the CLI (tests/test_mm.c, data/mm): repeatable --image/--audio,
# chat items, the processor's ids; it decodes images itself too (examples/image.h).
build/test_mm build/test_mm_san: tests/fixtures.h examples/image.h
build/test_mm build/test_mm_san: LDLIBS += $(IMG_LIBS)
build/test_mm: | build/gemma4
build/test_mm_san: | build/gemma4_san

build/gemma4_san: examples/gemma4.c examples/args.h examples/compare.h examples/bench.h examples/bench_bytes.h examples/train.h examples/image.h examples/mm.h gemma4.h gemma4_processing.h | build
	$(CC) $(WARN) $(SAN) -o $@ examples/gemma4.c $(LDLIBS) $(IMG_LIBS)

# the audio suite again on the scalar reference kernels (the tower's matmuls are g4__matmul_ref there)
build/test_audio_scalar: tests/test_audio.c tests/harness.h tests/fixtures.h $(G4_HEADERS) | build
	$(CC) $(WARN) -O2 -DG4_NO_SIMD $(DEBUG) $(TEST_DEFS) -o $@ tests/test_audio.c $(LDLIBS)

build/test_threads_tsan: tests/test_threads.c tests/harness.h gemma4.h | build
	$(CC) $(WARN) -O1 $(DEBUG) -fsanitize=thread -pthread $(TEST_DEFS) -o $@ tests/test_threads.c $(LDLIBS)

# The other kernels this CPU can run, and the AVX-512 ones on the plain-C model of
# their intrinsics (tests/x86_emu.h: no -m flags, -Wno-psabi: see x86_emu.h), for
# tests/other_kernels.sh and tests/san_avx2.sh, which run them (make test builds them
# with the rest, one job per CPU). The emulated CLI's arena sizes follow the kernels,
# so the emulated test_train and test_lora run build/gemma4_emu.
# They build at -O1 (EMU_OPT): the emulated intrinsics are C loops that -O2 took twice
# as long to compile (test_train_emu 24 -> 11 s on the Zen 3) for 20% less run time (6.2 -> 5.1 s).
X86_EMU    = -Wno-psabi -DG4_X86_EMU='"tests/x86_emu.h"'
EMU_OPT    = -O1
AVX2_FLAGS = -mavx2 -mfma -mf16c
HAS_AVX2  := $(shell [ "$$(uname -m)" = x86_64 ] && grep -q ' avx2 ' /proc/cpuinfo && grep -q ' fma ' /proc/cpuinfo && echo 1)
G4_SUITE_DEPS = tests/harness.h tests/fixtures.h tests/invariants.h examples/compare.h gemma4.h

build/test_gemma4_scalar: tests/test_gemma4.c $(G4_SUITE_DEPS) | build build/gemma4
	$(CC) $(WARN) -O2 -DG4_NO_SIMD $(DEBUG) $(TEST_DEFS) -o $@ tests/test_gemma4.c $(LDLIBS)

build/test_gemma4_avx2: tests/test_gemma4.c $(G4_SUITE_DEPS) | build build/gemma4
	$(CC) $(WARN) -O2 $(AVX2_FLAGS) $(DEBUG) $(TEST_DEFS) -o $@ tests/test_gemma4.c $(LDLIBS)

build/test_gemma4_emu: tests/test_gemma4.c $(G4_SUITE_DEPS) tests/x86_emu.h | build build/gemma4
	$(CC) $(WARN) $(EMU_OPT) $(X86_EMU) $(DEBUG) $(TEST_DEFS) -o $@ tests/test_gemma4.c $(LDLIBS)

build/gemma4_emu: examples/gemma4.c examples/args.h examples/compare.h examples/bench.h examples/bench_bytes.h examples/train.h examples/image.h examples/mm.h gemma4.h gemma4_processing.h tests/x86_emu.h | build
	$(CC) $(WARN) $(EMU_OPT) $(X86_EMU) -o $@ examples/gemma4.c $(LDLIBS) $(IMG_LIBS)

build/test_train_emu: tests/test_train.c tests/harness.h tests/fixtures.h gemma4.h tests/x86_emu.h | build build/gemma4_emu
	$(CC) $(WARN) $(EMU_OPT) $(X86_EMU) $(TEST_DEFS) -o $@ tests/test_train.c $(LDLIBS)

build/test_lora_emu: tests/test_lora.c tests/harness.h tests/fixtures.h examples/compare.h gemma4.h tests/x86_emu.h | build build/gemma4_emu
	$(CC) $(WARN) $(EMU_OPT) $(X86_EMU) $(TEST_DEFS) -o $@ tests/test_lora.c $(LDLIBS)

build/test_gemma4_san_emu: tests/test_gemma4.c $(G4_SUITE_DEPS) tests/x86_emu.h | build build/gemma4
	$(CC) $(WARN) $(SAN) $(X86_EMU) $(TEST_DEFS) -pthread -o $@ tests/test_gemma4.c $(LDLIBS)

build/test_gemma4_san_avx2: tests/test_gemma4.c $(G4_SUITE_DEPS) | build build/gemma4
	$(CC) $(WARN) $(SAN) $(AVX2_FLAGS) $(TEST_DEFS) -pthread -o $@ tests/test_gemma4.c $(LDLIBS)

build/test_threads_san_avx2: tests/test_threads.c tests/harness.h gemma4.h | build
	$(CC) $(WARN) $(SAN) $(AVX2_FLAGS) $(TEST_DEFS) -pthread -o $@ tests/test_threads.c $(LDLIBS)

build/test_train_san_avx2: tests/test_train.c tests/harness.h tests/fixtures.h gemma4.h | build build/gemma4
	$(CC) $(WARN) $(SAN) $(AVX2_FLAGS) $(TEST_DEFS) -o $@ tests/test_train.c $(LDLIBS)

build/test_lora_san_avx2: tests/test_lora.c tests/harness.h tests/fixtures.h examples/compare.h gemma4.h | build build/gemma4
	$(CC) $(WARN) $(SAN) $(AVX2_FLAGS) $(TEST_DEFS) -pthread -o $@ tests/test_lora.c $(LDLIBS)

OTHER_KERNELS = build/test_gemma4_scalar build/test_gemma4_emu build/gemma4_emu build/test_train_emu build/test_lora_emu \
                $(if $(HAS_AVX2),build/test_gemma4_avx2)
SAN_SIMD      = build/test_gemma4_san_emu $(if $(HAS_AVX2),build/test_gemma4_san_avx2 build/test_threads_san_avx2 build/test_train_san_avx2 build/test_lora_san_avx2)

# libFuzzer harnesses (clang): make fuzz FUZZ_SECONDS=60 runs each in turn.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZERS       = json safetensors index template adapter tokenizer wav image
FUZZ_FLAGS    = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

build/fuzz_%: tests/fuzz/fuzz_%.c gemma4.h gemma4_processing.h | build
	$(FUZZ_CC) $(FUZZ_FLAGS) $(TEST_DEFS) -o $@ $< $(LDLIBS)

build:
	mkdir -p build

# --- CUDA (gemma4_cuda.cu; see docs/cuda.md) -------------------------------
NVCC      ?= nvcc
CXX       ?= c++
# sm_80 and sm_90 machine code, and compute_90 PTX that the driver compiles
# for newer GPUs (sm_100, sm_120, ...) at load time.
CUDA_ARCH  = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVFLAGS    = -O2 -std=c++17 -fmad=false $(CUDA_ARCH) -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror
# The emulated build: the same .cu as host C++ against tests/cuda_emu.h, with
# small blocks and grids (fibers are slow; every kernel strides, so any size
# computes the same) and no FMA contraction (the kernels ask for none); the
# fast mode's blocks hold two warps and its splits are small, so the tiny
# models take split-K, several KV splits and several key tiles per split.
EMUFLAGS   = -std=c++17 -O2 $(DEBUG) -Wall -Wextra -Werror -ffp-contract=off -DG4_CUDA_EMULATE \
             -DG4C_THREADS=32 -DG4C_MAX_BLOCKS=3 -DG4C_TILE=8 -include tests/cuda_emu.h \
             -DG4F_THREADS=64 -DG4F_NARROW=1000000 -DG4F_SPLIT_IN=64 -DG4F_KV_SPLIT=4 -DG4F_KEYS=4 $(CUDA_TESTING)
# The suite's builds of gemma4_cuda.cu define G4_TESTING as tests/test_cuda.c
# does (its g4__cuda_session_*_testing hooks); a library build does not.
CUDA_TESTING = -DG4_TESTING

# Compiles for sm_80 and sm_90, warnings as errors, and prints every kernel's
# registers, stack and spills (ptxas -v).
cuda: gemma4_cuda.cu gemma4.h | build
	$(NVCC) $(NVFLAGS) -Xptxas -v -c gemma4_cuda.cu -o build/gemma4_cuda.o 2> build/ptxas.log || { cat build/ptxas.log; exit 1; }
	@awk '/Compiling entry function/ { match($$0, /_Z[0-9]+/); n = substr($$0, RSTART + 2, RLENGTH - 2) + 0; \
	      k = substr($$0, RSTART + RLENGTH, n); match($$0, /sm_[0-9]+/); arch = substr($$0, RSTART, RLENGTH) } \
	      /bytes stack frame/ { st = $$0; sub(/^ +/, "", st) } \
	      /Used [0-9]+ registers/ { match($$0, /Used [0-9]+ registers/); \
	        printf "%-18s %s  %s; %s\n", k, arch, substr($$0, RSTART, RLENGTH), st }' build/ptxas.log
	@echo "cuda: build/gemma4_cuda.o for sm_80 and sm_90 (+ compute_90 PTX), no warnings"

build/gemma4_cuda_emu.o: gemma4_cuda.cu gemma4.h tests/cuda_emu.h | build
	$(CXX) $(EMUFLAGS) -x c++ -c gemma4_cuda.cu -o $@

build/test_cuda_emu: tests/test_cuda.c tests/harness.h tests/fixtures.h tests/invariants.h build/gemma4_cuda_emu.o gemma4.h | build
	$(CC) $(WARN) $(CFLAGS) $(DEBUG) $(TEST_DEFS) -DG4_CUDA_EMULATE -c tests/test_cuda.c -o build/test_cuda_emu.o
	$(CXX) -o $@ build/test_cuda_emu.o build/gemma4_cuda_emu.o $(LDLIBS)

build/gemma4_cuda_emu_san.o: gemma4_cuda.cu gemma4.h tests/cuda_emu.h | build
	$(CXX) $(EMUFLAGS) $(SAN) -x c++ -c gemma4_cuda.cu -o $@

build/test_cuda_emu_san: tests/test_cuda.c tests/harness.h tests/fixtures.h tests/invariants.h build/gemma4_cuda_emu_san.o gemma4.h | build
	$(CC) $(WARN) $(SAN) $(TEST_DEFS) -DG4_CUDA_EMULATE -c tests/test_cuda.c -o build/test_cuda_emu_san.o
	$(CXX) $(SAN) -o $@ build/test_cuda_emu_san.o build/gemma4_cuda_emu_san.o $(LDLIBS)

# The CUDA path's tests through its own kernels, emulated on the host (no GPU,
# no nvcc: g++ alone); sanitize-cuda-emu runs them under ASan + UBSan.
test-cuda-emu: build/test_cuda_emu
	./build/test_cuda_emu

sanitize-cuda-emu: build/test_cuda_emu_san
	./build/test_cuda_emu_san

build/test_cuda: tests/test_cuda.c tests/harness.h tests/fixtures.h tests/invariants.h gemma4_cuda.cu gemma4.h | build
	$(NVCC) $(NVFLAGS) $(NVDEFS) $(CUDA_TESTING) -c gemma4_cuda.cu -o build/gemma4_cuda_test.o
	$(CC) $(WARN) $(CFLAGS) $(DEBUG) -c tests/test_cuda.c -o build/test_cuda.o
	$(NVCC) -o $@ build/test_cuda.o build/gemma4_cuda_test.o $(LDLIBS)

print-nvflags:
	@echo $(NVFLAGS)

# The same tests on a real GPU; says so plainly when there is none.
test-cuda:
	@if command -v $(NVCC) >/dev/null; then $(MAKE) build/test_cuda && ./build/test_cuda; \
	else echo "test-cuda: no nvcc here, nothing built or run (make test-cuda-emu runs the emulated tests)"; fi

# The demo: the KV-sharing plan of a tiny E2B-shaped model, then its logits.
run: build/gemma4
	./build/gemma4 info $(DEMO)
	./build/gemma4 logits $(DEMO) --ids 2,81,101,77,5 --out build/demo_logits.bin
	./build/gemma4 greedy $(DEMO) --ids 2,81,101 --new 8

# The header must compile clean as C99 and C++ under gcc and clang.
strict: | build
	sh tests/strict_compile.sh

unit: build/gemma4 build/test_gemma4 build/test_tokenizer build/test_bad_inputs build/test_threads build/test_train build/test_drafter build/test_lora \
      build/test_template build/test_audio build/test_cli build/test_unified build/test_mm
	./build/test_gemma4
	./build/test_train data build/gemma4
	./build/test_drafter data build/gemma4
	./build/test_lora data build/gemma4
	./build/test_tokenizer
	./build/test_template data build/gemma4
	./build/test_bad_inputs data build/gemma4
	./build/test_cli data build/gemma4
	./build/test_threads
	./build/test_audio build/gemma4
	./build/test_unified data build/gemma4
	./build/test_mm data build/gemma4

sanitize: build/gemma4 build/gemma4_san build/test_gemma4_san build/test_bad_inputs_san build/test_threads_san build/test_tokenizer_san build/test_train_san build/test_drafter_san build/test_lora_san \
          build/test_template_san build/test_audio_san build/test_cli_san build/test_unified_san build/test_mm_san
	./build/test_gemma4_san
	./build/test_train_san data build/gemma4_san
	./build/test_drafter_san data build/gemma4_san
	./build/test_template_san data build/gemma4_san
	./build/test_lora_san data build/gemma4_san
	./build/test_bad_inputs_san data build/gemma4_san
	./build/test_cli_san data build/gemma4_san
	./build/test_threads_san
	./build/test_tokenizer_san
	./build/test_audio_san build/gemma4_san
	./build/test_unified_san data build/gemma4_san
	./build/test_mm_san data build/gemma4_san
	sh tests/san_avx2.sh "$(CC)" "$(WARN)" "$(SAN)"

fuzz: $(FUZZERS:%=build/fuzz_%)
	sh tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZERS)

# Memcheck on one golden test (the threads test: golden logits, then two threads).
# Built for the baseline ISA: valgrind 3.19 cannot run AVX-512.
build/test_threads_vg: tests/test_threads.c tests/harness.h gemma4.h | build
	$(CC) $(WARN) -O1 $(DEBUG) -pthread $(TEST_DEFS) -o $@ tests/test_threads.c $(LDLIBS)

valgrind: build/test_threads_vg
	valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect ./build/test_threads_vg

tsan: build/test_threads_tsan
	TSAN_OPTIONS=halt_on_error=1 ./build/test_threads_tsan

# $(call log_run,LOG,COMMAND): runs COMMAND with its output in build/LOG and its wall time in
# build/LOG.time; on failure prints the log and stops. make test runs every suite so, as the
# target suite-LOG (one job per CPU, a suite as soon as its binaries are built), then shows
# the logs in the order below. A suite's log goes in SUITE_LOGS, whose "N passed, M failed"
# lines make the closing total.
define log_run
	@t0=$$(date +%s); $(2) > build/$(1) 2>&1 || { cat build/$(1); echo "make test: $(1) failed"; exit 1; }; \
	  echo $$(( $$(date +%s) - t0 )) > build/$(1).time
endef

SUITE_LOGS = tokenizer_san.log tokenizer.log template_san.log template.log cuda_emu.log cuda_emu_san.log \
             gemma4_san.log bad_inputs_san.log threads_san.log san_avx2.log drafter_san.log drafter.log threads.log \
             train.log train_san.log lora.log lora_san.log bad_inputs.log cli.log cli_san.log tests.log kernels.log audio.log audio_san.log python.log \
             vision.log vision_san.log unified.log unified_san.log mm.log mm_san.log

# $(eval $(call suite,NAME,PREREQUISITES,COMMAND)) makes the target suite-NAME.log, which runs
# COMMAND through log_run (its output in build/NAME.log). A variable in COMMAND is written $$(VAR),
# so that it is expanded when the suite runs, as in any recipe (SAN's value holds commas, which
# log_run would otherwise take for argument separators). make test lists the longest suites
# first so that they start first.
define suite
suite-$(1).log: $(2)
	$$(call log_run,$(1).log,$(3))
endef
$(eval $(call suite,minimal,build/minimal tools/check_readme_program.sh tools/check_doc_links.py README.md examples/minimal.c,sh tools/check_readme_program.sh ./build/minimal $$(DEMO)))
$(eval $(call suite,tokenizer_san,build/test_tokenizer_san build/gemma4,./build/test_tokenizer_san))
$(eval $(call suite,tokenizer,build/test_tokenizer build/gemma4,./build/test_tokenizer))
$(eval $(call suite,template_san,build/test_template_san build/gemma4_san,./build/test_template_san data build/gemma4_san))
$(eval $(call suite,template,build/test_template build/gemma4,./build/test_template data build/gemma4))
$(eval $(call suite,cuda_emu,build/test_cuda_emu,./build/test_cuda_emu))
$(eval $(call suite,cuda_emu_san,build/test_cuda_emu_san,./build/test_cuda_emu_san))
$(eval $(call suite,gemma4_san,build/test_gemma4_san build/gemma4,./build/test_gemma4_san))
$(eval $(call suite,bad_inputs_san,build/test_bad_inputs_san build/gemma4_san,./build/test_bad_inputs_san data build/gemma4_san))
$(eval $(call suite,threads_san,build/test_threads_san,./build/test_threads_san))
$(eval $(call suite,drafter_san,build/test_drafter_san build/gemma4_san,./build/test_drafter_san data build/gemma4_san))
$(eval $(call suite,san_avx2,$(SAN_SIMD),sh tests/san_avx2.sh "$$(CC)" "$$(WARN)" "$$(SAN)"))
$(eval $(call suite,drafter,build/test_drafter build/gemma4,./build/test_drafter data build/gemma4))
$(eval $(call suite,threads,build/test_threads,./build/test_threads))
$(eval $(call suite,bad_inputs,build/test_bad_inputs build/gemma4,./build/test_bad_inputs data build/gemma4))
$(eval $(call suite,tests,build/test_gemma4 build/gemma4,./build/test_gemma4))
$(eval $(call suite,audio,build/test_audio build/test_audio_scalar build/gemma4,sh -c "./build/test_audio build/gemma4 && ./build/test_audio_scalar build/gemma4"))
$(eval $(call suite,audio_san,build/test_audio_san build/gemma4_san,./build/test_audio_san build/gemma4_san))
$(eval $(call suite,kernels,$(OTHER_KERNELS) build/gemma4,sh tests/other_kernels.sh "$$(CC)" "$$(WARN)"))
$(eval $(call suite,python,,sh python/tests/run.sh build/pyvenv))
# the suites run plain and under ASan + UBSan (SAN) alike: test_NAME DATA CLI, test_NAME_san DATA CLI_san
define suite_pair
$(call suite,$(1),build/test_$(1) build/gemma4,./build/test_$(1) data build/gemma4)
$(call suite,$(1)_san,build/test_$(1)_san build/gemma4_san,./build/test_$(1)_san data build/gemma4_san)
endef
$(foreach s,vision train lora cli unified mm,$(eval $(call suite_pair,$(s))))
.PHONY: $(SUITE_LOGS:%=suite-%) suite-minimal.log

# make test's build: strict and every suite's binaries, one job per CPU
NPROC = $(shell nproc 2>/dev/null || echo 2)
test-builds: strict build/gemma4 build/minimal build/test_gemma4 build/test_gemma4_san build/gemma4_san \
      build/test_bad_inputs build/test_bad_inputs_san build/test_threads build/test_threads_san \
      build/test_tokenizer build/test_tokenizer_san build/test_cuda_emu build/test_cuda_emu_san \
      build/test_train build/test_train_san build/test_drafter build/test_drafter_san build/test_template build/test_template_san \
      build/test_lora build/test_lora_san build/test_audio build/test_audio_san build/test_audio_scalar build/test_vision build/test_vision_san \
      build/test_cli build/test_cli_san build/test_unified build/test_unified_san build/test_mm build/test_mm_san \
      $(OTHER_KERNELS) $(SAN_SIMD)

# Builds and suites run together, one job per CPU; then each suite's log is shown in this
# order, and the total. make starts a suite whose binaries are built only on its next pass
# over the goals, that is after the builds, so the longest suite's binary (cuda_emu_san,
# about 3 min of one CPU) is built first on its own, and that suite starts at once.
SUITE_ORDER = cuda_emu_san cuda_emu drafter_san kernels python san_avx2 train_san lora_san bad_inputs_san gemma4_san \
              template_san cli_san drafter lora tests train bad_inputs cli audio_san threads_san tokenizer_san tokenizer template threads audio \
              vision_san vision unified_san unified mm_san mm
# the last line of each named suite's log, in order (make test's summary)
tails = tail -q -n 1 $(1:%=build/%.log)
test:
	@mkdir -p build && rm -f $(SUITE_LOGS:%=build/%) $(SUITE_LOGS:%=build/%.time) build/minimal.log
	@date +%s > build/test_t0
	@$(MAKE) --no-print-directory -j$(NPROC) build/test_cuda_emu_san
	@$(MAKE) --no-print-directory -j$(NPROC) $(SUITE_ORDER:%=suite-%.log) suite-minimal.log strict
	@echo "== README example"
	@cat build/minimal.log
	@echo "== tokenizer, chat, sampler and generate tests, under AddressSanitizer + UndefinedBehaviorSanitizer and plain"
	@$(call tails,tokenizer_san)
	@cat build/tokenizer.log
	@echo "== chat templates (goldens from transformers + jinja2, the CLI), plain and under ASan + UBSan"
	@$(call tails,template_san template)
	@echo "== CUDA path, emulated on the host (tests/cuda_emu.h), plain and under ASan + UBSan"
	@tail -n 2 build/cuda_emu.log
	@$(call tails,cuda_emu_san)
	@echo "== tests under AddressSanitizer + UndefinedBehaviorSanitizer (baseline ISA: the scalar kernels)"
	@$(call tails,gemma4_san bad_inputs_san threads_san drafter_san)
	@echo "== the SIMD kernels under ASan + UBSan: test_gemma4 and test_threads built for AVX2+FMA"
	@cat build/san_avx2.log
	@echo "== drafters, rewind and speculative decoding"
	@cat build/drafter.log
	@echo "== two sessions, two threads"
	@cat build/threads.log
	@echo "== training reference (gradients vs torch autograd), plain and under ASan + UBSan"
	@$(call tails,train train_san)
	@echo "== LoRA adapters (peft goldens), plain and under ASan + UBSan"
	@$(call tails,lora lora_san)
	@echo "== audio tower and features (transformers goldens): SIMD and scalar kernels, and under ASan + UBSan"
	@grep -E '^[0-9]+ passed' build/audio.log
	@$(call tails,audio_san)
	@echo "== vision tower and the merge into the decoder (transformers goldens), plain and under ASan + UBSan"
	@$(call tails,vision vision_san)
	@echo "== the 12B unified model's config and embedders (transformers goldens), plain and under ASan + UBSan"
	@$(call tails,unified unified_san)
	@echo "== images, video and audio through the CLI and the chat template into the decoder (transformers goldens), plain and under ASan + UBSan"
	@$(call tails,mm mm_san)
	@echo "== bad-input catalogue"
	@$(call tails,bad_inputs)
	@echo "== the command line (help, errors, --threads, statuses, progress; make bench's smoke form), plain and under ASan + UBSan"
	@$(call tails,cli cli_san)
	@echo "== the Python package (python/: pip install in a fresh venv, pytest against the same goldens)"
	@$(call tails,python)
	@echo "== tests"
	@cat build/tests.log
	@echo "== the core suite again on the other kernels this CPU runs (scalar, AVX2)"
	@cat build/kernels.log
	@echo "== kernel sets"
	@cat build/tests.log build/kernels.log | awk '/^  kernels: / { k = $$2; sub(",", "", k); if (sub("-emulated", "", k)) emu[k] = 1; else ran[k] = 1 } \
	  /^  bf16_fast: avx512_bf16-emulated/ { emu["avx512_bf16"] = 1; next } /^  bf16_fast: avx512_bf16/ { ran["avx512_bf16"] = 1 } \
	  /^  bf16 goldens: / { g = g "\n  " substr($$0, 17) } \
	  END { n = split("scalar avx2 avx512 avx512_bf16 neon", all, " "); r = ""; m = ""; e = ""; \
	        for (i = 1; i <= n; i++) { if (all[i] in ran) r = r " " all[i]; else m = m " " all[i]; if (all[i] in emu) e = e " " all[i] } \
	        print "kernel sets executed:" r (e == "" ? "" : "; emulated (tests/x86_emu.h, the kernels not the CPU):" e) \
	              (m == "" ? "" : "; not executed on this CPU (compiled by make strict):" m) \
	        "\nbf16 goldens in the bf16 mode (the torch order; avx512_bf16 only with bf16_fast), per build:" g }'
	@cd build && for l in $(SUITE_ORDER); do printf ' %s %s' $$l $$(cat $$l.log.time); done | \
	  awk '{ for (i = 1; i < NF; i += 2) { t += $$(i + 1); s = s sprintf(" %s %d,", $$i, $$(i + 1)) } \
	         sub(",$$", "", s); printf "== suite run times (s):%s; %d s in all, on $(NPROC) CPUs with the builds\n", s, t }'
	@echo "== all suites (make test took $$(( $$(date +%s) - $$(cat build/test_t0) )) s, builds included)"
	@cd build && cat $(SUITE_LOGS) | awk '/^[0-9]+ passed, [0-9]+ failed/ { p += $$1; f += $$3; s += $$5 } END { printf "%d passed, %d failed", p, f; if (s) printf ", %d skipped", s; print "" }'

# The Python package (python/, docs/python.md): a fresh venv in build/pyvenv, pip install
# ./python pytest numpy (the library built from gemma4.h by cc), then its pytest suite.
test-python:
	sh python/tests/run.sh build/pyvenv

# The same suite with the library built under ASan + UBSan (preloaded into the venv's
# Python; the package from python/, pytest and numpy from build/pyvenv): the shim and the
# package's argument checks, since ctypes passes bare pointers.
test-python-san:
	[ -x build/pyvenv/bin/pytest ] || sh python/tests/run.sh build/pyvenv
	GEMMA4_CFLAGS="$(SAN)" python3 python/gemma4/_build.py build/g4py_san.so
	ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	  PYTHONPATH=python GEMMA4_LIB=build/g4py_san.so build/pyvenv/bin/python -m pytest -q -p no:cacheprovider --ignore=python/tests/torch python/tests

# The torch bridge (gemma4.torch) against real transformers models: needs torch,
# transformers and peft (the repository's venv, tools/requirements.txt). Runs the package
# from python/ with the library built in place; pytest, if that Python lacks it, is
# installed beside it (pip --target build/pytest-lib), not into it.
TORCH_PYTHON ?= venv/bin/python
python/gemma4/_gemma4.so: python/gemma4/_lib.c python/gemma4/_build.py gemma4.h gemma4_processing.h
	python3 python/gemma4/_build.py $@

test-python-torch: python/gemma4/_gemma4.so
	$(TORCH_PYTHON) -c 'import pytest' 2>/dev/null || $(TORCH_PYTHON) -m pip install -q --target build/pytest-lib pytest
	PYTHONPATH=python:build/pytest-lib $(TORCH_PYTHON) -m pytest -q -p no:cacheprovider python/tests/torch

build/membw: bench/membw.c | build
	$(CC) -O2 -march=native -o $@ bench/membw.c -lpthread

build/fmapeak: bench/fmapeak.c | build
	$(CC) -O2 -march=native -o $@ bench/fmapeak.c -lpthread

# Not a test: the prefill GEMM alone, one thread, E2B's shapes (bench/gemm.c)
build/gemmbench: bench/gemm.c gemma4.h | build
	$(CC) $(CFLAGS) -o $@ bench/gemm.c $(LDLIBS)

# The NEON kernels: the suite cross-built for AArch64 and run under qemu-user
# (needs gcc-aarch64-linux-gnu and qemu-user; .ci/run installs them).
test-arm64: build/gemma4 | build
	aarch64-linux-gnu-gcc $(WARN) -O2 -static $(TEST_DEFS) -o build/test_gemma4_arm64 tests/test_gemma4.c $(LDLIBS)
	qemu-aarch64 ./build/test_gemma4_arm64

# Not a test: speed on an E2B-shaped random checkpoint vs the machine and peers (bench/run.sh).
bench: build/gemma4 build/membw build/fmapeak
	sh bench/run.sh

# make bench's smoke form on a tiny model: that the script runs to its end and exits 0
# (not a timing; tests/test_cli.c runs the same in make test).
bench-smoke: build/gemma4 build/membw build/fmapeak
	rm -rf build/bench-smoke-model
	BENCH_CONFIG=$(DEMO)/config.json BENCH_DIR=build/bench-smoke-model THREADS=2 PROMPT=4 PROMPT2=8 GEN=2 MEMBW_MIB=16 \
	  TOWER_CONFIGS="data/vision/e2b_mm/config.json data/tiny/e2b_audio/config.json" TOWER_ARGS="--patches 64 --seconds 1" sh bench/run.sh

clean:
	rm -rf build

# --- on a GPU (not part of make test: CI has none) ---------------------------
# The CUDA suite with 1, 3 and the default blocks per grid, then
# compute-sanitizer's four tools; real shapes from gemma4 synth; the benchmark.
test-cuda-device: build/gemma4
	tests/cuda_device.sh build/cuda_device

bench-cuda: build/gemma4
	bench/cuda.sh
