"""LoRA adapters at run time (issue 20, docs/LORA.md): adapter sets summed
with per-request scales against peft's combined logits, vLLM's
/v1/load_lora_adapter and /v1/unload_lora_adapter, llama.cpp's `lora`
list, the LRU budget with transparent reloads, unloading under running
streams and under a 24-client load, bad adapters, the prefix-cache salt
and the /metrics series.

Every generated text is compared with the CLI's solo greedy run of the same
prompt and adapter set (`--adapter NAME:SCALE,...`) on the same f32 path.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import IE_BIN, fixture_path, read_logits, run_cli, run_json

KEY = "sekrit"
PROMPT = "the quick brown fox jumps over the lazy dog and then runs far away into the deep dark forest"
PATHS = {n: fixture_path(f"lora/{n}") for n in ["qv8", "all16", "mlp8bf16", "o4f16"]}


# ----------------------------------------------------------------- helpers
def http(url, body=None, key=KEY, raw=False):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            data = r.read()
            return r.status, (data.decode() if raw else json.loads(data))
    except urllib.error.HTTPError as e:
        data = e.read()
        try:
            return e.code, json.loads(data or b"{}")
        except ValueError:
            return e.code, data.decode()


def start(*args, model="tiny_llama", precision="f32", env=None):
    proc = subprocess.Popen([str(IE_BIN), "serve", "--model", str(fixture_path(model)), "--port", "0",
                             "--threads", "2", "--batch", "8", "--precision", precision, "--api-key", KEY,
                             *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        m = re.match(r"listening on http://(\S+):(\d+)$", line.strip())
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # drain
            return proc, f"http://127.0.0.1:{m.group(2)}"
    raise AssertionError("server did not start")


def stop(proc):
    proc.terminate()
    assert proc.wait(60) == 0


@pytest.fixture(scope="module")
def server():
    proc, url = start("--lora", f"qv8={PATHS['qv8']}")
    yield url
    stop(proc)


_solo_cache: dict = {}


def solo(spec, prompt=PROMPT, n=6):
    """The CLI's greedy text for prompt under adapter set spec (None: the base)."""
    key = (spec, prompt, n)
    if key not in _solo_cache:
        extra = ["--adapter", spec] if spec else []
        loras = [a for name, p in PATHS.items() for a in ("--lora", f"{name}={p}")]
        _solo_cache[key] = run_json(["--model", fixture_path("tiny_llama"), "--prompt", prompt, "--max-new", n,
                                     "--greedy", "--threads", 2, "--precision", "f32", *loras, *extra])["text"]
    return _solo_cache[key]


def complete(url, model="tiny_llama", prompt=PROMPT, n=6, **extra):
    st, js = http(url + "/v1/completions",
                  {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, **extra})
    return st, (js["choices"][0]["text"] if st == 200 else js)


def load(url, name, path, **extra):
    return http(url + "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path), **extra}, raw=True)


def unload(url, name):
    return http(url + "/v1/unload_lora_adapter", {"lora_name": name}, raw=True)


def metric(url, name, label=None):
    st, text = http(url + "/metrics", raw=True)
    assert st == 200
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{" if label else name + " ") or (label is None and line.startswith(name + "{")):
            if label and f'adapter="{label}"' not in line:
                continue
            total += float(line.rsplit(" ", 1)[1])
    return total


def is_openai_error(js, status_code=None):
    return (isinstance(js, dict) and set(js) == {"error"} and
            {"message", "type", "param", "code"} <= set(js["error"]) and
            (status_code is None or js["error"]["code"] == status_code))


# --------------------------------------------------- sets against peft
@pytest.mark.parametrize("key", ["qv8_all16", "mlp_o4_neg"])
def test_set_matches_peft_combined(tmp_path, key):
    """`logits --adapter a:w1,b:w2` (one ie_lora_concat set) equals the
    base plus the weighted sum of peft's per-adapter deltas, f32."""
    ref = np.load(fixture_path("lora/ref.npz"))
    sets = {"qv8_all16": "qv8:0.5,all16:0.75", "mlp_o4_neg": "mlp8bf16:1,o4f16:-0.5,qv8:0.25"}
    ids = ref["ids"].tolist()
    out = tmp_path / "o.f32"
    loras = [a for name, p in PATHS.items() for a in ("--lora", f"{name}={p}")]
    info = run_json(["logits", "--model", fixture_path("tiny_llama"), "--ids", ",".join(map(str, ids)),
                     "--precision", "f32", "--threads", 2, "--out", out, *loras, "--adapter", sets[key]])
    got = read_logits(out, len(ids), info["n_vocab"])
    want = ref[f"logits_set_{key}"]
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"set {key}: rel {rel:.2e}")
    assert rel <= 1e-4
    # and it is not just one of its parts
    for name in sets[key].split(","):
        assert float(np.abs(got - ref[f"logits_{name.split(':')[0]}"]).max()) > 1e-2


def test_http_lora_list_equals_cli_set(server):
    st, _ = load(server, "all16", PATHS["all16"])
    assert st == 200
    try:
        want = solo("qv8:0.5,all16:0.75")
        assert want != solo("qv8") and want != solo(None)
        lora = [{"name": "qv8", "scale": 0.5}, {"name": "all16", "scale": 0.75}]
        assert complete(server, lora=lora) == (200, want)
        assert complete(server, lora=lora[::-1]) == (200, want)  # order does not matter
        models = http(server + "/v1/models")[1]["data"]
        ids = {m["id"]: m["lora_id"] for m in models[1:]}
        assert all(m["parent"] == "tiny_llama" for m in models[1:]) and set(ids) == {"qv8", "all16"}
        by_id = [{"id": ids["qv8"], "scale": 0.5}, {"id": ids["all16"], "scale": 0.75}]
        assert complete(server, lora=by_id) == (200, want)
        # scale 0 turns a part off: qv8 alone; model field + list add up
        assert complete(server, lora=[{"name": "qv8"}, {"name": "all16", "scale": 0}]) == (200, solo("qv8"))
        assert complete(server, model="qv8", lora=[{"name": "all16", "scale": 0.75}]) == \
            (200, solo("qv8,all16:0.75"))
        for bad in [{"name": "qv8", "scale": "x"}, {"id": 1, "name": "qv8"}, {}, "qv8"]:
            st, js = complete(server, lora=[bad])
            assert st == 400 and is_openai_error(js), (bad, js)
        st, js = complete(server, lora=[{"name": "nope"}])
        assert st == 404 and is_openai_error(js, "model_not_found")
        st, js = complete(server, lora=[{"name": "qv8"}, {"name": "qv8"}])
        assert st == 400 and is_openai_error(js)
    finally:
        assert unload(server, "all16")[0] == 200


# ------------------------------------------------- load, use, unload
def test_load_use_unload(server, tmp_path):
    assert load(server, "o4", PATHS["o4f16"]) == \
        (200, "Success: LoRA adapter 'o4' added successfully.")
    assert [m["id"] for m in http(server + "/v1/models")[1]["data"]] == ["tiny_llama", "qv8", "o4"]
    assert http(server + "/v1/models/o4")[1]["parent"] == "tiny_llama"
    assert complete(server, "o4") == (200, solo("o4f16"))
    st, js = load(server, "o4", PATHS["o4f16"])
    assert st == 400 and "already been loaded" in js["error"]["message"]
    assert unload(server, "o4") == (200, "Success: LoRA adapter 'o4' removed successfully.")
    st, js = complete(server, "o4")
    assert st == 404 and is_openai_error(js, "model_not_found"), js
    st, js = unload(server, "o4")
    assert st == 404 and is_openai_error(js, "model_not_found"), js
    assert [m["id"] for m in http(server + "/v1/models")[1]["data"]] == ["tiny_llama", "qv8"]
    # behind the API key; vLLM's field checks
    st, js = http(server + "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(PATHS["qv8"])}, key=None)
    assert st == 401 and is_openai_error(js)
    st, js = http(server + "/v1/load_lora_adapter", {"lora_name": "x"})
    assert st == 400 and "Both 'lora_name' and 'lora_path'" in js["error"]["message"]
    st, js = http(server + "/v1/unload_lora_adapter", {})
    assert st == 400 and is_openai_error(js)
    # an adapter pinned at start can be unloaded too, and loaded again
    assert unload(server, "qv8")[0] == 200
    assert complete(server, "qv8")[0] == 404
    assert load(server, "qv8", PATHS["qv8"])[0] == 200
    assert complete(server, "qv8") == (200, solo("qv8"))


def test_bad_adapters_refused_server_keeps_serving(server, tmp_path):
    st, js = load(server, "bad", tmp_path / "nowhere")
    assert st == 400 and is_openai_error(js) and "cannot open" in js["error"]["message"], js
    d = tmp_path / "dora"
    shutil.copytree(PATHS["qv8"], d)
    cfg = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    st, js = load(server, "bad", d)
    assert st == 400 and "DoRA" in js["error"]["message"], js
    (d / "adapter_config.json").write_text(json.dumps({**cfg, "r": 4}))  # wrong rank / shape
    st, js = load(server, "bad", d)
    assert st == 400 and "rank 8" in js["error"]["message"], js
    st, js = load(server, "bad", fixture_path("tiny_llama_f32.gguf"))  # a model, not an adapter
    assert st == 400 and "general.type" in js["error"]["message"], js
    for name in ["", "a=b", "x" * 64]:
        assert load(server, name, PATHS["qv8"])[0] == 400
    assert "bad" not in [m["id"] for m in http(server + "/v1/models")[1]["data"]]
    assert complete(server, "qv8") == (200, solo("qv8"))
    assert complete(server) == (200, solo(None))


# ------------------------------------------------------- prefix salt
def test_reloaded_name_never_reuses_old_kv(server):
    """Adapter A runs a long prompt (its blocks enter the prefix cache), is
    unloaded, and B is loaded under the same name, getting the freed
    backend id: B must compute its own KV (the salt is per attached set,
    not per id), so its text is B's solo text."""
    long = PROMPT + " and " + PROMPT
    assert load(server, "swap", PATHS["all16"])[0] == 200
    assert complete(server, "swap", long) == (200, solo("all16", long))
    assert unload(server, "swap")[0] == 200
    time.sleep(0.3)  # the serving loop detaches it between steps
    assert load(server, "swap", PATHS["mlp8bf16"])[0] == 200
    try:
        assert complete(server, "swap", long) == (200, solo("mlp8bf16", long))
    finally:
        unload(server, "swap")


def wait_metric(url, name, pred, timeout=5.0):
    """The metric once pred holds (the serving loop acts between steps), or
    its last value after timeout."""
    end = time.time() + timeout
    while True:
        v = metric(url, name)
        if pred(v) or time.time() > end:
            return v
        time.sleep(0.05)


def test_unload_frees_prefix_blocks_at_once(server):
    """A long prompt under an adapter leaves its full blocks in the prefix
    cache; unloading the adapter frees them at once (ie_kv_blocks_cached
    back to what it was, they do not wait to age out), the base's cached
    blocks stay, and the same adapter loaded again gives the same text."""
    long = PROMPT + " and " + PROMPT
    assert complete(server, "tiny_llama", long) == (200, solo(None, long))  # the base's blocks, kept
    assert load(server, "pfx", PATHS["all16"])[0] == 200
    c0 = metric(server, "ie_kv_blocks_cached")
    assert c0 >= 1
    text = complete(server, "pfx", long)
    assert text == (200, solo("all16", long))
    c1 = metric(server, "ie_kv_blocks_cached")
    assert c1 > c0, (c0, c1)
    assert unload(server, "pfx") == (200, "Success: LoRA adapter 'pfx' removed successfully.")
    c2 = wait_metric(server, "ie_kv_blocks_cached", lambda v: v <= c0)
    print(f"cached blocks: before {c0:.0f}, with the adapter's {c1:.0f}, after unload {c2:.0f}")
    assert c2 == c0, (c0, c1, c2)
    hits = metric(server, "ie_prefix_cache_hit_tokens_total")
    assert complete(server, "tiny_llama", long) == (200, solo(None, long))
    assert metric(server, "ie_prefix_cache_hit_tokens_total") > hits  # the base's blocks survived
    assert load(server, "pfx", PATHS["all16"])[0] == 200
    try:
        assert complete(server, "pfx", long) == text
    finally:
        unload(server, "pfx")


# ------------------------------------------------------ LRU budget
def test_lru_eviction_and_transparent_reload():
    """A budget of 0.15 MB (qv8 14 KB pinned, all16 128 KB, mlp8bf16 18 KB, o4f16 7 KB in memory): using four in turn
    evicts the least recently used unpinned ones, a request for an evicted
    one reloads it from disk, and every text equals its solo run."""
    proc, url = start("--lora-budget-mb", "0.15", "--lora", f"qv8={PATHS['qv8']}")  # qv8 pinned
    try:
        for name in ["all16", "mlp8bf16", "o4f16"]:
            assert load(url, name, PATHS[name])[0] == 200
        loads0 = metric(url, "ie_lora_loads_total")
        order = ["all16", "mlp8bf16", "o4f16", "all16", "qv8", "mlp8bf16", "all16"]
        for name in order:
            assert complete(url, name) == (200, solo(name)), name
        models = {m["id"]: m for m in http(url + "/v1/models")[1]["data"][1:]}
        assert models["qv8"]["pinned"] and models["qv8"]["resident"]
        ev = metric(url, "ie_lora_evictions_total")
        reloads = metric(url, "ie_lora_loads_total") - loads0
        print(f"evictions {ev:.0f}, reloads {reloads:.0f}, "
              f"resident bytes {metric(url, 'ie_lora_resident_bytes'):.0f}")
        assert ev >= 2 and reloads >= 2
        assert metric(url, "ie_lora_resident_bytes") <= 0.15 * 1048576
        assert metric(url, "ie_lora_load_seconds_count") == metric(url, "ie_lora_loads_total")
    finally:
        stop(proc)


def adapter_bytes(path):
    """(weights, int8) bytes of a PEFT fixture from its safetensors header
    alone: the weights as the loader keeps them (bf16 when A and B are,
    else f32) and the int8 copy a worker on a quantized base makes
    (ie_lora_quantize_int8: codes of A and of B^T, B^T's rank rounded up to
    four, and an f32 scale per column of each)."""
    raw = (path / "adapter_model.safetensors").read_bytes()
    head = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    weights = int8 = 0
    for name, a in head.items():
        if not name.endswith("lora_A.weight"):
            continue
        b = head[name.replace("lora_A", "lora_B")]
        (r, n_in), (n_out, _) = a["shape"], b["shape"]
        es = 2 if a["dtype"] == b["dtype"] == "BF16" else 4
        weights += r * (n_in + n_out) * es
        int8 += r * n_in + (r + 3) // 4 * 4 * n_out + 4 * (n_in + n_out)
    return weights, int8


def test_budget_counts_int8_copies_on_quantized_base():
    """On a Q4_0 base the worker runs an int8 copy of each adapter it
    attaches, and the budget counts it: a budget of the three adapters'
    weights plus qv8's and all16's copies holds those two in use, and using
    mlp8bf16 as well evicts the least recently used (qv8); with the copies
    left out the three would fit and nothing would go. The resident-bytes
    gauge equals the expected sum to the byte. An adapter that fits the
    budget only without its copy is refused at load."""
    w = {n: adapter_bytes(PATHS[n]) for n in ["qv8", "all16", "mlp8bf16"]}
    assert w["qv8"] == (14336, 5376) and w["all16"] == (131072, 40960)  # by hand from the shapes
    budget = sum(x[0] for x in w.values()) + w["qv8"][1] + w["all16"][1]
    model = "tiny_llama_q4_0.gguf"
    proc, url = start("--lora-budget-mb", repr((budget + 0.5) / 1048576), model=model, precision="native")
    try:
        for name in w:
            assert load(url, name, PATHS[name])[0] == 200
        for name in ["qv8", "all16"]:
            assert complete(url, name)[0] == 200
        assert metric(url, "ie_lora_resident_bytes") == budget  # full to the byte, nothing evicted
        assert metric(url, "ie_lora_evictions_total") == 0
        st, text = complete(url, "mlp8bf16")
        loras = [a for n in w for a in ("--lora", f"{n}={PATHS[n]}")]
        assert (st, text) == (200, run_json(["--model", fixture_path(model), "--prompt", PROMPT, "--max-new", 6,
                                             "--greedy", "--threads", 2, *loras, "--adapter", "mlp8bf16"])["text"])
        assert metric(url, "ie_lora_evictions_total") == 1
        models = {m["id"]: m for m in http(url + "/v1/models")[1]["data"][1:]}
        assert [n for n in w if models[n]["resident"]] == ["all16", "mlp8bf16"]
        assert metric(url, "ie_lora_resident_bytes") == sum(sum(w[n]) for n in ["all16", "mlp8bf16"])
        assert metric(url, "ie_lora_resident_adapters") == 2
    finally:
        stop(proc)
    # an adapter whose weights fit but not with its copy is refused at load
    proc, url = start("--lora-budget-mb", repr((sum(w["all16"]) - 0.5) / 1048576), model=model, precision="native")
    try:
        st, text = load(url, "all16", PATHS["all16"])
        assert st == 400 and "40960 of them the backend's copy" in text["error"]["message"], text
        assert load(url, "qv8", PATHS["qv8"])[0] == 200
    finally:
        stop(proc)


def test_slow_attach_stalls_only_its_request_embedded():
    """The embedded engine prepares an adapter set (the sum, the check, the
    int8 copy on this Q4_0 base) on a helper thread while the serving loop
    steps on: with that preparation slowed by 2 s
    (IE_TEST_LORA_PREP_DELAY_MS, the same seam as ie-worker's), the first
    request naming an adapter loaded at run time (not attached yet: `--lora`
    at start attaches at once) waits those 2 s while
    base requests beside it keep completing (with the whole attach on the
    serving thread, between two steps, none would end meanwhile); its text
    is the CLI's solo run of that adapter on the same base."""
    import os

    model = "tiny_llama_q4_0.gguf"
    want = run_json(["--model", fixture_path(model), "--prompt", PROMPT, "--max-new", 6, "--greedy", "--threads", 2,
                     "--lora", f"all16={PATHS['all16']}", "--adapter", "all16"])["text"]
    env = dict(os.environ, IE_TEST_LORA_PREP_DELAY_MS="2000")
    proc, url = start(model=model, precision="native", env=env)
    try:
        assert load(url, "all16", PATHS["all16"])[0] == 200  # read and registered; attached at first use
        base = http(url + "/v1/models")[1]["data"][0]["id"]
        assert complete(url, base, prompt="hello world", n=4)[0] == 200
        ends, stop_ev = [], threading.Event()

        def base_loop():
            while not stop_ev.is_set():
                assert complete(url, base, prompt="hello world", n=4)[0] == 200
                ends.append(time.monotonic())

        t = threading.Thread(target=base_loop)
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        st, text = complete(url, "all16")
        t1 = time.monotonic()
        stop_ev.set()
        t.join()
        during = [x for x in ends if t0 + 0.5 < x < t1 - 0.5]
        print(f"attach request {t1 - t0:.2f} s; base requests ended meanwhile: {len(during)}")
        assert st == 200, text
        assert t1 - t0 >= 1.8, "the seam did not delay the attach: not tested"
        assert len(during) >= 3, (t1 - t0, len(during))
        assert (st, text) == (200, want)
        t0 = time.monotonic()
        assert complete(url, "all16") == (200, want)  # attached now: no wait
        assert time.monotonic() - t0 < 1.5
    finally:
        stop(proc)


# ------------------------------------------- unload under running work
def stream_text(url, model, n, on_first=None):
    body = {"model": model, "prompt": PROMPT, "max_tokens": n, "temperature": 0, "stream": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    text, first = "", True
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            text += json.loads(line[6:])["choices"][0]["text"]
            if first and on_first:
                on_first()
            first = False
    return text


def test_unload_while_streaming_does_not_corrupt(server):
    """Unload the adapter a stream runs right after its first chunk (eight
    base streams keep the steps busy so that it is still running): the
    answer says the unload waits, new requests get 404 at once, and the
    stream's text equals its solo run. Up to 5 tries to catch it running."""
    from concurrent.futures import ThreadPoolExecutor

    want = solo("all16", PROMPT, 90)
    deferred = 0
    for _ in range(5):
        assert load(server, "live", PATHS["all16"])[0] == 200
        answers = []

        def on_first():
            answers.append(unload(server, "live"))
            answers.append(complete(server, "live")[0])

        with ThreadPoolExecutor(9) as ex:
            busy = [ex.submit(stream_text, server, "tiny_llama", 90) for _ in range(8)]
            assert stream_text(server, "live", 90, on_first) == want
            for f in busy:
                f.result()
        assert answers[0][0] == 200 and answers[1] == 404, answers
        deferred += "finish first" in answers[0][1]
        assert "live" not in [m["id"] for m in http(server + "/v1/models")[1]["data"]]
        if deferred:
            break
    assert deferred, "the stream always ended before the unload: not tested"


def test_load_unload_churn_under_load(server):
    """64 clients generate (base, qv8, all16, a set of both, and 'churn')
    while a thread loads and unloads 'churn' 10 times: every request is
    answered (nothing lost) and each text that ran equals its solo run
    (nothing corrupted); 'churn' may be absent (404) or present."""
    from concurrent.futures import ThreadPoolExecutor

    assert load(server, "all16", PATHS["all16"])[0] == 200
    done = threading.Event()
    cycles = [0]

    def churn():
        for _ in range(10):
            assert load(server, "churn", PATHS["mlp8bf16"])[0] == 200
            time.sleep(0.01)
            assert unload(server, "churn")[0] == 200
            cycles[0] += 1
        done.set()

    kinds = [("tiny_llama", None), ("qv8", None), ("all16", None),
             ("tiny_llama", [{"name": "qv8", "scale": 0.5}, {"name": "all16", "scale": 0.75}]), ("churn", None)]
    want = {"tiny_llama": solo(None), "qv8": solo("qv8"), "all16": solo("all16"), "churn": solo("mlp8bf16"),
            "set": solo("qv8:0.5,all16:0.75")}

    def client(i):
        out = []
        while True:
            model, lora = kinds[i % len(kinds)]
            out.append(((model, lora), complete(server, model, **({"lora": lora} if lora else {}))))
            i += 1
            if done.is_set():
                return out

    t = threading.Thread(target=churn)
    t.start()
    try:
        with ThreadPoolExecutor(64) as ex:
            got = [r for rs in ex.map(client, range(64)) for r in rs]
    finally:
        done.set()
        t.join()
        unload(server, "all16")
    ran_churn = 0
    for (model, lora), (st, out) in got:
        key = "set" if lora else model
        if model == "churn" and st == 404:
            continue
        assert st == 200, (model, out)
        assert out == want[key], key
        ran_churn += model == "churn"
    print(f"churn cycles {cycles[0]}, requests {len(got)}, churn requests that ran {ran_churn}")
    assert cycles[0] == 10 and len(got) >= 48


# ---------------------------------------------------------- metrics
def test_metrics_move(server):
    before = (metric(server, "ie_lora_requests_total", "qv8"), metric(server, "ie_lora_generated_tokens_total", "qv8"))
    assert complete(server, "qv8", n=5)[0] == 200
    after = (metric(server, "ie_lora_requests_total", "qv8"), metric(server, "ie_lora_generated_tokens_total", "qv8"))
    assert after[0] == before[0] + 1 and after[1] == before[1] + 5
    assert metric(server, "ie_lora_resident_adapters") >= 1
    assert metric(server, "ie_lora_resident_bytes") > 0
    assert metric(server, "ie_lora_loads_total") >= 1


# ------------------------------------------------------------ config
def test_coordinator_config_file_lora(tmp_path):
    """`lora = NAME=PATH` in an ie-coordinator config file reaches the
    registry: a bad path fails the start naming the adapter."""
    from conftest import binary

    cfg = tmp_path / "c.conf"
    cfg.write_text(f"model = {fixture_path('tiny_llama')}\nlora = good={PATHS['qv8']}\n"
                   f"lora = broken={tmp_path / 'nowhere'}\nlora-budget-mb = 1.5\n")
    cp = subprocess.run([str(binary("ie-coordinator")), "--config", str(cfg), "--bind", "tcp://127.0.0.1:0",
                         "--client-bind", "tcp://127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 3 and "lora broken" in cp.stderr and "cannot open" in cp.stderr, cp.stderr


def test_cli_bad_set_specs(tmp_path):
    base = ["logits", "--model", fixture_path("tiny_llama"), "--ids", "1,2", "--out", tmp_path / "o",
            "--lora", f"a={PATHS['qv8']}"]
    for spec in ["a:x", "a,a", "a:1,", "b"]:
        cp = run_cli(base + ["--adapter", spec])
        assert cp.returncode == 2, (spec, cp.stderr)


# ------------------------------------------------------------ ZeroMQ
def test_zmq_adapter_lora_and_admin():
    """The client protocol: "adapter" and "lora" fields on generate, and
    load_lora / unload_lora messages (docs/PROTOCOL.md)."""
    import msgpack
    import zmq

    from conftest import free_port

    ep = f"tcp://127.0.0.1:{free_port()}"
    proc, _ = start("--zmq-bind", ep)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(ep)
    n = [0]

    def ask(msg):
        n[0] += 1
        sock.send(msgpack.packb({"v": 1, "id": f"r{n[0]}", **msg}))
        assert sock.poll(120000), "no answer"
        return msgpack.unpackb(sock.recv(), raw=False)

    def gen(**kw):
        return ask({"type": "generate", "prompt": PROMPT, "max_new": 6, "temperature": 0, **kw})

    try:
        r = ask({"type": "load_lora", "lora_name": "z", "lora_path": str(PATHS["all16"])})
        assert r["type"] == "ok" and "added" in r["message"], r
        r = ask({"type": "load_lora", "lora_name": "q", "lora_path": str(PATHS["qv8"]), "pinned": True})
        assert r["type"] == "ok", r
        assert gen(adapter="z")["text"] == solo("all16")
        assert gen()["text"] == solo(None)
        r = gen(lora=[{"name": "q", "scale": 0.5}, {"name": "z", "scale": 0.75}])
        assert r["type"] == "done" and r["text"] == solo("qv8:0.5,all16:0.75"), r
        r = ask({"type": "load_lora", "lora_name": "bad", "lora_path": "/nowhere"})
        assert r["type"] == "error" and r["code"] == "invalid_request", r
        r = ask({"type": "load_lora", "lora_name": "z"})  # no path
        assert r["type"] == "error" and r["code"] == "invalid_request", r
        assert ask({"type": "unload_lora", "lora_name": "z"})["type"] == "ok"
        r = gen(adapter="z")
        assert r["type"] == "error" and r["code"] == "not_found", r
        r = ask({"type": "unload_lora", "lora_name": "z"})
        assert r["type"] == "error" and r["code"] == "not_found", r
        r = gen(lora=[{"id": 250}])
        assert r["type"] == "error" and r["code"] == "not_found", r
        r = gen(lora=[{"name": "q", "id": 0}])
        assert r["type"] == "error" and r["code"] == "invalid_request", r
        assert gen(adapter="q")["text"] == solo("qv8")  # still serving
    finally:
        sock.close(0)
        ctx.term()
        stop(proc)


# -------------------------------------------------------- CLI prompts
def test_jsonl_prompts_file_per_prompt_adapters(tmp_path):
    """A prompts file named *.jsonl gives each prompt its own adapter set
    (one run, one scheduler: the prompts share steps); each prompt's ids
    equal its solo --adapter run; the JSON line lists the sets that ran;
    a bad line or unknown adapter fails that prompt alone."""
    lines = [{"prompt": PROMPT, "adapter": "qv8"}, {"prompt": PROMPT},
             {"prompt": PROMPT, "adapter": "qv8:0.5,all16:0.75"}, {"prompt": "hello there", "adapter": "all16"},
             {"prompt": PROMPT, "adapter": "nope"}]
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    loras = [a for name, p in PATHS.items() for a in ("--lora", f"{name}={p}")]
    common = ["--model", fixture_path("tiny_llama"), "--max-new", 6, "--greedy", "--threads", 2, "--precision", "f32",
              "--batch", 4, *loras]
    out = run_json(common + ["--prompts-file", f])
    assert out["adapters"] == ["qv8", "qv8:0.5,all16:0.75", "all16"]
    assert out["failed"] == 2 and [e["line"] for e in out["errors"]] == [5, 6]
    for i, x in enumerate(lines[:4]):
        solo_run = run_json(common + ["--prompt", x["prompt"], *(["--adapter", x["adapter"]] if "adapter" in x else [])])
        assert out["ids"][i] == solo_run["ids"], i
