"""End-to-end checks of the sliding layers' ring (docs/KVCACHE.md, "Sliding
layers") and of --kv-mem-mb on cluster plans, through the CLI.

  a) Tiny GPT-OSS (window 8; layers: sliding, full, sliding) decoded far
     past its window: the JSON line reports a ring of one 16-position block
     and a pool of the full layer only (256 bytes a token in f32, not 768);
     the ids are the same with any block size, through pipeline:2 and
     tensor:2, and with a pool so small that streams are preempted and
     recomputed; f32 and q8 caches.
  b) --kv-mem-mb pays for the rings first, then whole blocks of the full
     layers.
  c) --kv-mem-mb on a plan: each rank's budget holds the blocks of its own
     layers and KV heads; the pool is the fewest of any rank (pipeline:2,
     tensor:2 on SmolLM2), and the ids are the plan's default pool's.
"""
from __future__ import annotations

import pytest

from conftest import THREADS, run_json
# the KV cache types' helpers and fixtures: the ring is one more layout of that cache
from test_kv_cache_types import PROMPTS, QUANT, greedy, prompts_file, tiny_gptoss  # noqa: F401


# tiny GPT-OSS: 2 KV heads of 16; f32 K and V: 256 bytes a layer and token
LAYER_F32 = 2 * 16 * 4 * 2
LAYER_Q8 = 2 * (16 + 4) * 2


@pytest.mark.parametrize("types,layer", [([], LAYER_F32), (["--cache-type-k", "q8", "--cache-type-v", "q8"],
                                                           LAYER_Q8)])
def test_gptoss_ring_past_window(tiny_gptoss, prompts_file, types, layer):
    ref = greedy(tiny_gptoss, prompts_file, *types, max_new=120)
    assert ref["kv_ring_positions"] == 16  # the window 8 and 7 more: one block of 16
    assert ref["kv_bytes_per_token"] == 1 * layer  # the full layer only
    assert ref["kv_ring_bytes"] == len(PROMPTS) * 16 * 2 * layer
    # random weights: a stream may meet its EOS early (q8, the MXFP4 experts on
    # their panels: one at 34 tokens); each runs past the 16-position ring twice
    lens = [len(ids) for ids in ref["ids"]]
    assert min(lens) >= 2 * 16 and max(lens) == 120, lens
    for extra in (["--kv-block", 3], ["--plan", "pipeline:2"], ["--plan", "tensor:2", "--kv-block", 5],
                  ["--kv-blocks", 12], ["--plan", "pipeline:2", "--kv-blocks", 12]):
        got = greedy(tiny_gptoss, prompts_file, *types, *extra, max_new=120)
        assert got["ids"] == ref["ids"], extra
    ring3 = greedy(tiny_gptoss, prompts_file, *types, "--kv-block", 3, max_new=2)
    assert ring3["kv_ring_positions"] == 15


def test_gptoss_ring_takes_no_prefix_hits(tiny_gptoss, tmp_path):
    """A slot holds only its own last positions of the sliding layers: a
    prompt repeated one stream after the other is computed again (no
    prefix-cache hit); with --kv-swa-full it hits."""
    long = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen " * 3
    p = tmp_path / "same.txt"
    p.write_text(long + "\n" + long + "\n")
    out = run_json(["--model", tiny_gptoss, "--prompts-file", p, "--batch", 1, "--max-new", 4, "--greedy",
                    "--threads", THREADS, "--no-pin"], timeout=120)
    assert out["kv_ring_positions"] > 0 and out["kv_hits"] == 0, out
    assert out["ids"][0] == out["ids"][1]
    # --kv-swa-full: the sliding layers in the pool, the prefix hit back;
    # the same ids, and a pool cost per token of all 3 layers
    full = run_json(["--model", tiny_gptoss, "--prompts-file", p, "--batch", 1, "--max-new", 4, "--greedy",
                     "--threads", THREADS, "--no-pin", "--kv-swa-full"], timeout=120)
    assert full["kv_ring_positions"] == 0 and full["kv_ring_bytes"] == 0 and full["kv_hits"] > 0, full
    assert full["kv_bytes_per_token"] == 3 * LAYER_F32
    assert full["ids"] == out["ids"]
    # and through a plan (the flag travels in the workers' assignment)
    plan = run_json(["--model", tiny_gptoss, "--prompts-file", p, "--batch", 1, "--max-new", 4, "--greedy",
                     "--threads", THREADS, "--no-pin", "--kv-swa-full", "--plan", "pipeline:2"], timeout=120)
    assert plan["kv_hits"] > 0 and plan["ids"] == out["ids"], plan


def test_gptoss_mem_budget_pays_rings_first(tiny_gptoss, prompts_file):
    out = greedy(tiny_gptoss, prompts_file, "--kv-mem-mb", 1, max_new=2, ctx=4096)
    ring = len(PROMPTS) * 16 * 2 * LAYER_F32
    assert out["kv_ring_bytes"] == ring
    assert out["kv_pool_positions"] == ((1 << 20) - ring) // (16 * LAYER_F32) * 16


SMOL_HEAD = 68 + 64  # q8 K, fp8_e4m3 V: bytes of one head
@pytest.mark.parametrize("plan,layers,heads", [("pipeline:2", 15, 3), ("tensor:2", 30, 2)])
def test_mem_budget_on_plans(smollm2, prompts_file, plan, layers, heads):
    """SmolLM2 (30 layers, 3 KV heads): pipeline:2 ranks hold 15 layers of
    3 heads, tensor:2 ranks 30 layers of 2 heads (the cut group's KV head
    is held by both): a budget of 2 MiB a rank holds 2 MiB / (their bytes
    a block) blocks, more than the embedded engine's 30 x 3. The ids are
    those of the plan's default pool (tensor:2 sums in its own order, so
    its ids are its own; pipeline:2's are the embedded engine's)."""
    ref = greedy(smollm2, prompts_file, *QUANT, "--kv-mem-mb", 2)
    assert ref["kv_pool_positions"] == (2 << 20) // (30 * 3 * SMOL_HEAD * 16) * 16
    got = greedy(smollm2, prompts_file, *QUANT, "--plan", plan, "--kv-mem-mb", 2)
    assert got["kv_pool_positions"] == (2 << 20) // (layers * heads * SMOL_HEAD * 16) * 16
    assert got["kv_pool_positions"] > ref["kv_pool_positions"]
    assert got["ids"] == greedy(smollm2, prompts_file, *QUANT, "--plan", plan)["ids"]
    if plan.startswith("pipeline"):
        assert got["ids"] == ref["ids"]
