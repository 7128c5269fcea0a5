# Convenience wrapper around CMake. The two set-up commands of the README:
#   bash scripts/setup.sh     install everything (idempotent)
#   make test                 build, then run CUnit + pytest through ctest
BUILD ?= build
JOBS ?= $(shell nproc)
# IE_WERROR=ON turns compiler warnings into errors (.ci/run sets it; an
# environment variable of that name works too).
IE_WERROR ?= OFF

.PHONY: all build test check-install docs format-check test-distributed test-serving bench bench-quick bench-distributed bench-serve bench-decode bench-kv bench-kquant bench-lora profile fuzz reference asan tsan clean

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DIE_WERROR=$(IE_WERROR) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure

# The installed library used from outside the tree: cmake --install into a
# temporary prefix, the C example built with pkg-config only and run on
# SmolLM2, the Python package pip-installed into a fresh venv and run.
check-install:
	bash scripts/check_install.sh $(BUILD)

# The public header's reference (docs/Doxyfile -> $(BUILD)/docs/html);
# any doxygen warning fails the target.
docs:
	mkdir -p $(BUILD)/docs
	( cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = $(BUILD)/docs" ) | doxygen -

# The tree against .clang-format (lists the files that differ).
format-check:
	bash scripts/format.sh --check

# The embedded end-to-end suites again, with the model behind the cluster
# protocol: in-process workers over ZeroMQ inproc:// in a pipeline and a
# tensor plan (IE_PLAN; docs/OPERATIONS.md). Suites about embedded-only
# behaviour (repack cache files, RSS of one worker) are not in the list.
DIST_SUITES = tests/e2e/test_forward_tiny.py tests/e2e/test_smollm2_ref.py tests/e2e/test_forward_gptoss.py \
  tests/e2e/test_perplexity.py tests/e2e/test_chat.py tests/e2e/test_chat_harmony.py \
  tests/e2e/test_gptoss_bad_input.py tests/e2e/test_cli.py
test-distributed: build
	for plan in pipeline:2 tensor:2; do \
	  IE_PLAN=$$plan IE_BIN=$(BUILD)/inference-engine IE_BUILD_DIR=$(BUILD) \
	    .venv/bin/python -m pytest -q $(DIST_SUITES) || exit 1; \
	done

# Benchmarks print figures; they assert nothing. bench/harness.py runs the
# sweep (interleaved runs, a bandwidth probe between rounds), the kernel
# microbenchmarks, writes bench/out/<stamp>/ (results.jsonl/.csv, plots) and
# regenerates docs/PERFORMANCE.md. The TinyLlama-shaped Q4_0 model is made
# first by bench/make_tinyllama_gguf.py (~0.6 GB in models/bench/).
BENCH_SWEEP ?= threads=2|precision=f16,bf16,int8w,int4w
BENCH_RUNS ?= 3
bench: build
	.venv/bin/python bench/make_tinyllama_gguf.py --types f16
	.venv/bin/python bench/harness.py --bin $(BUILD)/inference-engine --kernels \
	  --model models/bench/tinyllama-f16.gguf --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
	  --sweep '$(BENCH_SWEEP)' --runs $(BENCH_RUNS) --prompt-tokens 512 --gen 64

# About a minute: SmolLM2 only, no kernel benchmarks, the document untouched.
bench-quick: build
	.venv/bin/python bench/harness.py --bin $(BUILD)/inference-engine \
	  --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
	  --sweep 'threads=1,2|batch=1,4' --runs 2 --prompt-tokens 64 --gen 32 --no-doc

# Issue 4: TinyLlama-shaped decode at 4-bit, 8-bit and BF16, every token paired
# with a read of the same weight bytes by the same threads a few ms apart
# (bench/bench_decode.c): the fraction of the reachable bandwidth, in the high
# and the low bandwidth phase apart. About two minutes.
DECODE_TOKENS ?= 192
bench-decode: build
	.venv/bin/python bench/make_tinyllama_gguf.py --types f16,q8_0,q4_0
	$(BUILD)/bench_decode --model models/bench/tinyllama-q4_0.gguf --tokens $(DECODE_TOKENS)
	$(BUILD)/bench_decode --model models/bench/tinyllama-q8_0.gguf --tokens $(DECODE_TOKENS)
	$(BUILD)/bench_decode --model models/bench/tinyllama-f16.gguf --precision bf16 --tokens $(DECODE_TOKENS)

# Issue 22: TinyLlama-shaped Q4_0 decode 4,096 positions deep with each KV
# cache type, every token beside its paired read (bench_decode); the q8 cache
# should decode >= 1.2x the f32 cache's rate at depth. Each run prefills
# 4,096 tokens first (minutes on 2 cores). Run on a quiet machine.
KV_TYPES ?= f32 f16 bf16 q8 q4 fp8_e4m3 fp8_e5m2
KV_TOKENS ?= 32
# prefill at depth: 512 new tokens after 4,096 cached, the types in turn
# each round (A/B interleaved; bench/bench_kv_prefill.c)
KV_PREFILL_TYPES ?= f32,q8
KV_PREFILL_ROUNDS ?= 2
bench-kv: build
	.venv/bin/python bench/make_tinyllama_gguf.py --types q4_0
	for t in $(KV_TYPES); do $(BUILD)/bench_decode --model models/bench/tinyllama-q4_0.gguf --prompt 4096 \
	  --tokens $(KV_TOKENS) --cache-type-k $$t --cache-type-v $$t || exit 1; done
	$(BUILD)/bench_kv_prefill --model models/bench/tinyllama-q4_0.gguf --depth 4096 --new 512 \
	  --rounds $(KV_PREFILL_ROUNDS) --types $(KV_PREFILL_TYPES)

# Issue 18: TinyLlama-shaped decode (bench_decode's fraction of the paired
# read) and pp512 per k-quant type, each model run between two runs of the
# Q4_0 baseline (bench/bench_kquant.py). The models are made by ie-convert
# from the f16 file once (~0.5-0.9 GB each, models/bench/kquant/); llama.cpp's
# tinyllama-Q4_K_M/Q6_K/Q4_0 files join when models/kquant/ has them.
KQUANT_TOKENS ?= 48
KQUANT_ROUNDS ?= 1
bench-kquant: build
	.venv/bin/python bench/bench_kquant.py --build $(BUILD) --tokens $(KQUANT_TOKENS) --rounds $(KQUANT_ROUNDS)

# Issue 20: multi-LoRA serving (bench/bench_lora.py): 8 streams over 4 random
# adapters (rank 16/32, all seven projections) vs the 8 on the base alone,
# interleaved rounds beside a bandwidth probe; then a Zipfian trace over 64
# adapters with room for 16 (run-time load/unload and --lora-budget-mb).
bench-lora: build
	.venv/bin/python bench/make_tinyllama_gguf.py --types q4_0
	.venv/bin/python bench/bench_lora.py --build $(BUILD)

# Issue 24: record a real generate run with perf and write its folded stacks
# (and a flame graph when flamegraph.pl or inferno is installed) to
# bench/out/profile.*; fails with a message where perf cannot run.
profile: build
	BUILD=$(BUILD) scripts/profile.sh

# Issue 5: SmolLM2 decode/prefill, embedded (2 threads) vs --plan tensor:2 /
# pipeline:2 in-process vs ie-coordinator + 2 ie-worker processes on loopback
# tcp (1 thread each), interleaved rounds, each also with the partial sums over
# ZeroMQ (*-zmq), chained steps forced on (*-la) and a CPU wake-up latency
# request in every process (*-lat0); writes bench/out/distributed-*.json.
bench-distributed: build
	.venv/bin/python bench/bench_distributed.py --rounds 3 --gen 64 --prompt-tokens 64

# Issue 6: the serving tests with the issue's full load (1000 requests from
# 64 clients; `make test` runs 300): overload, distributed HTTP, timeouts,
# priorities too. About three and a half minutes on two cores.
test-serving: build
	IE_SERVING_REQUESTS=1000 IE_BIN=$(BUILD)/inference-engine IE_BUILD_DIR=$(BUILD) \
	  .venv/bin/python -m pytest -q -s tests/e2e/test_serving.py

# Issue 6: aggregate t/s, per-token latency and TTFT p50/p95 of the HTTP API
# for 1..16 concurrent streams, SmolLM2 and the TinyLlama-shaped Q4_0 model,
# embedded and ie-coordinator + 2 ie-worker (tensor, pipeline), beside the
# engine's own batched decode (cli); writes bench/out/serve-<stamp>/
# (results.jsonl/.csv, plots, summary.md with the table to paste).
bench-serve: build
	.venv/bin/python bench/make_tinyllama_gguf.py --types q4_0
	.venv/bin/python bench/bench_serve.py --bin-dir $(BUILD) --modes embedded,tensor,pipeline,cli

# Bounded libFuzzer runs under ASan/UBSan (seconds per target: FUZZ_SECONDS).
FUZZ_SECONDS ?= 60
fuzz:
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

# Re-generate the reference fixtures with torch/transformers and re-check.
reference: build
	bash scripts/setup.sh --reference
	bash tests/reference/regen.sh

# The unit tests under ASan+UBSan.
asan:
	cmake -S . -B build-asan -DCMAKE_C_COMPILER=clang -DIE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DIE_WERROR=$(IE_WERROR) >/dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ctest --output-on-failure -E pytest

# The threaded suites under ThreadSanitizer.
TSAN_TESTS = test_threadpool test_worker test_engine test_metrics test_shard test_transport test_sched test_shmreduce test_paged test_lora_cluster test_lora_embed
tsan:
	cmake -S . -B build-tsan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIE_WERROR=$(IE_WERROR) \
	  -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread >/dev/null
	cmake --build build-tsan -j$(JOBS) --target $(TSAN_TESTS)
	cd build-tsan && IE_TEST_ONLY=threads TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" ctest --output-on-failure -R '^($(shell echo $(TSAN_TESTS) | tr ' ' '|'))$$'

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-tsan
