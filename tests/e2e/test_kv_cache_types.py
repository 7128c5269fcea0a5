"""End-to-end checks of the KV cache types (--cache-type-k, --cache-type-v,
--kv-rotate; docs/KVCACHE.md) through the inference-engine CLI.

  a) A quantized cache keeps the paged layout's promise: any block size
     gives the default block size's greedy ids (each position's head is
     encoded on its own and decoded to the same values wherever its block
     lies), GPT-OSS's sliding-window layers and sinks included.
  b) Distributed (in-process workers): pipeline:2 gives the embedded
     engine's ids with the same cache types (the types travel in the
     workers' assignment); a pool too small for every stream (binds and
     preemption/recompute) gives the full pool's ids; tensor:2 gives its own
     default pool's ids with any block size.
  c) The JSON line reports the types and the bytes per token of context;
     --kv-mem-mb sizes the pool in bytes of the chosen types (on plans:
     tests/e2e/test_kv_ring.py).
  d) An unknown type, a bad rotation switch and a head size the type cannot
     hold exit 2 with one clear line.
  e) A smoothed q4 K across a prefix-cache hit gives the computed stream's
     ids (its f32 recent rows off); the recent rows' bytes are reported.
"""
from __future__ import annotations

import pytest

from conftest import THREADS, fixture_path, run_cli, run_json

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):"]
CTX = 256
MAX_NEW = 16
QUANT = ["--cache-type-k", "q8_0", "--cache-type-v", "fp8_e4m3"]


def greedy(model, prompts_file, *extra, max_new=MAX_NEW, ctx=CTX):
    return run_json(["--model", model, "--prompts-file", prompts_file, "--batch", len(PROMPTS),
                     "--max-new", max_new, "--greedy", "--threads", THREADS, "--ctx", ctx, "--no-pin",
                     *extra], timeout=300)


@pytest.fixture
def prompts_file(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text("\n".join(PROMPTS) + "\n")
    return p


@pytest.fixture(scope="module")
def tiny_gptoss():
    return fixture_path("tiny_gptoss.gguf")


@pytest.mark.parametrize("types", [["--cache-type-k", "q4", "--cache-type-v", "q4"], QUANT])
def test_block_size_keeps_ids_quantized(types, smollm2, prompts_file):
    ref = greedy(smollm2, prompts_file, *types)["ids"]
    for block in (1, 5, 64):
        got = greedy(smollm2, prompts_file, *types, "--kv-block", block)["ids"]
        assert got == ref, f"{types} --kv-block {block}: {got} != {ref}"


def test_block_size_keeps_ids_gptoss_sliding(tiny_gptoss, prompts_file):
    types = ["--cache-type-k", "fp8_e5m2", "--cache-type-v", "q8"]
    ref = greedy(tiny_gptoss, prompts_file, *types, max_new=24, ctx=64)["ids"]
    got = greedy(tiny_gptoss, prompts_file, *types, "--kv-block", 3, max_new=24, ctx=64)["ids"]
    assert got == ref


# a q4 K is smoothed (its rows less the mean of the slot's first 16): the
# mean is rebuilt from the cache after a preemption's recompute too
@pytest.mark.parametrize("types", [QUANT, ["--cache-type-k", "q4", "--cache-type-v", "q8"]])
def test_pipeline_and_small_pool_quantized(types, smollm2, prompts_file):
    ref = greedy(smollm2, prompts_file, *types)["ids"]
    full = len(PROMPTS) * (CTX // 8)
    got = greedy(smollm2, prompts_file, *types, "--plan", "pipeline:2", "--kv-block", 8, "--kv-blocks", full)
    assert got["ids"] == ref
    got = greedy(smollm2, prompts_file, *types, "--plan", "pipeline:2", "--kv-blocks", 4)
    assert got["ids"] == ref
    got = greedy(smollm2, prompts_file, *types, "--kv-blocks", 4)
    assert got["ids"] == ref


def test_prefix_hit_smoothed_q4_k(smollm2, tmp_path):
    """A smoothed q4 K (rows from 16 on stored less the mean of the slot's
    first 16): a prompt repeated one stream after the other takes its
    blocks from the prefix cache, rebuilds the mean from those rows and
    continues as the stream that computed them. The f32 recent rows and
    sinks are off here (IE_KV_RECENT=0): they belong to the slot that
    computed them, so a stream continuing from a hit reads the hit's rows
    in q4 where the first stream read them in f32 (docs/KVCACHE.md); with
    them on the hit is still taken and their bytes reported."""
    long = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
            "must be in want of a wife. However little known the feelings or views of such a man may be")
    p = tmp_path / "same.txt"
    p.write_text(long + "\n" + long + "\n")
    args = ["--model", smollm2, "--prompts-file", p, "--batch", 1, "--max-new", 8, "--greedy",
            "--threads", THREADS, "--no-pin", "--ctx", CTX, "--kv-block", 8,
            "--cache-type-k", "q4", "--cache-type-v", "q8"]
    out = run_json(args, timeout=300, env={"IE_KV_RECENT": "0"})
    assert out["kv_hits"] >= 32, out
    assert out["ids"][0] == out["ids"][1]
    assert out["kv_recent_bytes"] == 0
    out = run_json(args, timeout=300)
    assert out["kv_hits"] >= 32, out
    # 64 window rows and 4 sinks of 30 layers x 3 KV heads x 64 floats, 1
    # slot, for K and for the quantized V
    assert out["kv_recent_bytes"] == 2 * (64 + 4) * 30 * 3 * 64 * 4


def test_tensor_plan_quantized_block_size(smollm2, prompts_file):
    """tensor:2 splits the KV heads between the ranks; each rank encodes its
    own heads, so the block size still changes no id."""
    ref = greedy(smollm2, prompts_file, *QUANT, "--plan", "tensor:2")["ids"]
    full = len(PROMPTS) * (CTX // 8)
    got = greedy(smollm2, prompts_file, *QUANT, "--plan", "tensor:2", "--kv-block", 8, "--kv-blocks", full)
    assert got["ids"] == ref


def test_json_reports_types_and_bytes(smollm2, prompts_file):
    out = greedy(smollm2, prompts_file, *QUANT, max_new=2)
    assert out["cache_type_k"] == "q8" and out["cache_type_v"] == "fp8_e4m3"
    # SmolLM2-135M: 30 layers x 3 KV heads x (64 + 4 bytes q8, 64 bytes fp8)
    assert out["kv_bytes_per_token"] == 30 * 3 * (68 + 64)
    out = greedy(smollm2, prompts_file, max_new=2)
    assert out["cache_type_k"] == "f32" and out["kv_bytes_per_token"] == 30 * 3 * 2 * 64 * 4


def test_mem_budget_sizes_pool(smollm2, prompts_file):
    """--kv-mem-mb: the pool is the whole blocks the budget holds in the
    chosen types (a q8 cache ~3.8x the f32 cache's positions), the ids are
    the full pool's."""
    f32 = greedy(smollm2, prompts_file, "--kv-mem-mb", 8, max_new=2)
    assert f32["kv_pool_positions"] == (8 << 20) // (46080 * 16) * 16
    ref = greedy(smollm2, prompts_file, *QUANT)
    got = greedy(smollm2, prompts_file, *QUANT, "--kv-mem-mb", 8)
    per = 30 * 3 * (68 + 64)
    assert got["kv_pool_positions"] == (8 << 20) // (per * 16) * 16
    assert got["kv_pool_positions"] > 3 * f32["kv_pool_positions"]
    assert got["ids"] == ref["ids"]
    # a plan: each rank's budget (tests/e2e/test_kv_ring.py)


@pytest.mark.parametrize("flag,value,hint", [
    ("--cache-type-k", "q5_1", "expected f32, f16, bf16, q8 (q8_0), q4 (q4_0), fp8_e4m3 or fp8_e5m2"),
    ("--cache-type-v", "", "expected f32"),
    ("--kv-rotate", "yes", "expected on, off or auto")])
def test_bad_values_exit_2(flag, value, hint, smollm2):
    cp = run_cli(["--model", smollm2, "--prompt", "hi", "--max-new", 1, flag, value], timeout=60)
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: bad value '{value}' for {flag}"), cp.stderr
    assert hint in lines[0]


def test_head_size_the_type_cannot_hold(tiny_gptoss):
    cp = run_cli(["--model", tiny_gptoss, "--prompt", "hi", "--max-new", 1, "--no-pin", "--cache-type-k", "q4"],
                 timeout=60)
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and "KV cache type q4 cannot hold a head of" in lines[0], cp.stderr
