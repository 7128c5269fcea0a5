#!/usr/bin/env bash
# `make profile`: record a real generate run with perf (call graphs) and
# write bench/out/profile.perf.data, bench/out/profile.folded (collapsed
# stacks) and, when a flame graph renderer is installed (flamegraph.pl from
# Brendan Gregg's FlameGraph, or inferno-flamegraph), bench/out/profile.svg.
# Also writes the run's JSON line (with --profile's kernel shares) to
# bench/out/profile.json.
#   BUILD (build), MODEL (models/SmolLM2-135M-Instruct.Q4_1.gguf),
#   PROFILE_TOKENS (128), PROFILE_THREADS (2), PROFILE_FREQ (999 Hz)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
TOKENS=${PROFILE_TOKENS:-128}
THREADS=${PROFILE_THREADS:-2}
FREQ=${PROFILE_FREQ:-999}
OUT=bench/out
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

fail() { echo "make profile: $*" >&2; exit 1; }
command -v perf >/dev/null || fail "perf is not installed (apt-get install linux-perf, or linux-tools-\$(uname -r) on Ubuntu)"
[ -x "$BUILD/inference-engine" ] || fail "$BUILD/inference-engine is missing: build first (make build)"
[ -e "$MODEL" ] || fail "model $MODEL is missing (scripts/setup.sh downloads SmolLM2)"
mkdir -p "$OUT"
# perf must be allowed to sample this process (perf_event_paranoid <= 2, or
# CAP_PERFMON); in a container without perf_event_open it cannot run at all
if ! perf record -q -o /dev/null -- true >/dev/null 2>&1; then
    fail "perf cannot record here (kernel.perf_event_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo '?'), or no perf_event_open in this container)"
fi
perf record -q -g -F "$FREQ" -o "$OUT/profile.perf.data" -- \
    "$BUILD/inference-engine" --model "$MODEL" --prompt "Once upon a time, in a land far away," \
    --max-new "$TOKENS" --greedy --threads "$THREADS" --profile >"$OUT/profile.json"
perf script -i "$OUT/profile.perf.data" 2>/dev/null | "$PY" bench/perf_fold.py >"$OUT/profile.folded"
if command -v flamegraph.pl >/dev/null; then
    flamegraph.pl --title "inference-engine decode ($MODEL)" "$OUT/profile.folded" >"$OUT/profile.svg"
elif command -v inferno-flamegraph >/dev/null; then
    inferno-flamegraph --title "inference-engine decode" "$OUT/profile.folded" >"$OUT/profile.svg"
else
    echo "make profile: no flame graph renderer (flamegraph.pl, inferno-flamegraph) found; folded stacks only" >&2
fi
echo "make profile: wrote $OUT/profile.folded ($(wc -l <"$OUT/profile.folded") stacks), $OUT/profile.json" \
    "$( [ -f "$OUT/profile.svg" ] && echo "and $OUT/profile.svg")" >&2
