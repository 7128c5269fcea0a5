"""Weight-only quantization at load (--precision int8w / int4w) on SmolLM2.

Quality bounds of issue 4, measured against the model's dequantized weights
(--precision f32, itself equal to transformers within 5e-7, see
test_perplexity.py) on the same Austen excerpt (ctx 128 x 8 windows):
  - perplexity drift: int8w (group 32) <= 0.3 %, int4w (group 32, affine)
    <= 2 %. The GGUF's matrices are Q4_1 (affine 4-bit, group 32), so affine
    int4w re-quantizes them without loss (measured: same perplexity as the
    native Q4_1 run, +0.22 % — all of it from the int8 activations); the
    output head (tied embedding, Q8_0) stays 8-bit under int4w. Symmetric
    int4w cannot represent an affine grid: measured +19 %, checked only as a
    sanity bound (< 30 %: a broken kernel lands in the thousands);
  - greedy continuations with int8w (weights int8, activations int16)
    identical to the fp32 reference (transformers, tests/data/smollm2_ref.npz)
    for the first 32 tokens of each of the 5 prompts, except at a position
    where the reference itself is a near tie (top-2 margin < 0.1 logit; the
    engine must then pick the runner-up and comparison stops). Measured: 4 of
    5 identical for 32 tokens; prompt 2 identical for 27, then the reference
    margin is 0.083 and int8w takes the runner-up;
  - the lossless repack of the GGUF's Q4_1/Q8_0 matrices into the packed
    layout (IE_REPACK=1, the default) gives the same greedy text as running
    the GGUF's rows directly (IE_REPACK=0);
  - an int4w group that does not divide a row is refused with exit 2.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import REPO, THREADS, fixture_path, run_cli, run_json

MIN_TOKENS = 32


@pytest.fixture(scope="module")
def ppl_ref() -> dict:
    return json.loads(fixture_path("smollm2_ppl_ref.json").read_text())


@pytest.fixture(scope="module")
def excerpt(ppl_ref, tmp_path_factory):
    data = (REPO / ppl_ref["corpus"]).read_bytes()[ppl_ref["byte_start"]:ppl_ref["byte_end"]]
    p = tmp_path_factory.mktemp("qppl") / "excerpt.txt"
    p.write_bytes(data)
    return p


def _ppl(model, text, ref, precision, env=None):
    return run_json(["perplexity", "--model", model, "--file", text, "--ctx", ref["ctx"], "--chunks",
                     ref["chunks"], "--precision", precision, "--threads", THREADS], timeout=300, env=env)


@pytest.fixture(scope="module")
def ppl_f32(smollm2, excerpt, ppl_ref):
    out = _ppl(smollm2, excerpt, ppl_ref, "f32")
    assert out["ppl"] == pytest.approx(ppl_ref["ppl"], rel=1e-3)
    return out["ppl"]


@pytest.mark.parametrize("precision,affine,bound", [("int8w", "0", 0.003), ("int4w", "1", 0.02),
                                                   ("int4w", "0", 0.30)])
def test_perplexity_drift(smollm2, excerpt, ppl_ref, ppl_f32, precision, affine, bound):
    out = _ppl(smollm2, excerpt, ppl_ref, precision, env={"IE_QUANT_AFFINE": affine})
    drift = (out["ppl"] - ppl_f32) / ppl_f32
    print(f"{precision} affine={affine}: ppl {out['ppl']:.4f} vs f32 {ppl_f32:.4f}: drift {100 * drift:+.3f}%")
    assert abs(drift) <= bound, f"{precision} perplexity {out['ppl']:.4f} drifts {100 * drift:+.3f}% from f32"


NEAR_TIE = 0.1


@pytest.fixture(scope="module")
def greedy_ref():
    d = np.load(fixture_path("smollm2_ref.npz"))
    meta = json.loads(str(d["meta"]))
    return [(p["text"], [int(t) for t in d[f"p{i}_cont_ids"]], d[f"p{i}_margins"],
             d[f"p{i}_topk_ids"][len(d[f"p{i}_prompt_ids"]) - 1:]) for i, p in enumerate(meta["prompts"])]


@pytest.fixture(scope="module")
def int8w_runs(smollm2, greedy_ref):
    out = []
    for text, *_ in greedy_ref:
        r = run_json(["--model", smollm2, "--prompt", text, "--max-new", MIN_TOKENS, "--greedy",
                      "--precision", "int8w", "--threads", THREADS], timeout=300)
        out.append([int(t) for t in r["ids"]])
    return out


@pytest.mark.parametrize("i", range(5))
def test_int8w_greedy_identical(greedy_ref, int8w_runs, i):
    _, want, margins, topk = greedy_ref[i]
    got = int8w_runs[i]
    assert len(want) >= MIN_TOKENS and len(got) == MIN_TOKENS
    for k in range(MIN_TOKENS):
        if got[k] != want[k]:
            assert margins[k] < NEAR_TIE and got[k] == int(topk[k][1]), \
                f"int8w diverges at token {k} (reference margin {margins[k]:.3f}): {got}\nref {want[:MIN_TOKENS]}"
            return


def test_int8w_greedy_mostly_exact(int8w_runs, greedy_ref):
    exact = sum(got == want[:MIN_TOKENS] for got, (_, want, *_r) in zip(int8w_runs, greedy_ref))
    assert exact >= 4, f"only {exact} of 5 prompts identical for {MIN_TOKENS} tokens"


def test_repack_is_lossless_in_output(smollm2, greedy_ref):
    text = greedy_ref[0][0]
    args = ["--model", smollm2, "--prompt", text, "--max-new", MIN_TOKENS, "--greedy", "--threads", THREADS]
    packed = run_json(args, timeout=300, env={"IE_REPACK": "1"})
    rows = run_json(args, timeout=300, env={"IE_REPACK": "0"})
    assert packed["text"] == rows["text"]


def test_bad_group_refused(smollm2):
    cp = run_cli(["--model", smollm2, "--prompt", "hi", "--max-new", "1", "--precision", "int4w"],
                 env={"IE_QUANT_GROUP": "128"})
    # SmolLM2's hidden size 576 is not a multiple of 128
    assert cp.returncode != 0
    assert "group 128" in cp.stderr and "576" in cp.stderr, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1


def test_repack_cache(smollm2, greedy_ref, tmp_path):
    """IE_REPACK_CACHE: the first run stores every converted matrix stack,
    the second loads them (same files, untouched) and computes the same."""
    text = greedy_ref[1][0]
    cache = tmp_path / "cache"
    args = ["--model", smollm2, "--prompt", text, "--max-new", 8, "--greedy", "--precision", "int4w",
            "--threads", THREADS]
    first = run_json(args, timeout=300, env={"IE_REPACK_CACHE": str(cache)})
    files = sorted(cache.iterdir())
    # 30 layers x 7 matrices + the head
    assert len(files) == 30 * 7 + 1, [f.name for f in files][:5]
    stamps = {f.name: f.stat().st_mtime_ns for f in files}
    sizes = {f.name: f.stat().st_size for f in files}
    second = run_json(args, timeout=300, env={"IE_REPACK_CACHE": str(cache)})
    assert {f.name: f.stat().st_mtime_ns for f in cache.iterdir()} == stamps
    assert second["ids"] == first["ids"]
    # a damaged entry (wrong size) is ignored and rebuilt, not trusted
    victim = files[0]
    victim.write_bytes(victim.read_bytes()[:-7])
    third = run_json(args, timeout=300, env={"IE_REPACK_CACHE": str(cache)})
    assert third["ids"] == first["ids"]
    assert victim.stat().st_size == sizes[victim.name]  # rebuilt and stored again
    # an edited entry of the right size (other weights than the hashed
    # source converts to) fails its content hash: rebuilt, never served
    good = victim.read_bytes()
    edited = bytearray(good)
    edited[64:4160] = bytes(4096)
    victim.write_bytes(bytes(edited))
    fourth = run_json(args, timeout=300, env={"IE_REPACK_CACHE": str(cache)})
    assert fourth["ids"] == first["ids"]
    assert victim.read_bytes() == good, "the edited cache entry was loaded instead of rebuilt"


def test_repack_does_not_keep_the_file_resident(smollm2, greedy_ref):
    """After the load-time repack the GGUF's pages of the converted matrices
    are dropped, so peak RSS stays near one copy of the weights (measured
    110 MB for the 98 MB file; 199 MB when both copies stayed resident).
    The test process holds ~400 MB itself while the engine runs: the
    engine's rss_peak_mb must be its own (VmHWM), not the parent's peak
    that getrusage folds in across vfork+exec (it reported 419-483 MB)."""
    ballast = np.ones(50_000_000)  # 400 MB resident in this process
    out = run_json(["--model", smollm2, "--prompt", greedy_ref[0][0], "--max-new", 8, "--greedy",
                    "--threads", THREADS], timeout=300)
    assert ballast[-1] == 1.0
    size_mb = smollm2.stat().st_size / (1 << 20)
    assert out["rss_peak_mb"] < 1.35 * size_mb, (out["rss_peak_mb"], size_mb)


@pytest.mark.parametrize("env,needle", [({"IE_QUANT_GROUP": "abc"}, "IE_QUANT_GROUP"),
                                        ({"IE_QUANT_GROUP": "16"}, "IE_QUANT_GROUP"),
                                        ({"IE_QUANT_SCALE": "bogus"}, "IE_QUANT_SCALE")])
def test_bad_quant_environment_refused(smollm2, env, needle):
    cp = run_cli(["--model", smollm2, "--prompt", "hi", "--max-new", "1", "--precision", "int4w"], env=env)
    assert cp.returncode == 2 and cp.stdout == "", (cp.returncode, cp.stderr)
    assert needle in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
