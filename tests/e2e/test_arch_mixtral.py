"""Mixtral (sparse MoE Llama): the engine's logits vs transformers' (fp32).

Fixtures from tests/reference/gen_tiny_mixtral.py: 2 layers, hidden 64, 4
heads / 2 KV heads, rope_theta 1e6, 8 SwiGLU experts of width 32, top-2
(softmax over all 8 router logits, top-2, renormalized), weights exact in
bf16 and f16:

  tiny_mixtral/             MixtralForCausalLM, router block_sparse_moe.gate,
                            experts block_sparse_moe.experts.N.w1/w3/w2
                            -> tiny_mixtral/expected.npz
  tiny_mixtral_q8_0.gguf    as llama.cpp converts it: "llama" with
                            llama.expert_count / expert_used_count, Q/K
                            permuted, stacked ffn_*_exps, Q8_0 (router f32)
                            -> tiny_mixtral_q8_0.expected.npz (transformers
                            on the dequantized weights)
  tiny_mixtral with num_experts_per_tok 3 (config copied and edited here)
                            -> tiny_mixtral_top3.expected.npz
  tiny_mixtral with the experts fused as transformers 5 holds them in memory
  (mlp.gate, mlp.experts.gate_up_proj / down_proj, written here)
                            -> tiny_mixtral/expected.npz

Metric: rel = max over positions of max|ours - ref| / max|ref|.
  --precision f32: rel <= 1e-4, prefill and decode.
  --precision native / int8w, IEBIN from ie-convert (default manifest
    quant-llama.json: int8w projections and expert stacks, router as
    stored): median rel <= 0.05, at most 2 positions above 0.1, argmax
    agreement >= 90% (int8 rounding may move a router's 2nd/3rd choice, as
    for Qwen3-MoE).
  --plan pipeline:2 / tensor:2 (f32): the same greedy ids as one worker and
    rel <= 1e-4 (the tensor plan gives each rank 4 of the 8 experts).
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
    ("tiny_mixtral", "tiny_mixtral/expected.npz"),
    ("tiny_mixtral_q8_0.gguf", "tiny_mixtral_q8_0.expected.npz"),
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
    assert rel.max() <= 1e-5, f"{name}: prefill vs decode rel {rel.max():.3g}"


def _check_bounded(model: Path, expected: str, precision: str, tmp: Path):
    ids, ref = _expected(expected)
    ours = engine_logits(model, ids, tmp, precision=precision, mode="prefill")
    rel = row_rel_err(ours, ref)
    agree = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    assert np.median(rel) <= 0.05, f"{model.name}: {precision} median rel {np.median(rel):.3g}"
    assert int(np.sum(rel > 0.1)) <= 2, f"{model.name}: {precision} positions above 0.1: {rel}"
    assert agree >= 0.9, f"{model.name}: {precision} argmax agreement {agree:.2f}"


@pytest.mark.parametrize("precision", ["native", "int8w"])
@pytest.mark.parametrize("name,expected", MODELS, ids=IDS)
def test_quantized_bounded(name, expected, precision, tmp_path, ie_bin):
    _check_bounded(fixture_path(name), expected, precision, tmp_path)


@pytest.mark.parametrize("name,expected", MODELS, ids=IDS)
def test_iebin_int8w_bounded(name, expected, tmp_path, ie_bin):
    """ie-convert with its default manifest, quant-llama.json, whose rules
    cover Mixtral's expert stacks (the router stays as stored); the IEBIN
    then runs natively within the int8w bounds."""
    out = tmp_path / "iebin"
    cp = subprocess.run([str(binary("ie-convert")), "--in", str(fixture_path(name)), "--out-dir", str(out),
                         "--quiet", "--threads", "2"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert Path(json.loads(cp.stdout)["manifest"]).name == "quant-llama.json"
    ie = json.loads((out / "model.ie.json").read_text())
    dt = {t["name"]: t["dtype"] for t in ie["tensors"]}
    assert dt["blk.1.ffn_down_exps.weight"] == "int8w", dt
    assert dt["blk.1.ffn_gate_inp.weight"] != "int8w", dt
    _check_bounded(out, expected, "native", tmp_path)


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
def test_top3_from_config(mode, tmp_path, ie_bin):
    """num_experts_per_tok is read, not assumed: top-3 over the same weights."""
    d = _link_copy(fixture_path("tiny_mixtral"), tmp_path / "top3")
    _edit_config(d, num_experts_per_tok=3)
    ours = _check_f32(d, "tiny_mixtral_top3.expected.npz", mode, tmp_path)
    _, top2 = _expected("tiny_mixtral/expected.npz")
    assert row_rel_err(ours, top2).max() > 1e-2


def test_fused_experts_layout(tmp_path, ie_bin):
    """transformers 5's in-memory names and layout saved as is: mlp.gate,
    mlp.experts.gate_up_proj [E, 2I, H] (w1 rows first, then w3),
    mlp.experts.down_proj [E, H, I]."""
    src = fixture_path("tiny_mixtral")
    d = _link_copy(src, tmp_path / "fused")
    (d / "model.safetensors").unlink()
    t = st_load(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    E = cfg["num_local_experts"]
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        moe = pre + "block_sparse_moe."
        w = {k: np.stack([t.pop(f"{moe}experts.{e}.{k}.weight") for e in range(E)]) for k in ("w1", "w2", "w3")}
        t[pre + "mlp.experts.gate_up_proj"] = np.concatenate([w["w1"], w["w3"]], axis=1)
        t[pre + "mlp.experts.down_proj"] = w["w2"]
        t[pre + "mlp.gate.weight"] = t.pop(moe + "gate.weight")
    st_save(d / "model.safetensors", t)
    _check_f32(d, "tiny_mixtral/expected.npz", "prefill", tmp_path)


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


def test_generate_same_ids_across_plans(tmp_path, ie_bin):
    """Text in (the fixtures' tokenizer), greedy ids out: one worker and
    pipeline:2 / tensor:2 agree, for the HF dir and for the GGUF."""
    for model in ("tiny_mixtral", "tiny_mixtral_q8_0.gguf"):
        ref = _generate(fixture_path(model), "none", tmp_path)
        assert any(len(r) > 1 for r in ref), ref
        for plan in ("pipeline:2", "tensor:2"):
            got = _generate(fixture_path(model), plan, tmp_path)
            assert got == ref, f"{model} --plan {plan}: {got} != {ref}"


# ------------------------------------------------------------------ bad input
def _run(ie_bin, model: Path):
    return subprocess.run([str(ie_bin), "logits", "--model", str(model), "--ids", "5,6,7", "--out",
                           str(model.parent / "out.f32")], capture_output=True, text=True, timeout=60)


def _hf_copy(tmp: Path) -> Path:
    dst = tmp / "m"
    shutil.copytree(fixture_path("tiny_mixtral"), dst)
    return dst


def _pop_tensor(d: Path, key: str):
    t = st_load(d / "model.safetensors")
    t.pop(key)
    st_save(d / "model.safetensors", t)


def _drop_field(d: Path, field: str):
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop(field)
    (d / "config.json").write_text(json.dumps(cfg))


HF_CASES = {
    "missing router": (lambda d: _pop_tensor(d, "model.layers.1.block_sparse_moe.gate.weight"),
                       ["blk.1.ffn_gate_inp.weight", "model.layers.1.block_sparse_moe.gate.weight"]),
    "missing expert": (lambda d: _pop_tensor(d, "model.layers.0.block_sparse_moe.experts.6.w3.weight"),
                       ["model.layers.0.block_sparse_moe.experts.6.w3.weight"]),
    "fewer experts than stored": (lambda d: _edit_config(d, num_local_experts=7),
                                  ["ffn_gate_inp", "block_sparse_moe.gate.weight"]),
    "more experts than stored": (lambda d: _edit_config(d, num_local_experts=9),
                                 ["model.layers.0.block_sparse_moe.experts.8.w1.weight"]),
    "expert count absent": (lambda d: _drop_field(d, "num_local_experts"), ["num_local_experts"]),
    "top-k above experts": (lambda d: _edit_config(d, num_experts_per_tok=9), ["num_experts_per_tok"]),
    "top-k zero": (lambda d: _edit_config(d, num_experts_per_tok=0), ["num_experts_per_tok"]),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_bad_hf_exits_3(case, tmp_path, ie_bin):
    breaker, needles = HF_CASES[case]
    d = _hf_copy(tmp_path)
    breaker(d)
    cp = _run(ie_bin, d)
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    for n in needles:
        assert n in cp.stderr, f"{case}: {n!r} not in {cp.stderr!r}"


def _patch_gguf(src: Path, dst: Path, old: bytes, new: bytes | None = None, *, u32_after: int | None = None):
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


GGUF = "tiny_mixtral_q8_0.gguf"
GGUF_CASES = {
    "top-k above experts": (dict(old=b"llama.expert_used_count", u32_after=9), ["llama.expert_used_count"]),
    "top-k absent": (dict(old=b"llama.expert_used_count", new=b"llama.expert_used_cwunt"),
                     ["llama.expert_used_count"]),
    "expert count inconsistent": (dict(old=b"llama.expert_count", u32_after=6), ["blk.0.ffn_gate_inp.weight"]),
    "missing router": (dict(old=b"blk.1.ffn_gate_inp.weight", new=b"blk.1.ffn_gate_inp.weighx"),
                       ["blk.1.ffn_gate_inp.weight"]),
    "missing expert stack": (dict(old=b"blk.1.ffn_up_exps.weight", new=b"blk.1.ffn_up_exps.weighx"),
                             ["blk.1.ffn_up_exps.weight"]),
    # llama.cpp's old layout, one tensor per expert (blk.N.ffn_up.E.weight):
    # refused naming the tensor rather than read as a dense Llama
    "experts one per tensor": (dict(old=b"blk.0.ffn_norm.weight", new=b"blk.0.ffn_up.0.weight"),
                               ["blk.0.ffn_up.0.weight"]),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_bad_gguf_exits_3(case, tmp_path, ie_bin):
    patch, needles = GGUF_CASES[case]
    d = _patch_gguf(fixture_path(GGUF), tmp_path / GGUF, **patch)
    cp = _run(ie_bin, d)
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    for n in needles:
        assert n in cp.stderr, f"{case}: {n!r} not in {cp.stderr!r}"


def test_dense_llama_gguf_unchanged(tmp_path, ie_bin):
    """expert_count 0 is a plain Llama: the dense tensors are what it needs."""
    d = _patch_gguf(fixture_path(GGUF), tmp_path / GGUF, old=b"llama.expert_count", u32_after=0)
    cp = _run(ie_bin, d)
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    assert "blk.0.ffn_gate.weight" in cp.stderr, cp.stderr
