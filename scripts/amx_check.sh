#!/usr/bin/env bash
# amx_check.sh — the checks and A/B measurements of the AMX tiles (issue 23)
# on a machine that has them, in one go (docs/PERFORMANCE.md, "AMX tiles").
#
#   bash scripts/amx_check.sh [BUILD_DIR]     (default: build)
#
# 1. CPU flags and what dispatch.c decides (IE_ISA=amx must start a worker);
# 2. test_amx_hw (the tile GEMM and the amx table against ref): must PASS,
#    a skip is a failure here;
# 3. bench_kernels: the tiles' int8 peak, GEMM GOP/s of int8w/int4w/
#    int4w_affine (AMX-INT8) and bf16 (AMX-BF16) at 512 tokens, avx512 and
#    amx in one run;
# 4. the crossover: the same GEMM at 8..64 tokens (IE_AMX_MIN_TOK);
# 5. logits of a 301-token prefill, amx against avx512 (max |difference|);
# 6. pp512 A/B, interleaved (bench/harness.py, docs left alone): Q4_0 and
#    SmolLM2 Q4_1 as stored, the f16 TinyLlama as --precision bf16.
# ISAS="a b" changes the pair compared in 3-6 (default "avx512 amx");
# AMX_CHECK_NO_HW=1 skips 1-2 (to try the script on a machine without AMX).
# Exits 1 at the first failed check; measurements assert nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
read -r ISA_A ISA_B <<<"${ISAS:-avx512 amx}"
PY=.venv/bin/python
Q4=models/bench/tinyllama-q4_0.gguf
F16=models/bench/tinyllama-f16.gguf
SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
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

echo "== 3. GEMM at 512 tokens, $ISA_A vs $ISA_B (and the tiles' peak)"
"$B"/bench_kernels --isa "$ISA_A,$ISA_B" --types int8w,int4w,int4w_affine,bf16 --ptok 512 --pool-mib 256 |
    grep -E 'peak|gemm' | grep -v '^{'

echo "== 4. crossover (int4w, attn q/o and ffn shapes)"
for n in 8 16 24 32 64; do
    "$B"/bench_kernels --isa "$ISA_A,$ISA_B" --types int4w --ptok "$n" --iters 9 --pool-mib 256 | grep gemm |
        grep -v '^{' | grep -v peak
done

echo "== 5. logits, 301-token prefill: $ISA_B against $ISA_A"
ids=$(seq -s, 100 400)
for i in "$ISA_A" "$ISA_B"; do
    IE_ISA=$i "$B"/inference-engine logits --model "$Q4" --ids "$ids" --out "/tmp/amx_check.logits.$i" >/dev/null
done
$PY - "$ISA_A" "$ISA_B" <<'EOF'
import sys
import numpy as np
a, b = (np.fromfile(f"/tmp/amx_check.logits.{i}", "<f4") for i in sys.argv[1:3])
print(f"max |{sys.argv[2]} - {sys.argv[1]}| = {abs(a - b).max():.3g} (max |logit| {abs(a).max():.3g});",
      f"argmax equal at {np.mean(a.reshape(301, -1).argmax(1) == b.reshape(301, -1).argmax(1)):.3f} of positions")
EOF

echo "== 6. pp512 A/B (bench/harness.py, 3 rounds interleaved)"
$PY bench/harness.py --model "$Q4" --model "$SMOL" --sweep "isa=$ISA_A,$ISA_B" --runs 3 --prompt-tokens 512 \
    --gen 8 --no-doc --no-plots --out "bench/out/amx_check_$(date -u +%Y%m%dT%H%M%S)" | tail -20
$PY bench/harness.py --model "$F16" --sweep "isa=$ISA_A,$ISA_B|precision=bf16" --runs 3 --prompt-tokens 512 \
    --gen 8 --no-doc --no-plots --out "bench/out/amx_check_bf16_$(date -u +%Y%m%dT%H%M%S)" | tail -6
