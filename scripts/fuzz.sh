#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] — fuzz the parsers of outside input (GGUF, IEBIN,
# safetensors, tokenizer.json and text for the tokenizers, quantization
# manifests, chat templates, /v1/embeddings, /tokenize and /detokenize bodies,
# JSON Schemas for structured output, tool calls).
#
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang, ASan and
# UBSan into build-fuzz/ — the whole library is coverage-instrumented
# (-fsanitize=fuzzer-no-link), not just the target files — and runs each for
# SECONDS (default 60), starting from the seed corpus in tests/fuzz/corpus_*/.
# New inputs go to build-fuzz/corpus_*/ so the checked-in seeds stay small.
# Exits non-zero on any crash, leak, timeout or sanitizer report; the
# offending input is saved as build-fuzz/crash-<target>-*.
set -euo pipefail

secs="${1:-60}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
build=build-fuzz
targets=(gguf safetensors tokenizer iebin manifest proto jinja lora embd grammar tools tokapi oai_lora http_head)

log() { printf '[fuzz] %s\n' "$*" >&2; }

log "configuring $build (clang, ASan+UBSan, libFuzzer)"
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Release \
  -DIE_FUZZ=ON -DIE_SANITIZE=ON -DIE_WERROR="${IE_WERROR:-OFF}" -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null

status=0
for t in "${targets[@]}"; do
  work="$build/corpus_$t"
  mkdir -p "$work"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  log "fuzz_$t for ${secs}s"
  if ! "$build/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
      -print_final_stats=1 -artifact_prefix="$build/crash-$t-" "${dict[@]}" \
      "$work" "tests/fuzz/corpus_$t" >"$build/fuzz_$t.log" 2>&1; then
    log "fuzz_$t FAILED; see $build/fuzz_$t.log"
    tail -n 40 "$build/fuzz_$t.log" >&2
    status=1
  else
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz_$t.log" | grep -o '[0-9]*$' || true)"
    log "fuzz_$t ok: ${runs:-?} executions in ${secs}s, corpus $(ls "$work" | wc -l) inputs"
  fi
done
exit $status
