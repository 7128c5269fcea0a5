"""Tiny random Llama models: the engine's logits vs transformers' (fp32).

Fixtures come from tests/reference/gen_tiny_llama.py (tiny_manifest.json lists
them): HF dirs in fp32 / bf16 (tied) / fp16, and GGUFs of the fp32 model in
f32 / f16 / q8_0 / q4_0 / q4_1. Each expected.npz holds ids [32] and the fp32
logits [32][512] that transformers computes from exactly the stored weights
(bf16/f16 upcast, GGUF tensors dequantized by gguf's dequantizer), so weight
rounding is in the reference and only the engine's arithmetic is tested.

Metric: rel = max over positions of max|ours - ref| / max|ref|.

Bounds
  --precision f32 (every weight dequantized to f32 at load): rel <= 1e-4 for
    every model, quantized ones included — the dequantized weights are exactly
    the reference's.
  --precision native:
    f32 weights      rel <= 1e-4 (nothing is rounded)
    f16 weights      rel <= 3e-3: a native F16 dot product may round the
                     activations to f16 (as llama.cpp does); simulating that
                     in transformers moves logits by ~7e-4
    bf16 weights     rel <= 2e-2: activations rounded to bf16 — simulated ~5e-3
    q8_0/q4_0/q4_1   rel <= 6e-2, rms(ours-ref)/rms(ref) <= 3e-2, and the same
                     argmax at >= 90% of positions: the kernels quantize
                     activations to 8 bits per 32-block (Q8_0 / Q8_1, as
                     llama.cpp does); simulating exactly that in transformers
                     on these weights gives rel ~1.5-2.2e-2, rms ~1.3e-2, argmax
                     agreement 94-100% (numbers stored in each expected.npz's
                     meta as sim_q8_*). The bounds are ~3x / ~2x the simulation.
                     (A 2e-2 bound was considered and rejected: the simulated
                     int8 activation error alone reaches 2.2e-2 on this model.)

Both --mode prefill (one batched forward) and --mode decode (one token at a
time through the KV cache) must meet the same bounds.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import engine_logits, fixture_path, row_rel_err

TOL_F32 = 1e-4
TOL_NATIVE = {"f32": 1e-4, "f16": 3e-3, "bf16": 2e-2}
QUANT = ("q8_0", "q4_0", "q4_1")
Q_MAX_REL, Q_RMS_REL, Q_ARGMAX = 6e-2, 3e-2, 0.90


def _manifest():
    # Collected at import: a missing manifest must fail, not silently
    # parametrize nothing — see test_manifest_complete.
    from conftest import FIXTURES
    p = FIXTURES / "tiny_manifest.json"
    if not p.is_file():
        return []
    return json.loads(p.read_text())["models"]


MODELS = _manifest()
EXPECTED_NAMES = {"tiny_llama", "tiny_llama_tied", "tiny_llama_f16", "tiny_llama_f32.gguf",
                  "tiny_llama_f16.gguf", "tiny_llama_q8_0.gguf", "tiny_llama_q4_0.gguf",
                  "tiny_llama_q4_1.gguf"}


def test_manifest_complete():
    fixture_path("tiny_manifest.json")
    names = {m["name"] for m in MODELS}
    assert EXPECTED_NAMES <= names, f"missing tiny fixtures: {EXPECTED_NAMES - names}"


def _load_expected(entry):
    d = np.load(fixture_path(entry["expected"]))
    ids, ref = d["ids"], d["logits"]
    assert ids.shape == (32,) and ref.shape == (32, 512)
    meta = json.loads(str(d["meta"]))
    return ids, ref, meta


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("precision", ["f32", "native"])
@pytest.mark.parametrize("entry", MODELS, ids=[m["name"] for m in MODELS])
def test_tiny_logits(entry, precision, mode, tmp_path):
    ids, ref, meta = _load_expected(entry)
    model = fixture_path(entry["path"])
    ours = engine_logits(model, ids, tmp_path, precision=precision, mode=mode)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    rel = row_rel_err(ours, ref)
    worst = int(np.argmax(rel))
    w = entry["weights"]
    msg = (f"{entry['name']} {precision}/{mode}: max rel {rel.max():.3e} at position {worst} "
           f"(simulated q8 activation error {meta.get('sim_q8_max_rel', float('nan')):.2e})")
    if precision == "f32" or w not in QUANT:
        tol = TOL_F32 if precision == "f32" else TOL_NATIVE[w]
        assert rel.max() <= tol, msg + f" > {tol}"
        return
    # quantized weights, native kernels (int8-quantized activations)
    rms = float(np.sqrt(np.mean((ours - ref) ** 2) / np.mean(ref ** 2)))
    agree = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    assert rel.max() <= Q_MAX_REL, msg + f" > {Q_MAX_REL}"
    assert rms <= Q_RMS_REL, msg + f"; rms rel {rms:.3e} > {Q_RMS_REL}"
    assert agree >= Q_ARGMAX, msg + f"; argmax agreement {agree:.2f} < {Q_ARGMAX}"


@pytest.mark.parametrize("precision", ["f32", "native"])
def test_prefill_equals_decode(precision, tmp_path):
    """The KV-cache path and the batched path compute the same function."""
    entry = next(m for m in MODELS if m["name"] == "tiny_llama_q8_0.gguf")
    ids, ref, _ = _load_expected(entry)
    model = fixture_path(entry["path"])
    a = engine_logits(model, ids, tmp_path, precision=precision, mode="prefill")
    b = engine_logits(model, ids, tmp_path, precision=precision, mode="decode")
    tol = 1e-4 if precision == "f32" else 3e-2
    assert row_rel_err(b, a).max() <= tol


def test_gguf_and_hf_dir_agree(tmp_path):
    """Same weights through the safetensors loader (HF / NEOX RoPE layout) and
    the GGUF loader (permuted Q/K, interleaved RoPE) give the same logits."""
    ids, _, _ = _load_expected(next(m for m in MODELS if m["name"] == "tiny_llama"))
    a = engine_logits(fixture_path("tiny_llama"), ids, tmp_path, precision="f32")
    b = engine_logits(fixture_path("tiny_llama_f32.gguf"), ids, tmp_path, precision="f32")
    assert row_rel_err(a, b).max() <= 1e-5
