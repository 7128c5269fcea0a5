"""LoRA adapters (issue 20): the engine's logits with each adapter against
peft's, through the CLI's `logits` mode with --lora NAME=PATH --adapter NAME.

Fixtures: tests/reference/gen_lora_ref.py — four adapters trained with peft
on the tiny Llama fixture (qv8: r 8 on q/v; all16: r 16 rsLoRA on all seven
projections; mlp8bf16: r 8 on the MLP, stored bf16; o4f16: r 4 on o/k,
stored f16), qv8 also as a GGUF LoRA written the way llama.cpp's
convert_lora_to_gguf.py writes it, and ref.npz with peft's f32 logits.

Metric: rel = max |ours - peft| / max |peft| over all positions; bound 1e-4
at --precision f32 (measured 5e-7 .. 1.1e-5), both prefill and decode, on
the HF base and on the f32 GGUF base (q/k rows permuted: the loader permutes
the PEFT adapter's B rows to match, and un-permutes the GGUF LoRA's on the
HF base). Each adapter must also move the logits away from the base's.
Bad adapters exit 3 with a message naming the problem.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import fixture_path, read_logits, run_cli, run_json

ADAPTERS = ["qv8", "all16", "mlp8bf16", "o4f16"]


@pytest.fixture(scope="module")
def ref():
    return np.load(fixture_path("lora/ref.npz"))


def logits(tmp_path, model, ids, lora=(), adapter=None, mode="prefill", extra=()):
    out = tmp_path / "o.f32"
    args = ["logits", "--model", model, "--ids", ",".join(map(str, ids)), "--precision", "f32",
            "--mode", mode, "--threads", "2", "--out", out]
    for name, path in lora:
        args += ["--lora", f"{name}={path}"]
    if adapter:
        args += ["--adapter", adapter]
    info = run_json(args + list(extra))
    assert info["adapter"] == adapter, info
    return read_logits(out, len(ids), info["n_vocab"])


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", ADAPTERS)
def test_peft_adapter_matches_peft(tmp_path, ref, name):
    ids = ref["ids"].tolist()
    got = logits(tmp_path, fixture_path("tiny_llama"), ids, [(name, fixture_path(f"lora/{name}"))], name)
    assert rel(got, ref[f"logits_{name}"]) <= 1e-4
    assert rel(got, ref["logits_base"]) > 1e-2, "the adapter changed nothing"
    assert got[5:].argmax(-1).tolist() == ref[f"logits_{name}"][5:].argmax(-1).tolist()


def test_base_unchanged_with_adapters_loaded(tmp_path, ref):
    ids = ref["ids"].tolist()
    lora = [(n, fixture_path(f"lora/{n}")) for n in ADAPTERS]
    got = logits(tmp_path, fixture_path("tiny_llama"), ids, lora, None)
    assert rel(got, ref["logits_base"]) <= 1e-4


@pytest.mark.parametrize("base,path", [
    ("tiny_llama", "lora/qv8.gguf"),             # GGUF LoRA on the HF base: un-permuted
    ("tiny_llama_f32.gguf", "lora/qv8"),         # PEFT on a GGUF base: permuted
    ("tiny_llama_f32.gguf", "lora/qv8.gguf"),    # GGUF on GGUF: as stored
])
def test_row_orders(tmp_path, ref, base, path):
    ids = ref["ids"].tolist()
    got = logits(tmp_path, fixture_path(base), ids, [("a", fixture_path(path))], "a")
    assert rel(got, ref["logits_qv8"]) <= 1e-4


def test_decode_mode(tmp_path, ref):
    ids = ref["ids"].tolist()[:12]
    got = logits(tmp_path, fixture_path("tiny_llama"), ids, [("x", fixture_path("lora/all16"))], "x", mode="decode")
    assert rel(got, ref["logits_all16"][:12]) <= 1e-4


def bad_run(tmp_path, lora_path, adapter="bad"):
    return run_cli(["logits", "--model", fixture_path("tiny_llama"), "--ids", "1,2,3", "--out", tmp_path / "o",
                    "--lora", f"bad={lora_path}", "--adapter", adapter])


def copy_adapter(tmp_path, src="qv8"):
    d = tmp_path / "ad"
    shutil.copytree(fixture_path(f"lora/{src}"), d)
    return d


def test_bad_adapters_exit_3(tmp_path):
    cp = bad_run(tmp_path, tmp_path / "nowhere")
    assert cp.returncode == 3 and "cannot open" in cp.stderr, cp.stderr
    # DoRA
    d = copy_adapter(tmp_path)
    cfg = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    cp = bad_run(tmp_path, d)
    assert cp.returncode == 3 and "DoRA" in cp.stderr, cp.stderr
    # unknown module
    (d / "adapter_config.json").write_text(json.dumps({**cfg, "target_modules": ["q_proj", "lm_head"]}))
    cp = bad_run(tmp_path, d)
    assert cp.returncode == 3 and "lm_head" in cp.stderr, cp.stderr
    # wrong rank in the config
    (d / "adapter_config.json").write_text(json.dumps({**cfg, "r": 4}))
    cp = bad_run(tmp_path, d)
    assert cp.returncode == 3 and "rank 8" in cp.stderr, cp.stderr
    # corrupted safetensors (truncated)
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    st = d / "adapter_model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])
    cp = bad_run(tmp_path, d)
    assert cp.returncode == 3 and "safetensors" in cp.stderr, cp.stderr
    # a shape that does not fit the base (an adapter of another model)
    cp = run_cli(["logits", "--model", fixture_path("tiny_qwen3"), "--ids", "1,2", "--out", tmp_path / "o",
                  "--lora", f"x={fixture_path('lora/qv8')}"])
    assert cp.returncode == 3 and "q_proj.lora_B.weight" in cp.stderr and "expected [128 x 8]" in cp.stderr, \
        cp.stderr
    # MLP adapters on a mixture-of-experts model
    cp = run_cli(["logits", "--model", fixture_path("tiny_qwen3moe"), "--ids", "1,2", "--out", tmp_path / "o",
                  "--lora", f"x={fixture_path('lora/mlp8bf16')}"])
    assert cp.returncode == 3 and "mixture-of-experts" in cp.stderr, cp.stderr
    # a model file, not an adapter
    cp = bad_run(tmp_path, fixture_path("tiny_llama_f32.gguf"))
    assert cp.returncode == 3 and "general.type" in cp.stderr, cp.stderr
    # --adapter naming no --lora; a malformed --lora
    cp = bad_run(tmp_path, fixture_path("lora/qv8"), adapter="other")
    assert cp.returncode == 2 and "other" in cp.stderr, cp.stderr
    cp = run_cli(["logits", "--model", fixture_path("tiny_llama"), "--ids", "1", "--out", tmp_path / "o",
                  "--lora", "nopath"])
    assert cp.returncode == 2, cp.stderr


def test_perplexity_with_adapter(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    common = ["perplexity", "--model", fixture_path("tiny_llama"), "--file", text, "--ctx", "32", "--chunks", "2",
              "--threads", "2", "--precision", "f32"]
    base = run_json(common)
    assert base["adapter"] is None
    lo = run_json(common + ["--lora", f"a={fixture_path('lora/all16')}", "--adapter", "a"])
    assert lo["adapter"] == "a" and lo["tokens"] == base["tokens"]
    assert abs(lo["ppl"] - base["ppl"]) > 1e-3 * base["ppl"]


# ------------------------------------------------------------------ generate
PROMPT = "the quick brown fox jumps over the lazy dog and then runs far away into the deep dark forest"
LORAS = ["--lora", f"qv8={fixture_path('lora/qv8')}", "--lora", f"all16={fixture_path('lora/all16')}",
         "--lora", f"mlp={fixture_path('lora/mlp8bf16')}"]


def test_tensor_plan_runs_adapters(tmp_path):
    """A plan runs adapters too (once refused as "not supported"): each rank
    loads and slices them (tests/e2e/test_lora_cluster.py checks plans
    against peft and the processes' refusals)."""
    args = ["--model", fixture_path("tiny_llama"), "--prompt", PROMPT, "--max-new", 6, "--greedy", "--threads", 2,
            "--precision", "f32", *LORAS, "--adapter", "all16"]
    want = run_json(args)
    got = run_json(args + ["--plan", "tensor:2"])
    assert got["text"] == want["text"] and got["adapters"] == ["all16"], (got, want)


# ---------------------------------------------------------------------- HTTP
def http(url, body=None):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture(scope="module")
def server():
    import re
    import subprocess

    from conftest import IE_BIN

    proc = subprocess.Popen([str(IE_BIN), "serve", "--model", str(fixture_path("tiny_llama")), "--port", "0",
                             "--threads", "2", "--batch", "8", "--precision", "f32", *map(str, LORAS)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.match(r"listening on http://(\S+):(\d+)$", line.strip())
        if m:
            port = int(m.group(2))
            break
    assert port, "server did not start"
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    assert proc.wait(60) == 0


def solo(name, prompt):
    """The CLI's greedy text for prompt with adapter name (tiny_llama: the base)."""
    extra = ["--adapter", name] if name != "tiny_llama" else []
    return run_json(["--model", fixture_path("tiny_llama"), "--prompt", prompt, "--max-new", 6, "--greedy",
                     "--threads", 2, "--precision", "f32", *LORAS, *extra])


def complete(url, name, prompt):
    st, js = http(url + "/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 6, "temperature": 0})
    assert st == 200, js
    return js["choices"][0]["text"]


def test_http_model_field_selects_adapter(server):
    st, js = http(server + "/v1/models")
    models = js["data"]
    assert [m["id"] for m in models] == ["tiny_llama", "qv8", "all16", "mlp"]
    assert all(m.get("parent") == "tiny_llama" for m in models[1:])
    assert http(server + "/v1/models/all16")[1]["parent"] == "tiny_llama"
    for name in ["tiny_llama", "qv8", "all16"]:
        ref = solo(name, PROMPT)
        assert ref["adapters"] == ([] if name == "tiny_llama" else [name])
        assert complete(server, name, PROMPT) == ref["text"], name
    st, _ = http(server + "/v1/completions", {"model": "nope", "prompt": PROMPT, "max_tokens": 2})
    assert st == 404


def test_mixed_requests_equal_solo_runs(server):
    """The base and three adapters, two streams each, sent at once (one
    scheduler: they share steps): every request gets its solo run's text."""
    from concurrent.futures import ThreadPoolExecutor

    names = ["tiny_llama", "qv8", "all16", "mlp"]
    texts = ["hello world", PROMPT]
    want = {(n, t): solo(n, t)["text"] for n in names for t in texts}
    assert len({want[n, PROMPT] for n in names}) == len(names), "the adapters change the output"
    jobs = [(n, t) for _ in range(2) for n in names for t in texts]
    with ThreadPoolExecutor(len(jobs)) as ex:
        got = list(ex.map(lambda j: complete(server, *j), jobs))
    assert got == [want[j] for j in jobs]


def test_prefix_cache_keyed_by_adapter(server):
    """The same long prompt under one adapter, then another, then the base:
    each must get its own solo text — KV computed under one adapter must
    never be reused under another (qv8 and all16 both adapt v)."""
    long = PROMPT + " and " + PROMPT
    for name in ["qv8", "all16", "tiny_llama", "qv8"]:
        assert complete(server, name, long) == solo(name, long)["text"], name
