"""Qwen3 and Qwen3-MoE (issue 19): the engine's logits vs transformers' (fp32).

Fixtures from tests/reference/gen_tiny_qwen3.py: 2 layers, hidden 64, 4 heads
/ 2 KV heads, head_dim 32 (explicit: hidden / heads would be 16), per-head
q/k RMS norms, rope_theta 1e6, weights exact in bf16 and f16 so one
reference serves the HF dir (bf16) and the GGUF (f16):

  tiny_qwen3/ + tiny_qwen3.gguf        dense, tied head -> tiny_qwen3/expected.npz
  tiny_qwen3moe/                       8 experts top-2 (softmax over all, top-2,
                                       renormalized: norm_topk_prob true), SwiGLU
                                       experts of width 32 -> tiny_qwen3moe/expected.npz
  tiny_qwen3moe_q8_0.gguf              its GGUF, 2-D weights and expert stacks
                                       Q8_0 -> tiny_qwen3moe_q8_0.expected.npz
                                       (transformers on the dequantized weights)
  tiny_qwen3moe with norm_topk_prob false (config copied and flipped here)
                                       -> tiny_qwen3moe_nonorm.expected.npz
  tiny_qwen3moe with the experts fused as transformers 5 holds them in memory
  (mlp.experts.gate_up_proj / down_proj, written here) -> tiny_qwen3moe/expected.npz

Metric: rel = max over positions of max|ours - ref| / max|ref|.
  --precision f32: rel <= 1e-4, prefill and decode (measured ~7e-7).
  --precision native: measured 5e-3 (bf16 HF), 7e-5 (Q8_0 GGUF), 7e-7 (f16
    GGUF) -> the int8w bounds below.
  --precision int8w: dense rel 0.019 (measured), all greedy ids equal -> bound
    0.05 and equal argmax. MoE: median 0.024, one position at 0.24 (int8
    rounding moves a router's 2nd/3rd choice: the smallest top-2 gap in the
    prompt is 2e-3; Q8_0: max 0.14, median 0.002) -> median <= 0.05, at most 2 positions above 0.1,
    argmax agreement >= 90%.
  --plan pipeline:2 / tensor:2 (f32): the same greedy ids as one worker and
    rel <= 1e-4 from the reference (tensor ranks sum partials in another
    order; the MoE's tensor plan gives each rank 4 of the 8 experts).
  ie-convert (default manifest: int8w projections, and experts for
    qwen3moe) -> IEBIN, native: the int8w bounds.
Bad input (HF and GGUF copies broken one thing at a time) exits 3 naming the
field or tensor.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import EXIT_MODEL, binary, engine_logits, fixture_path, read_logits, row_rel_err, run_json, st_load, st_save

TOL = 1e-4
MODELS = [
    ("tiny_qwen3", "tiny_qwen3/expected.npz"),
    ("tiny_qwen3.gguf", "tiny_qwen3/expected.npz"),
    ("tiny_qwen3moe", "tiny_qwen3moe/expected.npz"),
    ("tiny_qwen3moe_q8_0.gguf", "tiny_qwen3moe_q8_0.expected.npz"),
]
IDS = [m[0] for m in MODELS]


def _expected(rel):
    d = np.load(fixture_path(rel))
    ids, ref = d["ids"], d["logits"]
    assert ids.shape == (32,) and ref.shape == (32, 512)
    return ids, ref


def _check_f32(model: Path, expected: str, mode: str, tmp: Path):
    ids, ref = _expected(expected)
    ours = engine_logits(model, ids, tmp, precision="f32", mode=mode)
    rel = row_rel_err(ours, ref)
    assert rel.max() <= TOL, f"{model.name} {mode}: rel {rel.max():.3g} at position {rel.argmax()}"
    return ours


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("name,expected", MODELS, ids=IDS)
def test_f32_matches_transformers(name, expected, mode, tmp_path, ie_bin):
    _check_f32(fixture_path(name), expected, mode, tmp_path)


@pytest.mark.parametrize("name,expected", MODELS, ids=IDS)
def test_prefill_equals_decode(name, expected, tmp_path, ie_bin):
    ids, _ = _expected(expected)
    pre = engine_logits(fixture_path(name), ids, tmp_path, precision="native", mode="prefill")
    dec = engine_logits(fixture_path(name), ids, tmp_path, precision="native", mode="decode")
    rel = row_rel_err(dec, pre)
    assert rel.max() <= TOL, f"{name}: prefill vs decode rel {rel.max():.3g}"


@pytest.mark.parametrize("name,expected", MODELS, ids=IDS)
def test_native_bounded(name, expected, tmp_path, ie_bin):
    """--precision native: f16/bf16 weights may meet rounded activations,
    Q8_0 ones int8 activations (ISA-dependent): the int8w bounds."""
    _check_bounded(name, expected, "native", tmp_path)


def _link_copy(src: Path, dst: Path) -> Path:
    """dst/ with src's files symlinked (config.json copied, to be edited)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "config.json":
            shutil.copy(f, dst / f.name)
        else:
            (dst / f.name).symlink_to(f.resolve())
    return dst


def _edit_config(d: Path, **kv):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(kv)
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_moe_without_topk_renormalization(mode, tmp_path, ie_bin):
    d = _link_copy(fixture_path("tiny_qwen3moe"), tmp_path / "nonorm")
    _edit_config(d, norm_topk_prob=False)
    ours = _check_f32(d, "tiny_qwen3moe_nonorm.expected.npz", mode, tmp_path)
    # and it is not the renormalized model's answer
    _, normed = _expected("tiny_qwen3moe/expected.npz")
    assert row_rel_err(ours, normed).max() > 1e-2


def test_moe_fused_experts_layout(tmp_path, ie_bin):
    """transformers 5's in-memory layout saved as is: gate_up_proj [E, 2I, H]
    (gate rows first), down_proj [E, H, I]."""
    src = fixture_path("tiny_qwen3moe")
    d = _link_copy(src, tmp_path / "fused")
    (d / "model.safetensors").unlink()
    t = st_load(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    E = cfg.get("num_experts", cfg.get("num_local_experts"))
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}.mlp.experts."
        g = np.stack([t.pop(f"{pre}{e}.gate_proj.weight") for e in range(E)])
        u = np.stack([t.pop(f"{pre}{e}.up_proj.weight") for e in range(E)])
        t[pre + "gate_up_proj"] = np.concatenate([g, u], axis=1)
        t[pre + "down_proj"] = np.stack([t.pop(f"{pre}{e}.down_proj.weight") for e in range(E)])
    st_save(d / "model.safetensors", t)
    _check_f32(d, "tiny_qwen3moe/expected.npz", "prefill", tmp_path)


@pytest.mark.parametrize("name,expected", MODELS, ids=IDS)
def test_int8w_bounded(name, expected, tmp_path, ie_bin):
    _check_bounded(name, expected, "int8w", tmp_path)


def _check_bounded(name, expected, precision, tmp_path):
    ids, ref = _expected(expected)
    ours = engine_logits(fixture_path(name), ids, tmp_path, precision=precision, mode="prefill")
    rel = row_rel_err(ours, ref)
    agree = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    if "moe" not in name:
        assert rel.max() <= 0.05, f"{name}: {precision} rel {rel.max():.3g}"
        assert agree == 1.0, f"{name}: {precision} greedy ids differ ({agree:.2f} agree)"
        return
    assert np.median(rel) <= 0.05, f"{name}: {precision} median rel {np.median(rel):.3g}"
    assert int(np.sum(rel > 0.1)) <= 2, f"{name}: {precision} positions above 0.1: {rel}"
    assert agree >= 0.9, f"{name}: {precision} argmax agreement {agree:.2f}"


@pytest.mark.parametrize("name,expected", MODELS, ids=IDS)
def test_iebin_int8w_bounded(name, expected, tmp_path, ie_bin):
    """ie-convert with its default manifest (quant-llama.json for qwen3,
    quant-qwen3moe.json: int8w g32 projections and expert stacks, router as
    stored), then the IEBIN runs natively: the same bounds as --precision
    int8w."""
    out = tmp_path / "iebin"
    cp = subprocess.run([str(binary("ie-convert")), "--in", str(fixture_path(name)), "--out-dir", str(out),
                         "--quiet", "--threads", "2"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    manifest = json.loads(cp.stdout)["manifest"]
    assert Path(manifest).name == ("quant-qwen3moe.json" if "moe" in name else "quant-llama.json"), manifest
    if "moe" in name:  # the experts were quantized too
        ie = json.loads((out / "model.ie.json").read_text())
        dt = {t["name"]: t["dtype"] for t in ie["tensors"]}
        assert dt["blk.1.ffn_down_exps.weight"] == "int8w", dt
        assert dt["blk.1.ffn_gate_inp.weight"] != "int8w", dt
    ids, ref = _expected(expected)
    ours = engine_logits(out, ids, tmp_path, precision="native", mode="prefill")
    rel = row_rel_err(ours, ref)
    agree = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    assert np.median(rel) <= 0.05, f"{name}: IEBIN median rel {np.median(rel):.3g}"
    assert int(np.sum(rel > 0.1)) <= (2 if "moe" in name else 0), f"{name}: IEBIN rel {rel}"
    assert agree >= (0.9 if "moe" in name else 1.0), f"{name}: IEBIN argmax agreement {agree:.2f}"


def _plan_logits(model: Path, ids, plan: str, tmp: Path) -> np.ndarray:
    out = tmp / f"plan_{plan.replace(':', '_')}_{model.name}.f32"
    info = run_json(["logits", "--model", model, "--ids", ",".join(map(str, ids)), "--precision", "f32",
                     "--mode", "decode", "--threads", "2", "--plan", plan, "--out", out], timeout=300)
    return read_logits(out, len(ids), info["n_vocab"])


@pytest.mark.parametrize("plan", ["pipeline:2", "tensor:2"])
@pytest.mark.parametrize("name,expected", MODELS, ids=IDS)
def test_plans_same_greedy_ids(name, expected, plan, tmp_path, ie_bin):
    ids, ref = _expected(expected)
    one = engine_logits(fixture_path(name), ids, tmp_path, precision="f32", mode="decode")
    got = _plan_logits(fixture_path(name), ids, plan, tmp_path)
    assert np.array_equal(got.argmax(-1), one.argmax(-1)), f"{name} --plan {plan}: greedy ids differ"
    rel = row_rel_err(got, ref)
    assert rel.max() <= TOL, f"{name} --plan {plan}: rel {rel.max():.3g}"


PROMPTS = ["The quick brown fox", "def f(x): return x * 2", "Inference engines read weights"]


def _generate(model: Path, plan: str, tmp: Path) -> list:
    pf = tmp / "prompts.txt"
    pf.write_text("\n".join(PROMPTS) + "\n")
    out = run_json(["--model", model, "--prompts-file", pf, "--max-new", 12, "--greedy", "--threads", 2,
                    "--plan", plan])
    ids = out["ids"]
    assert isinstance(ids, list) and len(ids) == len(PROMPTS), out
    return ids


@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_qwen3moe"])
def test_generate_same_ids_across_formats_and_plans(family, tmp_path, ie_bin):
    """Text in (the fixtures' tokenizer), greedy ids out: the HF dir and the
    GGUF, one worker and pipeline:2 / tensor:2, all agree."""
    ref = _generate(fixture_path(family), "none", tmp_path)
    assert any(len(r) > 1 for r in ref), ref
    gguf = {"tiny_qwen3": "tiny_qwen3.gguf", "tiny_qwen3moe": "tiny_qwen3moe_q8_0.gguf"}[family]
    for model, plan in [(family, "pipeline:2"), (family, "tensor:2"), (gguf, "none"), (gguf, "tensor:2")]:
        got = _generate(fixture_path(model), plan, tmp_path)
        assert got == ref, f"{model} --plan {plan}: {got} != {ref}"


# ------------------------------------------------------------------ bad input
def _run(ie_bin, model: Path):
    return subprocess.run([str(ie_bin), "logits", "--model", str(model), "--ids", "5,6,7", "--out",
                           str(model.parent / "out.f32")], capture_output=True, text=True, timeout=60)


def _hf_copy(tmp: Path, name: str) -> Path:
    dst = tmp / "m"
    shutil.copytree(fixture_path(name), dst)
    return dst


def _pop_tensor(d: Path, key: str):
    t = st_load(d / "model.safetensors")
    t.pop(key)
    st_save(d / "model.safetensors", t)


HF_CASES = {
    "missing q_norm": ("tiny_qwen3", lambda d: _pop_tensor(d, "model.layers.1.self_attn.q_norm.weight"),
                       ["attn_q_norm", "self_attn.q_norm"]),
    "moe missing k_norm": ("tiny_qwen3moe", lambda d: _pop_tensor(d, "model.layers.0.self_attn.k_norm.weight"),
                           ["attn_k_norm"]),
    "top-k above experts": ("tiny_qwen3moe", lambda d: _edit_config(d, num_experts_per_tok=9),
                            ["num_experts_per_tok"]),
    "expert count inconsistent": ("tiny_qwen3moe", lambda d: _edit_config(d, num_local_experts=7),
                                  ["ffn_gate_inp", "mlp.gate.weight"]),
    "missing expert": ("tiny_qwen3moe", lambda d: _pop_tensor(d, "model.layers.1.mlp.experts.5.up_proj.weight"),
                       ["model.layers.1.mlp.experts.5.up_proj.weight"]),
    "dense layers among experts": ("tiny_qwen3moe", lambda d: _edit_config(d, mlp_only_layers=[1]),
                                   ["mlp_only_layers"]),
    "sliding window": ("tiny_qwen3", lambda d: _edit_config(d, use_sliding_window=True), ["use_sliding_window"]),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_bad_hf_exits_3(case, tmp_path, ie_bin):
    name, breaker, needles = HF_CASES[case]
    d = _hf_copy(tmp_path, name)
    breaker(d)
    cp = _run(ie_bin, d)
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    for n in needles:
        assert n in cp.stderr, f"{case}: {n!r} not in {cp.stderr!r}"


def _patch_gguf(src: Path, dst: Path, old: bytes, new: bytes, *, u32_after: int | None = None):
    """Copy src to dst replacing the one occurrence of `old` by `new` (same
    length), or with u32_after: the uint32 value of key `old` (after its
    4-byte value type) set to u32_after."""
    raw = bytearray(src.read_bytes())
    at = raw.find(old)
    assert at >= 0 and raw.find(old, at + 1) < 0, f"{old!r} not found exactly once"
    if u32_after is None:
        assert len(old) == len(new)
        raw[at:at + len(old)] = new
    else:
        vt = int.from_bytes(raw[at + len(old):at + len(old) + 4], "little")
        assert vt == 4, f"{old!r} is not a uint32 key (type {vt})"
        v = at + len(old) + 4
        raw[v:v + 4] = u32_after.to_bytes(4, "little")
    dst.write_bytes(bytes(raw))
    return dst


GGUF_CASES = {
    "missing q_norm": ("tiny_qwen3.gguf", dict(old=b"blk.1.attn_q_norm.weight", new=b"blk.1.attn_q_nrrm.weight"),
                       ["blk.1.attn_q_norm.weight"]),
    "top-k above experts": ("tiny_qwen3moe_q8_0.gguf", dict(old=b"qwen3moe.expert_used_count", new=None, u32_after=9),
                            ["qwen3moe.expert_used_count"]),
    "expert count inconsistent": ("tiny_qwen3moe_q8_0.gguf",
                                  dict(old=b"qwen3moe.expert_count", new=None, u32_after=6),
                                  ["blk.0.ffn_gate_inp.weight"]),
    "missing expert stack": ("tiny_qwen3moe_q8_0.gguf",
                             dict(old=b"blk.1.ffn_down_exps.weight", new=b"blk.1.ffn_down_exps.weighx"),
                             ["blk.1.ffn_down_exps.weight"]),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_bad_gguf_exits_3(case, tmp_path, ie_bin):
    name, patch, needles = GGUF_CASES[case]
    d = _patch_gguf(fixture_path(name), tmp_path / name, **patch)
    cp = _run(ie_bin, d)
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    for n in needles:
        assert n in cp.stderr, f"{case}: {n!r} not in {cp.stderr!r}"
