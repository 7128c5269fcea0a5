"""Hot-weight replicas (IE_HOT_REPLICATE, docs/OPERATIONS.md) through the CLI.

This machine has one NUMA node, so the copies are made on fake nodes
(IE_NUMA_FAKE_NODES=2): the logits files are byte-identical with and
without copies (SmolLM2's tied head, tiny GPT-OSS's separate head and
embedding), the JSON line reports the copies, and on the real topology
nothing is copied ("1 node: no replicas needed").
"""
from __future__ import annotations

import pytest

from conftest import THREADS, fixture_path, run_cli, run_json

FAKE2 = {"IE_HOT_REPLICATE": "1", "IE_NUMA_FAKE_NODES": "2"}
OFF = {"IE_HOT_REPLICATE": "0"}


def logits_bytes(model, tmp_path, tag, env, mode="prefill"):
    out = tmp_path / f"{tag}.f32"
    info = run_json(["logits", "--model", model, "--ids", "1,504,345,314,464,314,216", "--mode", mode,
                     "--threads", max(THREADS, 2), "--out", out], env=env)
    return info, out.read_bytes()


@pytest.mark.parametrize("which", ["smollm2", "gptoss"])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_logits_identical_with_copies(which, mode, smollm2, tmp_path):
    model = smollm2 if which == "smollm2" else fixture_path("tiny_gptoss.gguf")
    _, ref = logits_bytes(model, tmp_path, "ref", OFF, mode)
    _, hot = logits_bytes(model, tmp_path, "hot", FAKE2, mode)
    assert len(ref) > 0 and hot == ref


def test_json_reports_copies(smollm2):
    args = ["--model", smollm2, "--prompt", "The capital of France is", "--max-new", 8, "--greedy",
            "--threads", max(THREADS, 2)]
    off = run_json(args, env=OFF)
    hot = run_json(args, env=FAKE2)
    real = run_json(args, env={"IE_HOT_REPLICATE": "1"})
    assert off["hot_replicas"] == 0 and "hot_repl" not in off
    assert hot["hot_replicas"] == 2, hot.get("hot_repl")
    assert "token_embd.weight (tied head) 2 x" in hot["hot_repl"], hot["hot_repl"]
    assert hot["ids"] == off["ids"] == real["ids"]
    assert real["hot_replicas"] == 0
    # this machine: one node
    assert real["hot_repl"] == "1 node: no replicas needed", real["hot_repl"]


def test_cap_and_bad_values(smollm2):
    args = ["--model", smollm2, "--prompt", "Hi", "--max-new", 2, "--greedy", "--threads", max(THREADS, 2)]
    capped = run_json(args, env={**FAKE2, "IE_HOT_REPL_LIMIT_MB": "10"})
    assert capped["hot_replicas"] == 0
    assert "skipped token_embd.weight (tied head)" in capped["hot_repl"], capped["hot_repl"]
    cp = run_cli(args, env={**FAKE2, "IE_HOT_REPL_LIMIT_MB": "ten"})
    assert cp.returncode == 2 and "IE_HOT_REPL_LIMIT_MB" in cp.stderr, cp.stderr


def test_help_mentions_it():
    cp = run_cli(["--help"])
    assert cp.returncode == 0 and "IE_HOT_REPLICATE=1" in cp.stdout and "IE_HOT_REPL_LIMIT_MB" in cp.stdout
