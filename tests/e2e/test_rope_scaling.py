"""Linear and YaRN RoPE scaling for the Llama-shaped families (Llama /
Mistral, Qwen2 / Qwen2.5, Qwen3) against transformers.

Fixtures (tests/reference/gen_tiny_llama3.py, on tiny_qwen2's and
tiny_llama3's weights; the meta of each expected.npz names the RoPE object
and the config fields it was computed with):

  tiny_qwen2_yarn.expected.npz   YaRN as Qwen's docs configure it: factor 4,
      original_max_position_embeddings 1024 (the ramp rounded to pairs 0..3,
      cos/sin times 0.1 ln 4 + 1); moves the logits by ~0.2 rel against
      plain RoPE. HF: a copy of tiny_qwen2 with the object in config.json,
      as transformers 5 writes it (rope_parameters) and as Qwen's docs tell
      users to (rope_scaling + rope_theta). GGUF: tiny_qwen2_yarn.gguf
      (qwen2.rope.scaling.type / factor / original_context_length, as
      llama.cpp's converter writes them).
  tiny_qwen2_yarn_params.expected.npz   every optional parameter set: factor
      8, beta_fast 16, beta_slow 2, attention_factor 1.25, truncate false (HF;
      GGUF: the yarn_* keys, truncate being llama.cpp's rounding, is HF only).
  tiny_qwen3_yarn.expected.npz   (tests/reference/gen_tiny_qwen3.py) the
      same recipe on tiny_qwen3's weights (head_dim 32): HF as above, GGUF
      a copy of tiny_qwen3.gguf with the qwen3.rope.scaling.* keys added.
  tiny_llama_linear.expected.npz   linear factor 2 on tiny_llama3's weights:
      HF (a copy of tiny_llama3 with the object replaced) and
      tiny_llama_linear.gguf (llama.rope.scaling.type linear, factor 2, Q/K
      permuted, no rope_freqs.weight).

  * f32 prefill and decode logits within 1e-4 (row max rel) of transformers,
    also under pipeline:2 / tensor:2; an IEBIN from ie-convert within the
    int8w bound (5e-2; measured 1.6e-2 / 2.0e-2, greedy ids 31/32 and
    32/32: tiny_qwen2_yarn's position 15 is a 0.03 tie)
  * bad values (factor < 1, YaRN without original_max_position_embeddings,
    dynamic or unknown types, bad GGUF keys) exit 3 naming the field
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import binary, engine_logits, fixture_path, row_rel_err, run_cli

TOL_F32 = 1e-4


def expected(name: str):
    e = np.load(fixture_path(f"{name}.expected.npz"))
    meta = json.loads(str(e["meta"]))
    return e["ids"], e["logits"], json.loads(meta["rope"]), json.loads(meta["config"])


def hf_copy(src: str, name: str, tmp_path: Path, legacy: bool = False, edit=None) -> Path:
    """tmp_path/name: src's files linked, config.json with the fixture's RoPE
    object (legacy: as rope_scaling with a top-level rope_theta)."""
    _, _, rope, extra = expected(name)
    d = tmp_path / name
    d.mkdir()
    for f in fixture_path(src).iterdir():
        if f.name != "config.json":
            (d / f.name).symlink_to(f.resolve())
    cfg = json.loads((fixture_path(src) / "config.json").read_text())
    theta = cfg["rope_parameters"]["rope_theta"]
    cfg.update(extra)
    if legacy:
        del cfg["rope_parameters"]
        cfg["rope_theta"] = theta
        cfg["rope_scaling"] = dict(rope)
    else:
        cfg["rope_parameters"] = dict(rope, rope_theta=theta)
    if edit:
        edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def check_f32(model: Path, name: str, mode: str, tmp_path: Path) -> float:
    ids, ref, _, _ = expected(name)
    ours = engine_logits(model, ids, tmp_path, precision="f32", mode=mode)
    rel = row_rel_err(ours, ref)
    assert rel.max() <= TOL_F32, f"{model.name} {mode}: max rel {rel.max():.3e} at position {int(rel.argmax())}"
    return float(rel.max())


HF_CASES = [
    ("tiny_qwen2", "tiny_qwen2_yarn", False),
    ("tiny_qwen2", "tiny_qwen2_yarn", True),
    ("tiny_qwen2", "tiny_qwen2_yarn_params", False),
    ("tiny_qwen2", "tiny_qwen2_yarn_params", True),
    ("tiny_qwen3", "tiny_qwen3_yarn", False),
    ("tiny_qwen3", "tiny_qwen3_yarn", True),
    ("tiny_llama3", "tiny_llama_linear", False),
    ("tiny_llama3", "tiny_llama_linear", True),
]


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("src,name,legacy", HF_CASES,
                         ids=[f"{c[1]}-{'rope_scaling' if c[2] else 'rope_parameters'}" for c in HF_CASES])
def test_hf_f32(src, name, legacy, mode, tmp_path, ie_bin):
    check_f32(hf_copy(src, name, tmp_path, legacy), name, mode, tmp_path)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("name", ["tiny_qwen2_yarn", "tiny_llama_linear"])
def test_gguf_f32(name, mode, tmp_path, ie_bin):
    check_f32(fixture_path(f"{name}.gguf"), name, mode, tmp_path)


@pytest.mark.parametrize("name", ["tiny_qwen2_yarn", "tiny_llama_linear"])
def test_iebin_keeps_the_scaling(name, tmp_path, ie_bin):
    """ie-convert carries the scaling into the IEBIN (int8w projections:
    <= 5e-2 as the other tiny models, the same greedy ids wherever the
    reference's top-2 gap exceeds twice the row's error: tiny_qwen2_yarn's
    position 15 is a 0.03 tie)."""
    out = tmp_path / "iebin"
    cp = subprocess.run([str(binary("ie-convert")), "--in", str(fixture_path(f"{name}.gguf")), "--out-dir",
                         str(out), "--quiet"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    ids, ref, _, _ = expected(name)
    ours = engine_logits(out, ids, tmp_path, precision="native")
    assert row_rel_err(ours, ref).max() <= 5e-2
    top = np.sort(ref, axis=-1)
    clear = top[:, -1] - top[:, -2] > 2 * np.max(np.abs(ours - ref), axis=-1)
    assert clear.sum() >= len(ids) // 2
    assert np.array_equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.mark.parametrize("plan", ["pipeline:2", "tensor:2"])
@pytest.mark.parametrize("name", ["tiny_qwen2_yarn", "tiny_llama_linear"])
def test_plans(name, plan, tmp_path, ie_bin):
    """Every worker of a plan rotates with the scaled tables."""
    ids, ref, _, _ = expected(name)
    out = tmp_path / "plan.f32"
    cp = run_cli(["logits", "--model", fixture_path(f"{name}.gguf"), "--ids", ",".join(map(str, ids)),
                  "--precision", "f32", "--mode", "decode", "--threads", "2", "--plan", plan, "--out", out],
                 timeout=300)
    assert cp.returncode == 0, f"--plan {plan}: exit {cp.returncode}\n{cp.stderr[-2000:]}"
    ours = np.fromfile(out, dtype="<f4").reshape(len(ids), -1)
    assert row_rel_err(ours, ref).max() <= TOL_F32


def test_the_scaling_matters(tmp_path, ie_bin):
    """The same weights without the scaling (plain RoPE; tiny_llama3's own
    llama3 scaling) are far from the scaled references."""
    for plain, name in (("tiny_qwen2.gguf", "tiny_qwen2_yarn"), ("tiny_llama3", "tiny_llama_linear")):
        ids, ref, _, _ = expected(name)
        ours = engine_logits(fixture_path(plain), ids, tmp_path, precision="f32")
        assert row_rel_err(ours, ref).max() > 1e-2, plain


# ------------------------------------------------------------------ GGUF keys
def gguf_with_keys(src: Path, dst: Path, keys: dict, drop=()) -> Path:
    """src's keys and tensors with keys (name -> (value, GGUFValueType))
    set or added and the keys in drop removed."""
    import gguf
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
    from gguf_rewrite import copy_keys
    r = gguf.GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(str(dst), arch)

    class Only:  # the reader's fields less the replaced / dropped ones
        fields = {k: v for k, v in r.fields.items() if k not in keys and k not in drop}
    copy_keys(Only, w)
    for k, (v, t) in keys.items():
        w.add_key_value(k, v, t)
    for t in r.tensors:
        a = np.array(t.data, dtype=np.float32).reshape(tuple(int(x) for x in reversed(t.shape.tolist())))
        w.add_tensor(t.name, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def F32(v):
    import gguf
    return (float(v), gguf.GGUFValueType.FLOAT32)


def STR(v):
    import gguf
    return (v, gguf.GGUFValueType.STRING)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_qwen3_gguf_yarn(mode, tmp_path, ie_bin):
    """tiny_qwen3.gguf (f16) with the keys the converter writes for Qwen3's
    YaRN recipe."""
    import gguf
    _, _, rope, extra = expected("tiny_qwen3_yarn")
    k = {"qwen3.rope.scaling.type": STR("yarn"), "qwen3.rope.scaling.factor": F32(rope["factor"]),
         "qwen3.rope.scaling.original_context_length": (rope["original_max_position_embeddings"],
                                                        gguf.GGUFValueType.UINT32),
         "qwen3.context_length": (extra["max_position_embeddings"], gguf.GGUFValueType.UINT32)}
    g = gguf_with_keys(fixture_path("tiny_qwen3.gguf"), tmp_path / "yarn.gguf", k)
    check_f32(g, "tiny_qwen3_yarn", mode, tmp_path)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_gguf_yarn_params(mode, tmp_path, ie_bin):
    """The yarn_* keys llama.cpp's converter writes for beta_fast / beta_slow
    / attention_factor: tiny_qwen2_yarn_params but with the ramp rounded
    (llama.cpp has no truncate key), so checked against the HF directory
    with truncate true, the engine's own HF path."""
    k = {"qwen2.rope.scaling.factor": F32(8.0), "qwen2.rope.scaling.yarn_beta_fast": F32(16.0),
         "qwen2.rope.scaling.yarn_beta_slow": F32(2.0), "qwen2.rope.scaling.yarn_attn_factor": F32(1.25)}
    g = gguf_with_keys(fixture_path("tiny_qwen2_yarn.gguf"), tmp_path / "p.gguf", k)
    d = hf_copy("tiny_qwen2", "tiny_qwen2_yarn_params", tmp_path,
                edit=lambda c: c["rope_parameters"].update(truncate=True))
    ids, ref, _, _ = expected("tiny_qwen2_yarn_params")
    ours_g = engine_logits(g, ids, tmp_path, precision="f32", mode=mode)
    ours_h = engine_logits(d, ids, tmp_path, precision="f32", mode="prefill")
    assert row_rel_err(ours_g, ours_h).max() <= 1e-5
    assert row_rel_err(ours_h, ref).max() > 1e-3  # the rounding matters: truncate is read


# ----------------------------------------------------------------- refusals
def expect_exit3(model, words, tmp_path):
    cp = run_cli(["logits", "--model", model, "--ids", "5,6,7", "--precision", "f32", "--out",
                  tmp_path / "x.f32"])
    assert cp.returncode == 3, f"exit {cp.returncode}, stderr {cp.stderr[-1000:]!r}"
    for w in words:
        assert w in cp.stderr, f"{w!r} not in {cp.stderr[-1000:]!r}"


BAD_HF = [
    ("yarn_factor_below_1", "tiny_qwen2", "tiny_qwen2_yarn", lambda r: r.update(factor=0.5),
     ["factor 0.5", "at least 1"]),
    ("yarn_without_original", "tiny_qwen2", "tiny_qwen2_yarn",
     lambda r: r.pop("original_max_position_embeddings"), ["original_max_position_embeddings", "yarn"]),
    ("yarn_beta_negative", "tiny_qwen2", "tiny_qwen2_yarn", lambda r: r.update(beta_fast=-3.0), ["beta_fast"]),
    ("yarn_truncate_string", "tiny_qwen2", "tiny_qwen2_yarn", lambda r: r.update(truncate="no"), ["truncate"]),
    ("linear_factor_below_1", "tiny_llama3", "tiny_llama_linear", lambda r: r.update(factor=0.5),
     ["factor 0.5", "at least 1"]),
    ("linear_without_factor", "tiny_llama3", "tiny_llama_linear", lambda r: r.pop("factor"), ["factor"]),
    ("dynamic", "tiny_llama3", "tiny_llama_linear", lambda r: r.update(rope_type="dynamic"),
     ["type 'dynamic' is not supported"]),
    ("unknown_type", "tiny_qwen2", "tiny_qwen2_yarn", lambda r: r.update(rope_type="wavy"),
     ["type 'wavy' is not supported"]),
    ("llama3_on_qwen2", "tiny_qwen2", "tiny_qwen2_yarn", lambda r: r.update(rope_type="llama3"),
     ["type 'llama3' is not supported"]),
]


@pytest.mark.parametrize("what,src,name,edit,words", BAD_HF, ids=[b[0] for b in BAD_HF])
@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_scaling"])
def test_bad_hf(what, src, name, edit, words, legacy, tmp_path, ie_bin):
    field = "rope_scaling" if legacy else "rope_parameters"
    d = hf_copy(src, name, tmp_path, legacy, edit=lambda c: edit(c[field]))
    expect_exit3(d, [field] + words, tmp_path)


BAD_GGUF = [
    ("factor_below_1", "tiny_qwen2_yarn", {"qwen2.rope.scaling.factor": ("F32", 0.5)}, (),
     ["qwen2.rope.scaling.factor", "at least 1"]),
    ("yarn_without_original", "tiny_qwen2_yarn", {}, ("qwen2.rope.scaling.original_context_length",),
     ["qwen2.rope.scaling.original_context_length"]),
    ("yarn_without_factor", "tiny_qwen2_yarn", {}, ("qwen2.rope.scaling.factor",), ["qwen2.rope.scaling.factor"]),
    ("ext_factor", "tiny_qwen2_yarn", {"qwen2.rope.scaling.yarn_ext_factor": ("F32", 0.5)}, (),
     ["yarn_ext_factor"]),
    ("unknown_type", "tiny_llama_linear", {"llama.rope.scaling.type": ("STR", "dynamic")}, (),
     ["llama.rope.scaling.type", "'dynamic' is not supported"]),
    ("linear_factor_below_1", "tiny_llama_linear", {"llama.rope.scaling.factor": ("F32", 0.25)}, (),
     ["llama.rope.scaling.factor", "at least 1"]),
]


@pytest.mark.parametrize("what,src,keys,drop,words", BAD_GGUF, ids=[b[0] for b in BAD_GGUF])
def test_bad_gguf(what, src, keys, drop, words, tmp_path, ie_bin):
    k = {n: F32(v) if t == "F32" else STR(v) for n, (t, v) in keys.items()}
    g = gguf_with_keys(fixture_path(f"{src}.gguf"), tmp_path / "bad.gguf", k, drop)
    expect_exit3(g, words, tmp_path)
