#!/usr/bin/env bash
# check_install.sh — the installed library, used from outside the tree.
#
#   bash scripts/check_install.sh [BUILD_DIR]     (default: build)
#
# Configures and builds BUILD_DIR (reusing it if it exists), installs it into
# a temporary prefix, compiles docs/examples/generate.c there with nothing
# but `pkg-config --cflags --libs clocher` and runs it on SmolLM2, then
# `pip install ./python` into a fresh virtual environment (no system site
# packages) and generates from Python with the installed library. Also
# checks that the shared library exports clocher.h's functions and nothing
# else. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BUILD=${1:-build}
MODEL=${IE_SMOLLM2:-$REPO/models/SmolLM2-135M-Instruct.Q4_1.gguf}
PY=${PYTHON:-python3}

step() { printf '\n== %s\n' "$*"; }
fail() { echo "check_install: FAIL: $*" >&2; exit 1; }

[ -f "$MODEL" ] || fail "model missing: $MODEL (run scripts/setup.sh)"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/clocher-install.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PREFIX=$TMP/prefix

step "build ($BUILD)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target clocher clocher_static

step "install into $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
for f in include/clocher.h lib/libclocher.so lib/libclocher.so.0 lib/libclocher.a lib/pkgconfig/clocher.pc; do
    [ -e "$PREFIX/$f" ] || fail "$f not installed"
done
[ "$(readelf -d "$PREFIX/lib/libclocher.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')" = libclocher.so.0 ] ||
    fail "SONAME is not libclocher.so.0"

step "exported symbols = clocher.h's functions"
want=$(grep -oE '^[a-z][^(]*[ *]ie_[a-z0-9_]+\(' include/clocher.h | grep -oE 'ie_[a-z0-9_]+\(' | tr -d '(' | sort)
have=$(nm -D --defined-only "$PREFIX/lib/libclocher.so" | awk '$2 ~ /^[TDBRW]$/ {print $3}' | sed 's/@.*//' | sort)
[ "$want" = "$have" ] || { diff <(echo "$want") <(echo "$have") >&2 || true; fail "exports differ from clocher.h"; }
echo "$(echo "$have" | wc -l) functions"

step "C example with pkg-config only"
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
flags=$(pkg-config --cflags --libs clocher)
echo "cc generate.c $flags"
cp docs/examples/generate.c "$TMP/"
# shellcheck disable=SC2086  # the flags are words
(cd "$TMP" && cc -std=c11 -Wall -Wextra -Werror generate.c $flags -o generate)
out=$(LD_LIBRARY_PATH=$PREFIX/lib "$TMP/generate" "$MODEL" "The capital of France is" 16)
echo "$out"
grep -q "Paris" <<<"$out" || fail "the C example did not generate the expected text"
# the static archive holds all of clocher's own code: the example links
# against it with the dependencies named in clocher.pc (shared system libs)
deps=$(pkg-config --print-requires-private clocher | awk '{print $1}' | tr '\n' ' ')
# shellcheck disable=SC2046,SC2086
(cd "$TMP" && cc -std=c11 generate.c $(pkg-config --cflags clocher) "$PREFIX/lib/libclocher.a" \
    $(pkg-config --libs $deps) -lm -lpthread -o generate-static)
"$TMP/generate-static" "$MODEL" "The capital of France is" 4 >/dev/null || fail "the statically linked example failed"

step "Python package in a fresh venv"
"$PY" -m venv "$TMP/venv"
cp -r python "$TMP/python" # setuptools builds in the source folder: not in the tree
rm -rf "$TMP/python/build" "$TMP/python/"*.egg-info
# offline with the venv's own setuptools if it has one, else as pip likes
"$TMP/venv/bin/python" -m pip install -q --no-index --no-build-isolation "$TMP/python" 2>/dev/null ||
    "$TMP/venv/bin/python" -m pip install -q "$TMP/python"
cd "$TMP" # not the repo: the installed package, not ./python
CLOCHER_LIBRARY=$PREFIX/lib/libclocher.so "$TMP/venv/bin/python" - "$MODEL" <<'EOF'
import sys
import clocher
assert "site-packages" in clocher.__file__, clocher.__file__
with clocher.Engine(sys.argv[1], threads=2, pin=False) as e:
    text = e.generate("The capital of France is", max_tokens=16, temperature=0)
    pieces = list(e.stream("The capital of France is", max_tokens=16, temperature=0))
    m = e.metrics()
print(repr(text))
assert "Paris" in text, text
assert "".join(pieces) == text
assert m["requests"] == 2 and m["tokens_out"] >= 2, m
print("python: ok", clocher.version())
EOF
echo
echo "check_install: OK"
