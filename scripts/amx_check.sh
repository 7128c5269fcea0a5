#!/usr/bin/env bash
# amx_check.sh — the checks and A/B measurements of the AMX tiles (issue 23)
# on a machine that has them, in one go (docs/PERFORMANCE.md, "AMX tiles").
#
#   bash scripts/amx_check.sh [BUILD_DIR]     (default: build)
#
# 1. CPU flags and what dispatch.c decides (IE_ISA=amx must start a worker);
# 2. test_amx_hw (the tile GEMM and the amx table against ref): must PASS,
#    a skip is a failure here;
# 3. bench_amx (tile instruction costs, one core's GEMMs with the int
#    types' two tile routes and MXFP4 at GPT-OSS's expert shape on the
#    bf16 tiles, then THREADS threads' at once), then
#    bench_kernels: the tiles' int8 peak, GEMM GOP/s of int8w/int4w/
#    int4w_affine (AMX-INT8, IE_AMX_INT=1; the bf16 route, IE_AMX_INT=bf16),
#    bf16 (AMX-BF16) and q4_K/q6_K (the bf16 route) at 512 tokens, avx512
#    and amx in one run;
# 4. the crossover: the same GEMMs at 4..256 tokens with IE_AMX_MIN_TOK=1
#    (tiles at every size), int4w on both routes;
# 5. logits of a 301-token prefill, amx against avx512 (max |difference|),
#    Q4_0 with IE_AMX_INT=1 and BF16; Q4_0 on the bf16 route against
#    avx512 --precision bf16 (what that route computes); the tiny GPT-OSS
#    with its MXFP4 experts on the bf16 tiles against transformers;
# 6. pp512 A/B, interleaved (bench/harness.py, docs left alone): the
#    TinyLlama-shaped Q4_0 and BF16 models (made by
#    bench/make_tinyllama_gguf.py when missing) and SmolLM2 Q4_1, as stored
#    and with IE_AMX_INT=1 and =bf16.
# ISAS="a b" changes the pair compared in 3-6 (default "avx512 amx");
# THREADS=N the threads of 3-6 (default 4); PARTS="3 6" runs only those of
# 3-6 (default all); AMX_CHECK_NO_HW=1 skips 1-2 (to try the script on a
# machine without AMX). Python: .venv's, else python3
# (with numpy). Exits 1 at the first failed check; measurements assert
# nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
read -r ISA_A ISA_B <<<"${ISAS:-avx512 amx}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
TH=${THREADS:-4}
PARTS=${PARTS:-3 4 5 6}
part() { [[ " $PARTS " == *" $1 "* ]]; }
Q4=models/bench/tinyllama-q4_0.gguf
BF16=models/bench/tinyllama-bf16.gguf
[ -f "$Q4" ] && [ -f "$BF16" ] || $PY bench/make_tinyllama_gguf.py --types q4_0,bf16
SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
# max |b - a| and how often the arg max agrees, of /tmp/amx_check.logits.{a,b} (301 positions)
cmp_logits() {
    $PY - "$1" "$2" "$3" <<'EOF'
import sys
import numpy as np
a, b = (np.fromfile(f"/tmp/amx_check.logits.{i}", "<f4") for i in sys.argv[1:3])
print(f"{sys.argv[3]}: max |{sys.argv[2]} - {sys.argv[1]}| = {abs(a - b).max():.3g} (max |logit| {abs(a).max():.3g});",
      f"argmax equal at {np.mean(a.reshape(301, -1).argmax(1) == b.reshape(301, -1).argmax(1)):.3f} of positions")
EOF
}
echo "== $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), load $(cut -d' ' -f1-3 /proc/loadavg)"

if [ -z "${AMX_CHECK_NO_HW:-}" ]; then
    echo "== 1. flags: $(grep -o 'amx_[a-z0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    IE_ISA=amx "$B"/inference-engine --model "$SMOL" --prompt "Hello" --max-new 2 --greedy >/dev/null ||
        { echo "FAIL: IE_ISA=amx cannot start a worker (reason above)"; exit 1; }
    echo "== 2. test_amx_hw"
    out=$("$B"/test_amx --hw) && rc=0 || rc=$?
    echo "$out" | tail -12
    [ "$rc" = 0 ] || { echo "FAIL: test_amx --hw exit $rc (77: skipped, no AMX)"; exit 1; }
fi

if part 3; then
echo "== 3. tile instruction costs and one core's GEMMs (bench_amx), then GEMM at 512 tokens, $ISA_A vs $ISA_B,"
echo "      $TH threads (and the tiles' peak)"
"$B"/bench_amx
"$B"/bench_amx --threads "$TH" --reps 1000 | grep -v '^ *t[di]' | grep -v 'TSC'
IE_AMX_INT=1 "$B"/bench_kernels --threads "$TH" --isa "$ISA_A,$ISA_B" --types int8w,int4w,int4w_affine,bf16 \
    --ptok 512 --pool-mib 256 | grep -E 'peak|gemm' | grep -v '^{'
echo "-- the int types' and k-quants' bf16 route (IE_AMX_INT=bf16; the k-quants A/B)"
IE_AMX_INT=bf16 "$B"/bench_kernels --threads "$TH" --isa "$ISA_B" --types int8w,int4w,int4w_affine \
    --ptok 512 --pool-mib 256 | grep -E 'gemm' | grep -v '^{'
IE_AMX_INT=bf16 "$B"/bench_kernels --threads "$TH" --isa "$ISA_A,$ISA_B" --types q4_K,q6_K \
    --ptok 512 --pool-mib 256 | grep -E 'gemm' | grep -v '^{'
fi

if part 4; then
echo "== 4. crossover (int4w and bf16; IE_AMX_MIN_TOK=1 IE_AMX_INT=1: the tiles at every size; then int4w's bf16 route)"
for n in 4 8 16 32 64 128 256; do
    IE_AMX_MIN_TOK=1 IE_AMX_INT=1 "$B"/bench_kernels --threads "$TH" --isa "$ISA_A,$ISA_B" --types int4w,bf16 \
        --ptok "$n" --iters 9 --pool-mib 256 | grep gemm | grep -v '^{' | grep -v peak
    IE_AMX_MIN_TOK=1 IE_AMX_INT=bf16 "$B"/bench_kernels --threads "$TH" --isa "$ISA_B" --types int4w \
        --ptok "$n" --iters 9 --pool-mib 256 | grep gemm | grep -v '^{' | grep -v peak | sed 's/$/  (bf16 route)/'
done
fi

if part 5; then
echo "== 5. logits, 301-token prefill: $ISA_B against $ISA_A"
ids=$(seq -s, 100 400)
for m in "$Q4" "$BF16"; do
    for i in "$ISA_A" "$ISA_B"; do
        IE_AMX_INT=1 IE_ISA=$i "$B"/inference-engine logits --model "$m" --ids "$ids" --threads "$TH" \
            --out "/tmp/amx_check.logits.$i" >/dev/null
    done
    cmp_logits "$ISA_A" "$ISA_B" "$m"
done
# the bf16 route computes what --precision bf16 does: compare with that on $ISA_A
IE_ISA=$ISA_A "$B"/inference-engine logits --model "$Q4" --ids "$ids" --threads "$TH" --precision bf16 \
    --out "/tmp/amx_check.logits.ref" >/dev/null
IE_AMX_INT=bf16 IE_ISA=$ISA_B "$B"/inference-engine logits --model "$Q4" --ids "$ids" --threads "$TH" \
    --out "/tmp/amx_check.logits.route" >/dev/null
cmp_logits ref route "$Q4 (bf16 route vs $ISA_A --precision bf16)"
# GPT-OSS's MXFP4 experts on the bf16 tiles (every expert matmul: IE_AMX_MIN_TOK=1) against transformers,
# from IQ4_NL's panels (the default binding) and from ggml's rows (IE_REPACK=0: the MXFP4 slot)
GO=tests/data/tiny_gptoss.gguf
gids=$($PY -c "import numpy as np; print(','.join(map(str, np.load('tests/data/tiny_gptoss_mxfp4/expected.npz')['ids'])))")
for rp in 1 0; do
IE_REPACK=$rp IE_AMX_INT=bf16 IE_AMX_MIN_TOK=1 IE_ISA=$ISA_B "$B"/inference-engine logits --model "$GO" \
    --ids "$gids" --threads "$TH" --out /tmp/amx_check.logits.gptoss >/dev/null
RP=$rp $PY - <<'EOF2'
import os
import numpy as np
ref = np.load("tests/data/tiny_gptoss_mxfp4/expected.npz")["logits"]
got = np.fromfile("/tmp/amx_check.logits.gptoss", "<f4").reshape(ref.shape)
rel = np.abs(got - ref).max(1) / np.abs(ref).max(1)
lay = "panels" if os.environ["RP"] == "1" else "rows"
print(f"tiny_gptoss.gguf (MXFP4 experts, {lay}, on the bf16 tiles) vs transformers: median rel",
      f"{np.median(rel):.3g} (emulated: see test_amx_emulated.py), max {rel.max():.3g},",
      f"argmax equal at {np.mean(got.argmax(1) == ref.argmax(1)):.2f}")
EOF2
done
fi

if part 6; then
echo "== 6. pp512 A/B (bench/harness.py, 3 rounds interleaved), $TH threads"
for int in 0 1 bf16; do
    echo "-- IE_AMX_INT=$int"
    IE_AMX_INT=$int $PY bench/harness.py --model "$Q4" --model "$BF16" --model "$SMOL" \
        --sweep "isa=$ISA_A,$ISA_B|threads=$TH" --runs 3 --prompt-tokens 512 --gen 8 --no-doc --no-plots \
        --out "bench/out/amx_check_${int}_$(date -u +%Y%m%dT%H%M%S)" | tail -8
done
fi
