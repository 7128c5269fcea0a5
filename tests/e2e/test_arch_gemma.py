"""Tiny random Gemma 2 and Gemma 3 (text) models: the engine's logits vs
transformers' (fp32, eager attention).

Fixtures come from tests/reference/gen_tiny_gemma.py (its docstring has the
shapes): Gemma 2 with attention soft-cap 5 and final soft-cap 3 (the
generator checks that dropping either moves the logits by > 5%), 3 layers
alternating sliding (window 8) / global; Gemma 3 with q/k norms, 6 layers
(five sliding, one global), sliding RoPE base 10000, global base 100 with
linear scaling 4, query_pre_attn_scalar 24 != head_dim 16 in the HF
directory. Each as an HF directory and as the GGUF llama.cpp's converter
writes (norms + 1, tied head). tiny_gemma3.gguf has no query_pre_attn_scalar
(llama.cpp uses head_dim^-1/2), so its reference is its own.

Metric: rel = max over positions of max|ours - ref| / max|ref|.
  f32 (prefill and decode, HF and GGUF): rel <= 1e-4 (measured ~2e-6).
  int8w (weights int8, activations quantized): same greedy ids at >= 90%
    of positions, median rel <= 0.05, max <= 0.2 (measured: Gemma 2
    median 0.036 / max 0.10 / argmax 100%, Gemma 3 0.012 / 0.03-0.04 / 97%;
    Gemma 2's final soft-cap at 3 squeezes the logits, so the error is
    large relative to their range).
  pipeline:2 / tensor:2: the same greedy ids as the reference at every
    position, and f32 logits within 1e-4 (tensor ranks sum partials in
    another order; the post-norms run on the whole sum).
  ie-convert -> IEBIN (the default manifest's int8 matrices; the HF
    directory's converted norms + 1 are what it stores): the int8w bounds.
  transformers 4.x configs (no layer_types / rope_parameters: Gemma 2's
    parity default, Gemma 3's sliding_window_pattern, rope_local_base_freq,
    rope_scaling): the same f32 bound.
  A bf16 checkpoint (bf16 norms converted + 1) equals an f32 one of the
    same values exactly.
  Bad input exits 3 naming the field or tensor.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import EXIT_MODEL, binary, engine_logits, fixture_path, row_rel_err, run_json

CASES = [
    ("tiny_gemma2", "tiny_gemma2/expected.npz"),
    ("tiny_gemma2.gguf", "tiny_gemma2/expected.npz"),
    ("tiny_gemma3", "tiny_gemma3/expected.npz"),
    ("tiny_gemma3.gguf", "tiny_gemma3.gguf.expected.npz"),
]
IDS = [c[0] for c in CASES]
TOL = 1e-4
INT8W = dict(median_rel=0.05, max_rel=0.2, argmax=0.90)


def _expected(rel):
    d = np.load(fixture_path(rel))
    ids, ref = d["ids"], d["logits"]
    assert ids.shape == (32,) and ref.shape == (32, 512)
    return ids, ref


def _logits(model, ids, tmp_path, precision, mode, plan=None):
    if plan is None:
        return engine_logits(model, ids, tmp_path, precision=precision, mode=mode)
    out = tmp_path / f"logits_{plan.replace(':', '_')}_{precision}_{mode}.f32"
    info = run_json(["logits", "--model", model, "--ids", ",".join(str(int(i)) for i in ids), "--precision",
                     precision, "--mode", mode, "--threads", 2, "--plan", plan, "--out", out], timeout=300)
    assert info.get("n_tokens") == len(ids), info
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("name,expected", CASES, ids=IDS)
def test_f32_matches_transformers(name, expected, mode, tmp_path, ie_bin):
    ids, ref = _expected(expected)
    ours = engine_logits(fixture_path(name), ids, tmp_path, precision="f32", mode=mode)
    rel = row_rel_err(ours, ref)
    assert rel.max() <= TOL, f"{name} {mode}: rel {rel.max():.3g} at position {rel.argmax()}"


@pytest.mark.parametrize("name,expected", CASES, ids=IDS)
def test_prefill_equals_decode(name, expected, tmp_path, ie_bin):
    ids, _ = _expected(expected)
    pre = engine_logits(fixture_path(name), ids, tmp_path, precision="f32", mode="prefill")
    dec = engine_logits(fixture_path(name), ids, tmp_path, precision="f32", mode="decode")
    rel = row_rel_err(dec, pre)
    assert rel.max() <= 1e-5, f"{name}: prefill vs decode rel {rel.max():.3g} at position {rel.argmax()}"


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("name,expected", CASES, ids=IDS)
def test_int8w_bounded(name, expected, mode, tmp_path, ie_bin):
    ids, ref = _expected(expected)
    ours = engine_logits(fixture_path(name), ids, tmp_path, precision="int8w", mode=mode)
    rel = row_rel_err(ours, ref)
    agree = np.mean(ours.argmax(-1) == ref.argmax(-1))
    assert rel.max() > 1e-6, f"{name}: int8w logits equal f32's: the quantized path did not run"
    assert np.median(rel) <= INT8W["median_rel"], f"{name} {mode}: median rel {np.median(rel):.3g}"
    assert rel.max() <= INT8W["max_rel"], f"{name} {mode}: max rel {rel.max():.3g} at {rel.argmax()}"
    assert agree >= INT8W["argmax"], f"{name} {mode}: argmax agreement {agree:.2f}"


@pytest.mark.parametrize("plan", ["pipeline:2", "tensor:2"])
@pytest.mark.parametrize("name,expected", CASES, ids=IDS)
def test_plans_same_greedy_ids(name, expected, plan, tmp_path, ie_bin):
    ids, ref = _expected(expected)
    ours = _logits(fixture_path(name), ids, tmp_path, "f32", "decode", plan)
    assert ours.shape == ref.shape
    np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1), err_msg=f"{name} --plan {plan}")
    rel = row_rel_err(ours, ref)
    assert rel.max() <= TOL, f"{name} --plan {plan}: rel {rel.max():.3g} at position {rel.argmax()}"


@pytest.mark.parametrize("name,expected", CASES, ids=IDS)
def test_iebin_bounded(name, expected, tmp_path, ie_bin):
    ids, ref = _expected(expected)
    out = tmp_path / "iebin"
    cp = subprocess.run([str(binary("ie-convert")), "--in", str(fixture_path(name)), "--out-dir", str(out),
                         "--quiet"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    ours = engine_logits(out, ids, tmp_path, precision="native", mode="decode")
    rel = row_rel_err(ours, ref)
    assert np.median(rel) <= INT8W["median_rel"], f"{name}: median rel {np.median(rel):.3g}"
    assert rel.max() <= INT8W["max_rel"], f"{name}: max rel {rel.max():.3g} at {rel.argmax()}"
    assert np.mean(ours.argmax(-1) == ref.argmax(-1)) >= INT8W["argmax"], name


# --------------------------------------- transformers 4.x configs (as on the Hub)
LEGACY = {
    # Gemma 2: no layer_types (even layers slide), top-level rope_theta
    "tiny_gemma2": dict(layer_types=None, rope_parameters=None, rope_theta=10000.0, dtype=None,
                        torch_dtype="float32", hidden_act="gelu_pytorch_tanh", sliding_window_size=8),
    # Gemma 3: sliding_window_pattern, rope_theta + rope_local_base_freq + rope_scaling
    "tiny_gemma3": dict(layer_types=None, rope_parameters=None, _sliding_window_pattern=None, rope_theta=100.0,
                        rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
                        sliding_window_pattern=6, dtype=None, torch_dtype="float32"),
}


@pytest.mark.parametrize("name", list(LEGACY))
def test_legacy_config(name, tmp_path, ie_bin):
    ids, ref = _expected(f"{name}/expected.npz")
    d = _copy(tmp_path, name)
    _edit_config(d, **{k: _DROP if v is None else v for k, v in LEGACY[name].items()})
    ours = engine_logits(d, ids, tmp_path, precision="f32", mode="prefill")
    rel = row_rel_err(ours, ref)
    assert rel.max() <= TOL, f"{name} (4.x config): rel {rel.max():.3g} at position {rel.argmax()}"


# ------------------------------------------------- bf16 checkpoints (as released)
def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _save_bf16(tensors: dict, path):
    """A safetensors file of BF16 tensors (numpy has no bfloat16 dtype)."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        b = _bf16_bits(tensors[name]).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def test_bf16_checkpoint_norms_and_embedding_scale(tmp_path, ie_bin):
    """A bf16 Gemma 3 directory (norms converted bf16 -> f32 + 1 at load)
    gives the same f32 logits as an f32 directory holding the same rounded
    values; its config dtype rounds the embedding scale to bf16 as
    transformers does (sqrt(32) = 5.656854 -> 5.65625), which moves the
    logits a little against the float32-labelled copy (measured 1.6e-4;
    the bf16 and f32 directories agree exactly)."""
    ids, _ = _expected("tiny_gemma3/expected.npz")
    t = load_file(str(fixture_path("tiny_gemma3") / "model.safetensors"))
    rounded = {k: (_bf16_bits(v).astype(np.uint32) << 16).view(np.float32).reshape(v.shape) for k, v in t.items()}
    dirs = {}
    for tag, dtype in [("bf16", "bfloat16"), ("f32", "bfloat16"), ("f32_label", "float32")]:
        d = _copy(tmp_path / tag, "tiny_gemma3")
        _edit_config(d, dtype=dtype)
        if tag == "bf16":
            _save_bf16(t, d / "model.safetensors")
        else:
            save_file(rounded, str(d / "model.safetensors"))
        dirs[tag] = d
    lg = {tag: engine_logits(d, ids, tmp_path / tag, precision="f32", mode="prefill") for tag, d in dirs.items()}
    rel = row_rel_err(lg["bf16"], lg["f32"])
    assert rel.max() <= 1e-6, f"bf16 vs f32 copy of the same values: rel {rel.max():.3g}"
    moved = row_rel_err(lg["f32"], lg["f32_label"]).max()
    assert 1e-5 < moved < 1e-3, f"bfloat16 vs float32 label: rel {moved:.3g} (embedding scale rounding)"


# ------------------------------------------------------------------ bad input
def _copy(tmp_path, name):
    dst = tmp_path / "m"
    shutil.copytree(fixture_path(name), dst)
    return dst


def _edit_config(d, **kv):
    cfg = json.loads((d / "config.json").read_text())
    for k, v in kv.items():
        if v is _DROP:
            cfg.pop(k)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(d, fn):
    t = load_file(str(d / "model.safetensors"))
    fn(t)
    save_file(t, str(d / "model.safetensors"))


_DROP = object()


def _run(ie_bin, model):
    return subprocess.run([str(ie_bin), "logits", "--model", str(model), "--ids", "1,2,3", "--out",
                           str(model.parent / "out.f32")], capture_output=True, text=True, timeout=60)


HF_CASES = {
    "gemma2 no hidden_size": ("tiny_gemma2", lambda d: _edit_config(d, hidden_size=_DROP), "hidden_size"),
    "gemma2 layer_types too short": ("tiny_gemma2", lambda d: _edit_config(d, layer_types=["full_attention"]),
                                     "layer_types"),
    "gemma2 activation": ("tiny_gemma2", lambda d: _edit_config(d, hidden_activation="relu"),
                          "hidden_activation"),
    "gemma2 negative softcap": ("tiny_gemma2", lambda d: _edit_config(d, attn_logit_softcapping=-1.0),
                                "attn_logit_softcapping"),
    "gemma2 missing post_feedforward_layernorm": (
        "tiny_gemma2", lambda d: _edit_tensors(d, lambda t: t.pop("model.layers.1.post_feedforward_layernorm.weight")),
        "post_ffw_norm"),
    "gemma3 missing q_norm": (
        "tiny_gemma3", lambda d: _edit_tensors(d, lambda t: t.pop("model.layers.2.self_attn.q_norm.weight")),
        "attn_q_norm"),
    "gemma3 wrong k_norm shape": (
        "tiny_gemma3", lambda d: _edit_tensors(d, lambda t: t.update(
            {"model.layers.0.self_attn.k_norm.weight": t["model.layers.0.self_attn.k_norm.weight"][:-1].copy()})),
        "attn_k_norm"),
    "gemma3 rope type": ("tiny_gemma3", lambda d: _edit_config(d, rope_parameters={
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 100.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}), "rope_parameters.full_attention"),
    "gemma3 multimodal": ("tiny_gemma3", lambda d: _edit_config(d, architectures=["Gemma3ForConditionalGeneration"]),
                          "Gemma3ForConditionalGeneration"),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_bad_hf_exits_3(case, tmp_path, ie_bin):
    name, breaker, needle = HF_CASES[case]
    d = _copy(tmp_path, name)
    breaker(d)
    cp = _run(ie_bin, d)
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    assert needle in cp.stderr, cp.stderr


def _gguf_rename_tensor(src, dst, old: str, new: str):
    """Copy a GGUF with one tensor name changed in place (same length)."""
    assert len(old) == len(new)
    buf = bytearray(src.read_bytes())
    at = buf.find(old.encode())
    assert at > 0 and buf.find(old.encode(), at + 1) < 0, old
    buf[at:at + len(old)] = new.encode()
    dst.write_bytes(bytes(buf))


@pytest.mark.parametrize("name,old,new,needle", [
    ("tiny_gemma2.gguf", "blk.1.post_ffw_norm.weight", "blk.1.post_ffw_norx.weight", "blk.1.post_ffw_norm.weight"),
    ("tiny_gemma3.gguf", "blk.4.attn_k_norm.weight", "blk.4.attn_k_norx.weight", "blk.4.attn_k_norm.weight"),
    ("tiny_gemma2.gguf", "gemma2.attention.layer_norm_rms_epsilon", "gemma2.attention.layer_norm_rms_epsilox",
     "gemma2.attention.layer_norm_rms_epsilon"),
])
def test_bad_gguf_exits_3(name, old, new, needle, tmp_path, ie_bin):
    bad = tmp_path / name
    _gguf_rename_tensor(fixture_path(name), bad, old, new)
    cp = _run(ie_bin, bad)
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    assert needle in cp.stderr, cp.stderr
