"""The Python package (python/clocher) over the built libclocher.so, on
SmolLM2: greedy generate equals the CLI's greedy text, the streamed pieces
join to the same text, leaving a stream early cancels it, chat answers,
metrics count the tokens, tokenize/detokenize round-trip, and bad options
raise ClocherError with the status name and the library's reason.

The library is BUILD/libclocher.so unless CLOCHER_LIBRARY names one; the
package is imported from <repo>/python (what `pip install ./python`
installs; scripts/check_install.sh checks the installed copy).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, REPO, SMOLLM2, THREADS, need_file

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def clocher():
    lib = os.environ.get("CLOCHER_LIBRARY") or str(need_file(BUILD / "libclocher.so", "libclocher.so (build it)"))
    os.environ["CLOCHER_LIBRARY"] = lib
    sys.path.insert(0, str(REPO / "python"))
    try:
        import clocher as mod
    finally:
        sys.path.pop(0)
    return mod


@pytest.fixture(scope="module")
def engine(clocher):
    need_file(SMOLLM2, "SmolLM2 model")
    with clocher.Engine(SMOLLM2, threads=THREADS, pin=False, ctx=512) as e:
        yield e


def cli_greedy(ie_bin, prompt: str, n: int) -> str:
    out = subprocess.run([str(ie_bin), "--model", str(SMOLLM2), "--prompt", prompt, "--max-new", str(n),
                          "--greedy", "--threads", str(THREADS)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["text"]


def test_version(clocher):
    assert clocher.version() == "0.1.0"


def test_generate_matches_cli(engine, ie_bin):
    for prompt in (PROMPT, "def fibonacci(n):"):
        text = engine.generate(prompt, max_tokens=24, temperature=0)
        assert text == cli_greedy(ie_bin, prompt, 24)
        assert engine.last_info["n_gen"] > 0
        assert engine.last_info["finish"] in ("length", "eos")


def test_stream_joins_to_generate(engine):
    text = engine.generate(PROMPT, max_tokens=24, temperature=0)
    pieces = list(engine.stream(PROMPT, max_tokens=24, temperature=0))
    assert len(pieces) > 1
    assert "".join(pieces) == text


def test_stream_break_cancels(engine):
    got = []
    for piece in engine.stream("Once upon a time", max_tokens=200, temperature=0):
        got.append(piece)
        if len(got) == 3:
            break
    assert engine.last_info["finish"] == "cancelled"
    assert engine.last_info["n_gen"] < 10
    # the engine is whole afterwards
    assert engine.generate(PROMPT, max_tokens=8, temperature=0).startswith(" Paris")


def test_chat(engine):
    reply = engine.chat([{"role": "user", "content": "What is 2+2?"}], max_tokens=40, temperature=0)
    assert "4" in reply
    assert engine.last_info["finish"] == "eos"
    pieces = list(engine.stream(None, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=40,
                                temperature=0))
    assert "".join(pieces) == reply


def test_stop_strings(engine):
    text = engine.generate(PROMPT, max_tokens=24, temperature=0, stop=["United", "zzz"])
    assert engine.last_info["finish"] == "stop"
    assert "United" not in text and text.startswith(" Paris")


def test_tokens(engine):
    ids = engine.tokenize("Hello world<|im_end|>", add_special=False)
    assert ids[-1] == 2
    assert engine.detokenize(ids) == "Hello world<|im_end|>"
    assert engine.n_vocab == 49152


def test_metrics(clocher):
    with clocher.Engine(SMOLLM2, threads=THREADS, pin=False, ctx=256) as e:
        assert e.metrics()["requests"] == 0
        e.generate(PROMPT, max_tokens=10, temperature=0)
        n_in, n_out = e.last_info["n_prompt"], e.last_info["n_gen"]
        list(e.stream("Once upon a time", max_tokens=6, temperature=0))
        n_in += e.last_info["n_prompt"]
        n_out += e.last_info["n_gen"]
        m = e.metrics()
    assert m["requests"] == 2
    assert m["tokens_in"] == n_in and m["tokens_out"] == n_out
    assert m["kv_hits"] + m["kv_misses"] == n_in
    assert m["decode_tps"] > 0 and m["prefill_tps"] > 0
    assert 0 < m["latency_p50_ms"] <= m["latency_p95_ms"]
    assert m["ttft_p50_ms"] > 0 and m["rss_peak_mb"] > 0


def test_errors(clocher, engine):
    with pytest.raises(clocher.ClocherError) as exc:
        engine.generate(PROMPT, beam_width=4)
    assert exc.value.status == "IE_ERR_INVAL" and "beam_width" in exc.value.message
    with pytest.raises(clocher.ClocherError) as exc:
        engine.generate(PROMPT, temperature="hot")
    assert exc.value.status == "IE_ERR_INVAL" and "temperature" in exc.value.message
    with pytest.raises(clocher.ClocherError) as exc:
        engine.generate(b"bad \xff utf-8")
    assert exc.value.status == "IE_ERR_INVAL" and "UTF-8" in exc.value.message
    with pytest.raises(clocher.ClocherError) as exc:
        engine.detokenize([1, 10**6])
    assert exc.value.status == "IE_ERR_RANGE"
    with pytest.raises(clocher.ClocherError) as exc:
        clocher.Engine(SMOLLM2, colour="red")
    assert exc.value.status == "IE_ERR_INVAL" and "colour" in exc.value.message
    with pytest.raises(clocher.ClocherError) as exc:
        clocher.Engine(REPO / "tests" / "data" / "no_such_model.gguf")
    assert exc.value.status == "IE_ERR_IO"
    for bad in (None, "1\x002"):
        with pytest.raises(clocher.ClocherError) as exc:
            engine.generate(PROMPT, max_tokens=bad)
        assert exc.value.status == "IE_ERR_INVAL"
    # an exception in a piece callback stops the call and is raised, not swallowed
    def boom(piece):
        raise KeyError("from the callback")
    with pytest.raises(KeyError):
        engine._run(PROMPT, None, {"max_tokens": 4}, boom)
    # a failing stream raises in the consumer
    with pytest.raises(clocher.ClocherError):
        list(engine.stream(PROMPT, top_p=0))


def test_closed_engine(clocher):
    e = clocher.Engine(SMOLLM2, threads=1, pin=False, ctx=64)
    e.close()
    e.close()
    with pytest.raises(clocher.ClocherError):
        e.generate(PROMPT)
