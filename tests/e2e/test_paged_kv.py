"""End-to-end checks of the paged KV cache (--kv-block, --kv-blocks) through
the inference-engine CLI.

  a) Embedded: any block size (1, 5, 16, 64) gives the default run's greedy
     ids: attention over blocks is bit-identical to one contiguous pass, the
     sliding-window layers of GPT-OSS included.
  b) Distributed, in-process workers (--plan tensor:2 / pipeline:2) with an
     explicit pool (--kv-block 8 --kv-blocks = every slot's whole context,
     which the workers learn from their assignment): pipeline gives the
     embedded engine's greedy ids; tensor gives its own default-pool ids (its
     partial sums are added in another order than the embedded engine's, so
     a near tie may go the other way — docs/OPERATIONS.md — but never
     because of the block size).
  c) A pool far smaller than every slot's whole context: the scheduler binds
     blocks as streams grow and preempts when they run out, with the default
     pool's ids, embedded and distributed; a pool too small for one request
     fails with one clear line. Explicit binds through the cluster (order of
     clears and binds on every rank, a failing step's operations still
     applied on every pipeline stage) are exercised in
     tests/unit/test_paged.c.
  d) Bad values of the flags exit 2 with one error line.

Environment as in conftest.py (IE_BIN, IE_SMOLLM2, IE_FIXTURES_DIR).
"""
from __future__ import annotations

import pytest

from conftest import THREADS, fixture_path, run_cli, run_json

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):"]
CTX = 256
MAX_NEW = 16


def greedy_ids(model, prompts_file, *extra, max_new=MAX_NEW, ctx=CTX):
    out = run_json(["--model", model, "--prompts-file", prompts_file, "--batch", len(PROMPTS),
                    "--max-new", max_new, "--greedy", "--threads", THREADS, "--ctx", ctx, "--no-pin",
                    *extra], timeout=300)
    ids = out["ids"]
    assert isinstance(ids, list) and len(ids) == len(PROMPTS), out
    return ids


@pytest.fixture
def prompts_file(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text("\n".join(PROMPTS) + "\n")
    return p


@pytest.fixture(scope="module")
def tiny_gptoss():
    return fixture_path("tiny_gptoss.gguf")


@pytest.mark.parametrize("block", [1, 5, 64])
def test_block_size_does_not_change_greedy_ids(block, smollm2, prompts_file):
    ref = greedy_ids(smollm2, prompts_file)
    got = greedy_ids(smollm2, prompts_file, "--kv-block", block)
    assert got == ref, f"--kv-block {block}: {got} != {ref}"


@pytest.mark.parametrize("block", [1, 3, 16])
def test_block_size_gptoss_sliding_window(block, tiny_gptoss, prompts_file):
    # window 8 on layers 0 and 2: a window starting inside a block
    ref = greedy_ids(tiny_gptoss, prompts_file, max_new=24, ctx=64)
    got = greedy_ids(tiny_gptoss, prompts_file, "--kv-block", block, max_new=24, ctx=64)
    assert got == ref, f"--kv-block {block}: {got} != {ref}"


def reference(model, prompts_file, plan, **kw):
    """What a paged run must reproduce: embedded for pipeline (bit-identical
    to it), the same tensor plan with the default pool for tensor."""
    return greedy_ids(model, prompts_file, *(("--plan", plan) if plan.startswith("tensor") else ()), **kw)


@pytest.mark.parametrize("plan", ["tensor:2", "pipeline:2"])
def test_distributed_explicit_pool(plan, smollm2, prompts_file):
    ref = reference(smollm2, prompts_file, plan)
    full = len(PROMPTS) * (CTX // 8)  # every slot's whole context in blocks of 8
    got = greedy_ids(smollm2, prompts_file, "--plan", plan, "--kv-block", 8, "--kv-blocks", full)
    assert got == ref, f"--plan {plan}: {got} != {ref}"


@pytest.mark.parametrize("plan", ["tensor:2", "pipeline:2"])
def test_distributed_explicit_pool_gptoss(plan, tiny_gptoss, prompts_file):
    ref = reference(tiny_gptoss, prompts_file, plan, max_new=24, ctx=64)
    full = len(PROMPTS) * -(-64 // 3)
    got = greedy_ids(tiny_gptoss, prompts_file, "--plan", plan, "--kv-block", 3, "--kv-blocks", full,
                     max_new=24, ctx=64)
    assert got == ref, f"--plan {plan}: {got} != {ref}"


@pytest.mark.parametrize("plan", ["none", "tensor:2", "pipeline:2"])
def test_small_pool_scheduler_binds_and_preempts(plan, smollm2, prompts_file):
    """A pool far smaller than every slot's context: the scheduler binds the
    blocks it hands out and preempts a stream when they run out; the ids are
    those of the default pool."""
    ref = reference(smollm2, prompts_file, plan)
    # 3 prompts of ~6 tokens + 24 new in blocks of 16: 2 blocks each at the end;
    # 4 blocks hold two streams at their longest, so the third waits or is preempted
    got = greedy_ids(smollm2, prompts_file, *(("--plan", plan) if plan != "none" else ()), "--kv-blocks", 4)
    assert got == ref, f"--plan {plan}: {got} != {ref}"


def test_pool_too_small_for_one_request_fails_clearly(smollm2):
    cp = run_cli(["--model", smollm2, "--prompt", PROMPTS[0] * 20, "--max-new", 4, "--greedy", "--threads",
                  THREADS, "--ctx", CTX, "--no-pin", "--kv-blocks", 2], timeout=120)
    assert cp.returncode != 0, (cp.returncode, cp.stderr)
    assert cp.stdout == ""
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), cp.stderr
    assert "KV blocks" in lines[0], lines[0]


@pytest.mark.parametrize("flag,value", [("--kv-block", "0"), ("--kv-block", "65537"), ("--kv-block", "8x"),
                                        ("--kv-blocks", "-1"), ("--kv-blocks", "many"),
                                        ("--kv-blocks", "99999999999")])
def test_bad_values_exit_2(flag, value, smollm2):
    cp = run_cli(["--model", smollm2, "--prompt", "hi", "--max-new", 1, flag, value], timeout=60)
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert cp.stderr.strip() == f"error: bad value '{value}' for {flag}", cp.stderr
