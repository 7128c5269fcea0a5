"""Phi-3 / Phi-3.5 (model_phi3.c): the engine's logits vs transformers' (fp32).

Fixtures from tests/reference/gen_tiny_phi3.py (tiny_phi3_manifest.json):
  tiny_phi3                  HF bf16, plain RoPE, sliding window 12 on every
                             layer (a 32-token prompt crosses it), GQA 4/2
  tiny_phi3_f16.gguf         llama.cpp's layout: fused blk.N.attn_qkv and
  tiny_phi3_q8_0.gguf        blk.N.ffn_up (gate rows first), no Q/K permutation
  tiny_phi3_longrope         longrope, partial_rotary_factor 0.75, original
  tiny_phi3_longrope_f16.gguf  context 16 < 32 tokens < context 64: the long
                             factors and the attention factor sqrt(1.5)
  tiny_phi3_longrope_short   the same weights, legacy "su" config with
                             original context = context: the short factors
Each expected file holds the ids [32] and fp32 logits [32][512] transformers
computes from exactly the stored weights (GGUF: dequantized by gguf).

Checks
  * --precision f32, prefill and decode: rel <= 1e-4 for every model (the
    fused tensors are split into views without copying; a wrong split, gate/up
    order, window, factor set or attention factor is O(1))
  * native precision of the q8_0 GGUF (fused q8_0 rows cut as views and
    repacked) and --precision int8w of the HF dir: bounded like
    test_forward_tiny's quantized bounds (rel <= 6e-2, rms <= 3e-2, argmax at
    >= 90% of positions)
  * --plan pipeline:2 / tensor:2 (tensor plans cut the q/k/v and gate/up
    views by heads / columns): f32 logits within 1e-4 of the reference, so the
    same greedy ids
  * ie-convert to IEBIN: separate attn_q/k/v and ffn_gate/ffn_up (no fused
    tensor), both RoPE factor sets, same f32 logits
  * bad input -> exit 3, one error line naming the tensor or field
"""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import EXIT_MODEL, FIXTURES, THREADS, binary, engine_logits, fixture_path, read_logits, \
    row_rel_err, st_load, st_save

TOL_F32 = 1e-4
Q_MAX_REL, Q_RMS_REL, Q_ARGMAX = 6e-2, 3e-2, 0.90
EXPECTED = {"tiny_phi3", "tiny_phi3_f16.gguf", "tiny_phi3_q8_0.gguf", "tiny_phi3_longrope",
            "tiny_phi3_longrope_f16.gguf", "tiny_phi3_longrope_short"}


def _manifest():
    p = FIXTURES / "tiny_phi3_manifest.json"
    return json.loads(p.read_text())["models"] if p.is_file() else []


MODELS = _manifest()


def test_manifest_complete():
    fixture_path("tiny_phi3_manifest.json")
    assert EXPECTED <= {m["name"] for m in MODELS}


def _entry(name):
    return next(m for m in MODELS if m["name"] == name)


def _expected(name):
    d = np.load(fixture_path(_entry(name)["expected"]))
    assert d["ids"].shape == (32,) and d["logits"].shape == (32, 512)
    return d["ids"], d["logits"]


def _quant_bounds(ours, ref, what):
    rel = float(row_rel_err(ours, ref).max())
    rms = float(np.sqrt(np.mean((ours - ref) ** 2) / np.mean(ref ** 2)))
    agree = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    assert rel <= Q_MAX_REL and rms <= Q_RMS_REL and agree >= Q_ARGMAX, \
        f"{what}: rel {rel:.3e} rms {rms:.3e} argmax agreement {agree:.2f}"


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_f32_logits(name, mode, tmp_path):
    ids, ref = _expected(name)
    ours = engine_logits(fixture_path(_entry(name)["path"]), ids, tmp_path, precision="f32", mode=mode)
    rel = row_rel_err(ours, ref)
    assert rel.max() <= TOL_F32, f"{name} {mode}: rel {rel.max():.3e} at position {int(rel.argmax())}"


def test_long_and_short_factor_sets_differ():
    """The two longrope references must be far apart, or the factor-set
    choice would be untested."""
    _, long_ref = _expected("tiny_phi3_longrope")
    _, short_ref = _expected("tiny_phi3_longrope_short")
    assert row_rel_err(short_ref, long_ref).max() > 0.05


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_q8_0_gguf_native(mode, tmp_path):
    ids, ref = _expected("tiny_phi3_q8_0.gguf")
    ours = engine_logits(fixture_path("tiny_phi3_q8_0.gguf"), ids, tmp_path, precision="native", mode=mode)
    _quant_bounds(ours, ref, f"q8_0 native {mode}")


@pytest.mark.parametrize("name", ["tiny_phi3", "tiny_phi3_longrope"])
def test_int8w(name, tmp_path):
    ids, ref = _expected(name)
    ours = engine_logits(fixture_path(name), ids, tmp_path, precision="int8w")
    _quant_bounds(ours, ref, f"{name} int8w")


def _plan_logits(model, ids, plan, tmp_path, precision="f32"):
    out = tmp_path / f"plan_{plan.replace(':', '_')}.f32"
    cp = subprocess.run([str(binary("inference-engine")), "logits", "--model", str(model), "--ids",
                         ",".join(map(str, ids)), "--mode", "decode", "--threads", str(THREADS), "--precision",
                         precision, "--plan", plan, "--out", str(out)], capture_output=True, text=True,
                        timeout=300)
    assert cp.returncode == 0, f"--plan {plan}: {cp.stderr[-2000:]}"
    return read_logits(out, len(ids), 512)


@pytest.mark.parametrize("plan", ["pipeline:2", "tensor:2"])
@pytest.mark.parametrize("name", ["tiny_phi3", "tiny_phi3_q8_0.gguf", "tiny_phi3_longrope_f16.gguf"])
def test_plans(name, plan, tmp_path):
    ids, ref = _expected(name)
    ours = _plan_logits(fixture_path(_entry(name)["path"]), ids, plan, tmp_path)
    rel = row_rel_err(ours, ref)
    assert rel.max() <= TOL_F32, f"{name} --plan {plan}: rel {rel.max():.3e}"
    assert np.array_equal(ours.argmax(-1), ref.argmax(-1)), f"{name} --plan {plan}: greedy ids differ"


def test_plan_tensor_q8_0_native_greedy(tmp_path):
    """Native q8_0 kernels on the cut views: the same greedy ids as one worker."""
    ids, _ = _expected("tiny_phi3_q8_0.gguf")
    model = fixture_path("tiny_phi3_q8_0.gguf")
    one = engine_logits(model, ids, tmp_path, precision="native", mode="decode")
    two = _plan_logits(model, ids, "tensor:2", tmp_path, precision="native")
    assert np.mean(one.argmax(-1) == two.argmax(-1)) >= Q_ARGMAX


@pytest.mark.parametrize("name", ["tiny_phi3", "tiny_phi3_longrope"])
def test_iebin_round_trip(name, tmp_path):
    from test_convert import convert_ok  # the converter's runner (IE_CONVERT)
    out = tmp_path / "ie"
    convert_ok(["--in", fixture_path(name), "--out-dir", out, "--quiet", "--q4-map", _keep_manifest(tmp_path)])
    names = {t["name"] for t in json.loads((out / "model.ie.json").read_text())["tensors"]}
    for l in (0, 1):
        assert {f"blk.{l}.attn_{x}.weight" for x in "qkv"} <= names
        assert {f"blk.{l}.ffn_gate.weight", f"blk.{l}.ffn_up.weight"} <= names
        assert f"blk.{l}.attn_qkv.weight" not in names
    if name == "tiny_phi3_longrope":
        assert {"rope_freqs.weight", "rope_freqs_long.weight"} <= names
    ids, ref = _expected(name)
    ours = engine_logits(out, ids, tmp_path, precision="f32")
    assert row_rel_err(ours, ref).max() <= TOL_F32


def _keep_manifest(tmp_path):
    p = tmp_path / "keep.json"
    p.write_text(json.dumps({"version": 1, "rules": [{"pattern": ".", "dtype": "keep"}]}))
    return p


# ------------------------------------------------------------------ bad input
def _copy_hf(tmp_path, name):
    dst = tmp_path / "m"
    shutil.copytree(fixture_path(name), dst, symlinks=False)
    return dst


def _edit_tensors(d, fn):
    t = st_load(d / "model.safetensors")
    fn(t)
    st_save(d / "model.safetensors", t)


def _edit_config(d, fn):
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


def _gguf_edit(src, dst, fn):
    """Rewrite a GGUF with gguf-py: fn(name, array) -> array or None (drop)."""
    import gguf
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "phi3")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(f.name, f.contents(), vt)
    for t in r.tensors:
        a = fn(t.name, np.array(t.data))
        if a is None:
            continue
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(t.name, a)
        else:
            w.add_tensor(t.name, a, raw_shape=a.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _run(model):
    return subprocess.run([str(binary("inference-engine")), "logits", "--model", str(model), "--ids", "1,2,3",
                           "--out", str(model.parent / "out.f32")], capture_output=True, text=True, timeout=60)


def _drop_qkv_row(t):
    k = "model.layers.1.self_attn.qkv_proj.weight"
    t[k] = t[k][:-1].copy()


def _short_long_factor(cfg):
    cfg["rope_parameters"]["long_factor"] = cfg["rope_parameters"]["long_factor"][:-1]


def _drop_gate_up_row(t):
    k = "model.layers.0.mlp.gate_up_proj.weight"
    t[k] = t[k][:-2].copy()


HF_CASES = {
    "fused qkv wrong rows": ("tiny_phi3", lambda d: _edit_tensors(d, _drop_qkv_row),
                             ["blk.1.attn_qkv.weight", "qkv_proj"]),
    "fused gate_up wrong rows": ("tiny_phi3", lambda d: _edit_tensors(d, _drop_gate_up_row),
                                 ["blk.0.ffn_up.weight", "gate_up_proj"]),
    "missing fused qkv": ("tiny_phi3", lambda d: _edit_tensors(
        d, lambda t: t.pop("model.layers.0.self_attn.qkv_proj.weight")), ["blk.0.attn_q.weight", "qkv_proj"]),
    "long_factor wrong length": ("tiny_phi3_longrope", lambda d: _edit_config(d, _short_long_factor),
                                 ["long_factor", "6"]),
    "unknown rope type": ("tiny_phi3", lambda d: _edit_config(
        d, lambda c: c["rope_parameters"].update(rope_type="dynamic")), ["dynamic"]),
    "bad partial_rotary_factor": ("tiny_phi3", lambda d: _edit_config(
        d, lambda c: c["rope_parameters"].update(partial_rotary_factor=1.5)), ["partial_rotary_factor"]),
}


def _check_exit_3(cp, needles):
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), cp.stderr
    for n in needles:
        assert n in lines[0], f"error does not name {n!r}: {lines[0]}"


@pytest.mark.parametrize("case", list(HF_CASES))
def test_bad_hf_exits_3(case, tmp_path):
    name, breaker, needles = HF_CASES[case]
    d = _copy_hf(tmp_path, name)
    breaker(d)
    _check_exit_3(_run(d), needles)


GGUF_CASES = {
    "fused qkv wrong rows": ("tiny_phi3_f16.gguf",
                             lambda n, a: a[:-1] if n == "blk.0.attn_qkv.weight" else a,
                             ["blk.0.attn_qkv.weight", "[64, 127]", "[64, 128]"]),
    "q8_0 fused gate_up wrong rows": ("tiny_phi3_q8_0.gguf",
                                      lambda n, a: a[:-1] if n == "blk.1.ffn_up.weight" else a,
                                      ["blk.1.ffn_up.weight", "[64, 255]"]),
    "rope_factors_long wrong length": ("tiny_phi3_longrope_f16.gguf",
                                       lambda n, a: a[:-1] if n == "rope_factors_long.weight" else a,
                                       ["rope_factors_long.weight", "[5]", "[6]"]),
    "rope_factors_short missing": ("tiny_phi3_longrope_f16.gguf",
                                   lambda n, a: None if n == "rope_factors_short.weight" else a,
                                   ["rope_factors_short.weight"]),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_bad_gguf_exits_3(case, tmp_path):
    name, fn, needles = GGUF_CASES[case]
    p = _gguf_edit(fixture_path(name), tmp_path / "bad.gguf", fn)
    _check_exit_3(_run(p), needles)


@pytest.mark.parametrize("name", ["tiny_phi3_f16.gguf", "tiny_phi3_longrope_f16.gguf"])
def test_gguf_rewrite_untouched_runs(name, tmp_path):
    """The GGUF rewriter alone keeps a valid model (the cases above break only one thing)."""
    p = _gguf_edit(fixture_path(name), tmp_path / "same.gguf", lambda n, a: a)
    ids, ref = _expected(name)
    ours = engine_logits(p, ids, tmp_path, precision="f32")
    assert row_rel_err(ours, ref).max() <= TOL_F32
