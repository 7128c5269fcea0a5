"""The engine's AMX path end to end, on machines without AMX (issue 23).

IE_AMX_EMULATE=1 offers the `amx` kernel table on an AVX-512 CPU without
AMX and runs its tile GEMMs on the scalar tile emulator (kernels/src/
amx_emu.c): the dispatch, the worker's prefill splits over the thread pool
(each thread configuring its own tiles) and the int8 and bf16 tile GEMMs
all run as they would on a Xeon with AMX, only ~1000x slower. A prefill of
18 tokens (above IE_AMX_MIN_TOK = 16, so every packed bf16 matmul takes
the tiles, and the int ones with IE_AMX_INT=1 on the int8 tiles or with
IE_AMX_INT=bf16 dequantized onto the bf16 tiles) must give the logits of
the AVX-512 path within the noise
between two ISAs (AVX2 against AVX-512: activation quantization turns f32
summation-order differences into flipped quants), for the stored Q4_1
weights (int4w_affine), int8w and bf16; the k-quants and GPT-OSS's MXFP4
experts on the bf16 route (IE_AMX_INT=bf16).

Without AVX-512 the emulated path cannot run (the amx table is AVX-512's):
those tests are skipped, saying so. On a CPU with AMX the same checks run
on the real tiles instead (test_real_amx_prefill_matches_avx512).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import THREADS, binary, fixture_path

IDS = "6403,1980,253,655,28,281,253,1165,6560,28,665,436,253,9357,1573,28,281,253"


def cpu_flags() -> set:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = cpu_flags()
HAS_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= FLAGS
HAS_AMX = {"amx_tile", "amx_int8"} <= FLAGS


def run_logits(model: Path, ids, out: Path, isa: str, precision: str = "native", mode: str = "prefill",
               emulate: bool = False, route: str = "1", min_tok=None, repack: bool = True):
    """The engine's logits of ids on IE_ISA=isa: the AMX knobs of the caller's
    environment dropped, IE_AMX_EMULATE=1 if emulate, and on amx IE_AMX_INT=route
    (by default the int types stay on AVX-512: "1" the int8 tiles, "bf16" the
    int types, k-quants and MXFP4 dequantized onto the bf16 tiles) and
    IE_AMX_MIN_TOK=min_tok if given; repack False: IE_REPACK=0 (ggml's rows)."""
    env = dict(os.environ, IE_ISA=isa)
    for k in ("IE_AMX_EMULATE", "IE_AMX_MIN_TOK", "IE_AMX_INT", "IE_REPACK"):
        env.pop(k, None)
    if not repack:
        env["IE_REPACK"] = "0"
    if emulate:
        env["IE_AMX_EMULATE"] = "1"
    if isa == "amx":
        env["IE_AMX_INT"] = route
        if min_tok is not None:
            env["IE_AMX_MIN_TOK"] = str(min_tok)
    r = subprocess.run([str(binary("inference-engine")), "logits", "--model", str(model), "--ids",
                        ",".join(map(str, ids)), "--threads", str(THREADS), "--precision", precision,
                        "--mode", mode, "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


def logits(model: Path, tmp: Path, isa: str, precision: str, emulate: bool = False, route: str = "1"):
    out = tmp / f"logits_{isa}_{precision}_{int(emulate)}_{route}.bin"
    return run_logits(model, IDS.split(","), out, isa, precision, emulate=emulate, route=route)


def check_amx_prefill(smollm2, tmp_path, precision, emulate, route="1"):
    # the bf16 route computes what --precision bf16 does (the stored weights'
    # values rounded to bf16, BF16 activation rows): its reference is that
    # path on AVX-512, and its noise that path's between two ISAs
    ref = "bf16" if route == "bf16" else precision
    base = logits(smollm2, tmp_path, "avx512", ref)
    amx = logits(smollm2, tmp_path, "amx", precision, emulate=emulate, route=route)
    other = logits(smollm2, tmp_path, "avx2", ref)
    noise = np.abs(base - other).max()
    assert noise > 0  # the bound is a measured one, not a constant
    diff = np.abs(base - amx).max()
    print(f"\n  {precision} (IE_AMX_INT={route}): |amx - avx512| {diff:.4g}, |avx2 - avx512| {noise:.4g}")
    assert diff <= 2.0 * noise
    for b, a in zip(base, amx):
        if b.argmax() != a.argmax():
            top2 = np.sort(b)[-2:]
            assert top2[1] - top2[0] < 0.25, "arg max moved away from a near tie"


@pytest.mark.skipif(not HAS_AVX512 or HAS_AMX,
                    reason="the amx table is AVX-512's (no AVX-512 VNNI here)" if not HAS_AVX512
                    else "this CPU has AMX: test_real_amx_prefill_matches_avx512 runs the tiles")
@pytest.mark.parametrize("precision,route", [("native", "1"), ("int8w", "1"), ("bf16", "1"),
                                             ("native", "bf16")])
def test_emulated_amx_prefill_matches_avx512(precision, route, smollm2, tmp_path):
    check_amx_prefill(smollm2, tmp_path, precision, emulate=True, route=route)


@pytest.mark.skipif(not HAS_AMX, reason="no AMX on this CPU (amx_tile/amx_int8 absent from /proc/cpuinfo)")
@pytest.mark.parametrize("precision,route", [("native", "1"), ("int8w", "1"), ("bf16", "1"),
                                             ("native", "bf16")])
def test_real_amx_prefill_matches_avx512(precision, route, smollm2, tmp_path):
    check_amx_prefill(smollm2, tmp_path, precision, emulate=False, route=route)


@pytest.mark.skipif(HAS_AMX, reason="this CPU has AMX: IE_ISA=amx is expected to run here")
def test_forced_amx_without_amx_fails_with_the_reason(smollm2, tmp_path):
    env = dict(os.environ, IE_ISA="amx")
    env.pop("IE_AMX_EMULATE", None)
    r = subprocess.run([str(binary("inference-engine")), "logits", "--model", str(smollm2), "--ids", "1,2",
                        "--threads", str(THREADS), "--out", str(tmp_path / "x.bin")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0
    assert "ISA 'amx' are not available on this CPU" in r.stderr
    assert "AMX" in r.stderr.split("not available on this CPU", 1)[1]


# not tiny_kq_tied.gguf: with a tied head, --precision bf16 converts the
# embedding table too (lookups read the bf16 head), which the route does not
KQ_MODELS = ["tiny_kq_mixed.gguf"] + [
    f"tiny_kq_{t}.gguf" for t in ("q5_0", "q5_1", "iq4_nl", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_xs")]


def kq_logits(model: Path, ids, tmp: Path, isa: str, precision: str, emulate: bool = False):
    out = tmp / f"kq_{isa}_{precision}_{int(emulate)}.bin"
    return run_logits(model, ids, out, isa, precision, emulate=emulate, route="bf16")


def check_kq_route(name, tmp_path, emulate):
    """The k-quants on the bf16 route compute what --precision bf16 does on
    the same file (each weight's value rounded to bf16, BF16 activation rows):
    within twice that path's own noise between two ISAs, or 1e-3 of the
    largest logit (one bf16 activation rounded the other way: 2^-9 of it;
    these tiny models' ISA noise can be ~1e-6 where no rounding flips, and
    the mixed file flips one at one position). A wrong field of any type moves
    logits by >= 1e-2 of it. 20-token prompts: above IE_AMX_MIN_TOK, so every
    packed k-quant matmul takes the route."""
    model = fixture_path(name)
    ids = np.load(fixture_path(name.replace(".gguf", ".expected.npz")))["ids"][0]
    assert len(ids) >= 16
    base = kq_logits(model, ids, tmp_path, "avx512", "bf16")
    other = kq_logits(model, ids, tmp_path, "avx2", "bf16")
    amx = kq_logits(model, ids, tmp_path, "amx", "native", emulate=emulate)
    noise = np.abs(base - other).max()
    diff = np.abs(base - amx).max()
    print(f"\n  {name}: |amx (bf16 route) - avx512 bf16| {diff:.4g}, |avx2 - avx512| {noise:.4g}")
    assert noise > 0
    assert diff <= max(2.0 * noise, 1e-3 * np.abs(base).max())


@pytest.mark.skipif(not HAS_AVX512 or HAS_AMX,
                    reason="the amx table is AVX-512's (no AVX-512 VNNI here)" if not HAS_AVX512
                    else "this CPU has AMX: test_real_amx_bf16_route_kquants runs the tiles")
@pytest.mark.parametrize("name", KQ_MODELS)
def test_emulated_bf16_route_kquants(name, tmp_path):
    check_kq_route(name, tmp_path, emulate=True)


@pytest.mark.skipif(not HAS_AMX, reason="no AMX on this CPU (amx_tile/amx_int8 absent from /proc/cpuinfo)")
@pytest.mark.parametrize("name", KQ_MODELS)
def test_real_amx_bf16_route_kquants(name, tmp_path):
    check_kq_route(name, tmp_path, emulate=False)


def gptoss_route_logits(ids, tmp: Path, mode: str, emulate: bool, layout: str):
    """tiny_gptoss.gguf (MXFP4 experts) on the amx table with IE_AMX_INT=bf16
    and IE_AMX_MIN_TOK=1: every expert matmul, whatever its token count (a
    tiny prompt gives an expert a few tokens), on the bf16 tiles -- from
    IQ4_NL's panels (layout "panels", the default binding: the k-quants'
    route) or from ggml's rows (IE_REPACK=0: the table's MXFP4 slot)."""
    return run_logits(fixture_path("tiny_gptoss.gguf"), ids, tmp / f"gptoss_amx_{mode}_{layout}.bin", "amx",
                      mode=mode, emulate=emulate, route="bf16", min_tok=1, repack=layout == "panels")


def check_gptoss_mxfp4_route(tmp_path, mode, emulate, layout):
    """MXFP4 experts on the bf16 tiles hold ref's weights exactly and round the
    activations to bf16 (the AVX-512 path: Q8_0): against transformers on the
    stored weights, test_forward_gptoss.py's bounds for the native quantized
    path (median row error <= 0.03 of the largest logit, at most 2 of 32
    positions above 0.05 where a router near-tie flips, argmax >= 90%).
    A wrong nibble, exponent or transposed pair moves every position by far
    more."""
    d = np.load(fixture_path("tiny_gptoss_mxfp4/expected.npz"))
    ids, ref = d["ids"], d["logits"]
    amx = gptoss_route_logits(ids, tmp_path, mode, emulate, layout)
    rel = np.max(np.abs(amx - ref), axis=-1) / np.max(np.abs(ref), axis=-1)
    agree = np.mean(amx.argmax(-1) == ref.argmax(-1))
    print(f"\n  gpt-oss mxfp4 route ({mode}, {layout}): median rel {np.median(rel):.4g}, max {rel.max():.4g}, "
          f"argmax {agree:.2f}")
    assert np.all(np.isfinite(amx))
    assert np.median(rel) <= 0.03
    assert int(np.sum(rel > 0.05)) <= 2, rel
    assert agree >= 0.90


@pytest.mark.skipif(not HAS_AVX512 or HAS_AMX,
                    reason="the amx table is AVX-512's (no AVX-512 VNNI here)" if not HAS_AVX512
                    else "this CPU has AMX: test_real_amx_mxfp4_experts runs the tiles")
@pytest.mark.parametrize("layout", ["panels", "rows"])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_emulated_amx_mxfp4_experts(mode, layout, tmp_path):
    check_gptoss_mxfp4_route(tmp_path, mode, emulate=True, layout=layout)


@pytest.mark.skipif(not HAS_AMX, reason="no AMX on this CPU (amx_tile/amx_int8 absent from /proc/cpuinfo)")
@pytest.mark.parametrize("layout", ["panels", "rows"])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_real_amx_mxfp4_experts(mode, layout, tmp_path):
    check_gptoss_mxfp4_route(tmp_path, mode, emulate=False, layout=layout)
