"""GPT-OSS bad input through the CLI: missing tensors, wrong shapes and an
inconsistent config exit 3 with one error line naming the tensor or field.
Each case copies the tiny HF fixture into tmp and breaks one thing."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from safetensors.numpy import load_file, save_file

from conftest import EXIT_MODEL, fixture_path


def _copy(tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(fixture_path("tiny_gptoss"), dst)
    return dst


def _edit_config(d, **kv):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(kv)
    (d / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(d, fn):
    t = load_file(str(d / "model.safetensors"))
    fn(t)
    save_file(t, str(d / "model.safetensors"))


def _run(ie_bin, model):
    return subprocess.run([str(ie_bin), "logits", "--model", str(model), "--ids", "1,2,3", "--out",
                           str(model.parent / "out.f32")], capture_output=True, text=True, timeout=60)


CASES = {
    "too many experts used": (lambda d: _edit_config(d, num_experts_per_tok=9), "num_experts_per_tok"),
    "layer_types too short": (lambda d: _edit_config(d, layer_types=["sliding_attention"]), "layer_types"),
    "heads not divisible": (lambda d: _edit_config(d, num_key_value_heads=3), "num_key_value_heads"),
    "missing sinks": (lambda d: _edit_tensors(d, lambda t: t.pop("model.layers.1.self_attn.sinks")),
                      "attn_sinks"),
    "wrong expert shape": (lambda d: _edit_tensors(
        d, lambda t: t.update({"model.layers.0.mlp.experts.down_proj":
                               t["model.layers.0.mlp.experts.down_proj"][:, :-1, :].copy()})),
        "down_proj"),
    "missing router bias": (lambda d: _edit_tensors(d, lambda t: t.pop("model.layers.2.mlp.router.bias")),
                            "router"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_gptoss_exits_3(case, tmp_path, ie_bin):
    breaker, needle = CASES[case]
    d = _copy(tmp_path)
    breaker(d)
    cp = _run(ie_bin, d)
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    assert cp.stdout == ""
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), cp.stderr
    assert needle in lines[0], f"error does not name {needle!r}: {lines[0]}"


def test_unbroken_copy_runs(tmp_path, ie_bin):
    """The copies are valid until broken: the same run succeeds untouched."""
    cp = _run(ie_bin, _copy(tmp_path))
    assert cp.returncode == 0, cp.stderr
