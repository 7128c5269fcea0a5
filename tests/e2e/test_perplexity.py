"""`inference-engine perplexity` against the transformers reference.

tests/reference/gen_ppl_ref.py computed, with transformers' fp32 model of the
SmolLM2 GGUF, the perplexity of a fixed Austen excerpt the way the CLI does
(non-overlapping windows of 128 tokens, second half of each scored) and
stored it in tests/data/smollm2_ppl_ref.json. Here:

  - --precision f32 (the dequantized weights, f32 activations) must agree
    within 0.1% relative (measured: ~5e-7), and so must the first window's
    mean NLL alone (--chunks 1);
  - native precision (Q4_1 weights x Q8_1 activations) within 2% (measured:
    ~0.4%);
  - the excerpt's tokens (CLI tokenize) equal the reference's, so both
    scored the same windows;
  - bad input: missing text file, text shorter than one window, --ctx 2 ->
    exit 2; missing model -> exit 3.
"""
from __future__ import annotations

import hashlib
import json

import pytest

from conftest import EXIT_MODEL, EXIT_USAGE, REPO, THREADS, fixture_path, run_cli, run_json

REF_NAME = "smollm2_ppl_ref.json"


@pytest.fixture(scope="module")
def ref() -> dict:
    return json.loads(fixture_path(REF_NAME).read_text())


@pytest.fixture(scope="module")
def excerpt(ref, tmp_path_factory):
    """The reference's byte range of the corpus file, written to a temp file."""
    corpus = REPO / ref["corpus"]
    if not corpus.is_file():
        pytest.fail(f"corpus file {corpus} missing", pytrace=False)
    data = corpus.read_bytes()[ref["byte_start"]:ref["byte_end"]]
    assert hashlib.sha256(data).hexdigest() == ref["sha256"], \
        f"{corpus} changed: bytes [{ref['byte_start']}, {ref['byte_end']}) no longer match the reference"
    p = tmp_path_factory.mktemp("ppl") / "excerpt.txt"
    p.write_bytes(data)
    return p


def run_ppl(model, text, *, ctx, chunks, precision):
    return run_json(["perplexity", "--model", model, "--file", text, "--ctx", ctx, "--chunks", chunks,
                     "--precision", precision, "--threads", THREADS], timeout=300)


def test_reference_is_consistent(ref):
    """The fixture describes what the CLI will compute."""
    ctx, chunks = ref["ctx"], ref["chunks"]
    assert ref["add_bos"] is False  # SmolLM2 adds no BOS: windows are plain token runs
    assert len(ref["ids"]) == ref["n_ids"] >= ctx * chunks
    assert ref["scored"] == chunks * (ctx - 1 - ctx // 2)
    assert len(ref["window_nll"]) == chunks
    mean = sum(ref["window_nll"]) / chunks  # every window scores the same count
    assert mean == pytest.approx(ref["nll"], rel=1e-9)
    assert ref["ppl"] == pytest.approx(2.718281828459045 ** ref["nll"], rel=1e-9)


def test_tokens_equal_reference(ie_bin, smollm2, ref, excerpt):
    cp = run_cli(["tokenize", "--tokenizer", smollm2, "--no-bos"], input_bytes=excerpt.read_bytes())
    assert cp.returncode == 0, cp.stderr
    ids = json.loads(cp.stdout)["ids"]
    assert len(ids) == ref["n_ids"]
    assert ids == ref["ids"]


def test_f32_matches_reference(ie_bin, smollm2, ref, excerpt):
    out = run_ppl(smollm2, excerpt, ctx=ref["ctx"], chunks=ref["chunks"], precision="f32")
    assert out["ctx"] == ref["ctx"] and out["chunks"] == ref["chunks"]
    assert out["tokens"] == ref["scored"]
    assert out["ppl"] == pytest.approx(ref["ppl"], rel=1e-3), (out, ref["ppl"])
    assert out["nll"] == pytest.approx(ref["nll"], rel=1e-3)


def test_f32_first_window(ie_bin, smollm2, ref, excerpt):
    out = run_ppl(smollm2, excerpt, ctx=ref["ctx"], chunks=1, precision="f32")
    assert out["chunks"] == 1 and out["tokens"] == ref["scored"] // ref["chunks"]
    assert out["nll"] == pytest.approx(ref["window_nll"][0], abs=1e-3), (out, ref["window_nll"][0])


def test_native_close_to_reference(ie_bin, smollm2, ref, excerpt):
    out = run_ppl(smollm2, excerpt, ctx=ref["ctx"], chunks=ref["chunks"], precision="native")
    assert out["tokens"] == ref["scored"]
    assert out["ppl"] == pytest.approx(ref["ppl"], rel=2e-2), (out, ref["ppl"])


# ------------------------------------------------------------- bad input
def expect_error(args, code):
    cp = run_cli(["perplexity"] + [str(a) for a in args] + ["--threads", THREADS])
    assert cp.returncode == code, (cp.returncode, cp.stderr)
    assert cp.stdout == ""
    assert cp.stderr.startswith("error: ") and cp.stderr.count("\n") == 1, cp.stderr


def test_missing_text_file(ie_bin, smollm2, tmp_path):
    expect_error(["--model", smollm2, "--file", tmp_path / "nope.txt", "--ctx", 128], EXIT_USAGE)


def test_text_shorter_than_ctx(ie_bin, smollm2, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Emma Woodhouse, handsome, clever, and rich.\n")
    expect_error(["--model", smollm2, "--file", short, "--ctx", 128], EXIT_USAGE)


def test_ctx_too_small(ie_bin, smollm2, excerpt):
    expect_error(["--model", smollm2, "--file", excerpt, "--ctx", 2], EXIT_USAGE)


def test_missing_model(ie_bin, excerpt, tmp_path):
    expect_error(["--model", tmp_path / "no_model.gguf", "--file", excerpt, "--ctx", 128], EXIT_MODEL)
