"""LoRA adapters on cluster plans (issue 20, item 5): every rank loads the
adapter from its own disk, checks the file's fingerprint against the
coordinator's, and holds its share (ie_lora_slice: tensor ranks cut A / B
like the base weights, pipeline stages keep their layers).

  a) `logits --plan tensor:2|pipeline:2` with each fixture adapter (and the
     GGUF LoRA) at f32: within 1e-4 relative of peft's logits (ref.npz),
     and greedy generation gives the embedded engine's text;
  b) `serve --plan tensor:2|pipeline:2`: a mixed batch of the base and
     three adapters (two streams each, sent at once) gives every request
     its solo embedded text;
  c) tensor:3 on SmolLM2-135M with a synthetic adapter on all seven
     projections: the embedded engine's logits;
  d) ie-coordinator + ie-worker processes: a worker whose copy of an
     adapter differs (`--lora-dir` points it at an edited copy) makes the
     coordinator refuse that adapter, naming the rank, while the base and
     the other adapter serve; a worker killed and restarted gets the
     attached adapters again before it is ready, and adapter requests
     still give their solo text.

Fixtures: tests/data/lora (tests/reference/gen_lora_ref.py).
"""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import IE_BIN, binary, fixture_path, free_port, read_logits, run_json

ADAPTERS = ["qv8", "all16", "mlp8bf16", "o4f16"]
PLANS = ["tensor:2", "pipeline:2"]
PROMPT = "the quick brown fox jumps over the lazy dog and then runs far away into the deep dark forest"
LORAS = ["--lora", f"qv8={fixture_path('lora/qv8')}", "--lora", f"all16={fixture_path('lora/all16')}",
         "--lora", f"mlp={fixture_path('lora/mlp8bf16')}"]


@pytest.fixture(scope="module")
def ref():
    return np.load(fixture_path("lora/ref.npz"))


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def plan_logits(tmp_path, plan, ids, name, path, mode="prefill"):
    out = tmp_path / f"o_{plan.replace(':', '_')}_{name}.f32"
    info = run_json(["logits", "--model", fixture_path("tiny_llama"), "--ids", ",".join(map(str, ids)),
                     "--precision", "f32", "--mode", mode, "--threads", "2", "--plan", plan, "--out", out,
                     "--lora", f"{name}={path}", "--adapter", name])
    assert info["adapter"] == name, info
    return read_logits(out, len(ids), info["n_vocab"])


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("name", ADAPTERS)
def test_plan_logits_match_peft(tmp_path, ref, plan, name):
    ids = ref["ids"].tolist()
    got = plan_logits(tmp_path, plan, ids, name, fixture_path(f"lora/{name}"))
    assert rel(got, ref[f"logits_{name}"]) <= 1e-4
    assert rel(got, ref["logits_base"]) > 1e-2, "the adapter changed nothing"


@pytest.mark.parametrize("plan", PLANS)
def test_plan_gguf_lora_and_decode(tmp_path, ref, plan):
    """The GGUF LoRA (B rows un-permuted on the HF base) and decode mode
    (one token per step: the adapter frame of every step)."""
    ids = ref["ids"].tolist()[:12]
    got = plan_logits(tmp_path, plan, ids, "g", fixture_path("lora/qv8.gguf"), mode="decode")
    assert rel(got, ref["logits_qv8"][:12]) <= 1e-4


def generate(prompt, plan, name=None, max_new=8):
    extra = ["--adapter", name] if name else []
    return run_json(["--model", fixture_path("tiny_llama"), "--prompt", prompt, "--max-new", max_new, "--greedy",
                     "--threads", 2, "--precision", "f32", "--plan", plan, *LORAS, *extra])


@pytest.mark.parametrize("plan", PLANS)
def test_plan_greedy_equals_embedded(plan):
    for name in [None, "qv8", "all16", "mlp"]:
        want = generate(PROMPT, "none", name)
        got = generate(PROMPT, plan, name)
        assert got["text"] == want["text"], (plan, name)
        assert got["adapters"] == ([name] if name else []), got


# ---------------------------------------------------------------------- HTTP
def http(url, body=None, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def complete(url, name, prompt, max_tokens=6):
    st, js = http(url + "/v1/completions", {"model": name, "prompt": prompt, "max_tokens": max_tokens,
                                            "temperature": 0})
    assert st == 200, js
    return js["choices"][0]["text"]


_SOLO: dict = {}


def solo(name, prompt, max_new=6):
    """The embedded engine's greedy text (name "tiny_llama": the base)."""
    key = (name, prompt, max_new)
    if key not in _SOLO:
        _SOLO[key] = generate(prompt, "none", None if name == "tiny_llama" else name, max_new)["text"]
    return _SOLO[key]


@pytest.fixture(scope="module", params=PLANS + ["tensor:2+lookahead"])
def plan_server(request):
    """+lookahead: IE_LOOKAHEAD=1, every greedy decode step chained (sent
    ahead with its predecessor's adapter frame)."""
    import os

    plan, _, la = request.param.partition("+")
    env = dict(os.environ, IE_LOOKAHEAD="1") if la else None
    proc = subprocess.Popen([str(IE_BIN), "serve", "--model", str(fixture_path("tiny_llama")), "--port", "0",
                             "--threads", "2", "--batch", "8", "--precision", "f32", "--plan", plan,
                             *map(str, LORAS)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
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


def test_plan_mixed_requests_equal_solo_runs(plan_server):
    """The base and three adapters, two streams each, at once (they share
    steps: every step's adapter frame mixes ids): each gets its solo
    embedded text."""
    from concurrent.futures import ThreadPoolExecutor

    names = ["tiny_llama", "qv8", "all16", "mlp"]
    texts = ["hello world", PROMPT]
    want = {(n, t): solo(n, t) for n in names for t in texts}
    assert len({want[n, PROMPT] for n in names}) == len(names), "the adapters change the output"
    jobs = [(n, t) for _ in range(2) for n in names for t in texts]
    with ThreadPoolExecutor(len(jobs)) as ex:
        got = list(ex.map(lambda j: complete(plan_server, *j), jobs))
    assert got == [want[j] for j in jobs]


@pytest.mark.parametrize("seam", ["ack", "prep"])
def test_slow_attach_stalls_only_its_request(seam):
    """ack: both tensor ranks hold their answer to an adapter attach for
    3 s (IE_TEST_LORA_ACK_DELAY_MS, the worker's test seam) while they keep
    running steps. The request that needs the adapter waits those 3 s; the
    base requests beside it keep completing meanwhile (the stepping thread
    begins the attach and steps on; before, every step waited for the
    ranks); the adapter's text is its solo run.
    prep: both ranks' preparation of the adapter (read, fingerprint, slice,
    on their adapter thread) starts 3 s late (IE_TEST_LORA_PREP_DELAY_MS):
    the same, so the ranks step on while they prepare (with the
    preparation on a rank's main loop no base request ends meanwhile)."""
    import os
    import threading

    env = dict(os.environ, **{f"IE_TEST_LORA_{seam.upper()}_DELAY_MS": "3000"})
    proc = subprocess.Popen([str(IE_BIN), "serve", "--model", str(fixture_path("tiny_llama")), "--port", "0",
                             "--threads", "2", "--batch", "8", "--precision", "f32", "--plan", "tensor:2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    port = None
    for line in proc.stderr:
        m = re.match(r"listening on http://(\S+):(\d+)$", line.strip())
        if m:
            port = int(m.group(2))
            break
    assert port, "server did not start"
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # drain
    url = f"http://127.0.0.1:{port}"
    want = solo("qv8", PROMPT)
    try:
        body = {"lora_name": "qv8", "lora_path": str(fixture_path("lora/qv8"))}
        req = urllib.request.Request(url + "/v1/load_lora_adapter", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
        complete(url, "tiny_llama", "hello world", 4)
        ends, stop = [], threading.Event()

        def base_loop():
            while not stop.is_set():
                complete(url, "tiny_llama", "hello world", 4)
                ends.append(time.monotonic())

        t = threading.Thread(target=base_loop)
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        text = complete(url, "qv8", PROMPT)
        t1 = time.monotonic()
        stop.set()
        t.join()
        during = [x for x in ends if t0 + 0.5 < x < t1 - 0.5]
        print(f"attach request {t1 - t0:.2f} s; base requests ended meanwhile: {len(during)}")
        assert t1 - t0 >= 2.5, "the seam did not delay the attach: not tested"
        assert len(during) >= 3, (t1 - t0, len(during))
        assert text == want
        assert complete(url, "qv8", PROMPT) == want  # attached now: no wait
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


# ------------------------------------------------------------ processes
class Procs:
    """An ie-coordinator (HTTP API) with --lora flags and its ie-workers."""

    def __init__(self, logdir, coord_extra, n=2):
        self.logdir = logdir
        self.wport, self.hport = free_port(), free_port()
        self.ep = f"tcp://127.0.0.1:{self.wport}"
        self.url = f"http://127.0.0.1:{self.hport}"
        self.procs, self.workers, self.cmds = [], {}, {}
        self.coord_log = logdir / "coordinator.log"
        self.coord = self._spawn([str(binary("ie-coordinator")), "--model", str(fixture_path("tiny_llama")),
                                  "--plan", "tensor", "--workers", str(n), "--bind", self.ep,
                                  "--client-bind", f"tcp://127.0.0.1:{free_port()}", "--http-port",
                                  str(self.hport), "--precision", "f32", "--batch", "4", "--verbose",
                                  *coord_extra], self.coord_log)

    def _spawn(self, cmd, log):
        with open(log, "ab") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def start_worker(self, i, extra=()):
        if i not in self.cmds:
            self.cmds[i] = [str(binary("ie-worker")), "--model", str(fixture_path("tiny_llama")), "--coordinator",
                            self.ep, "--rank", str(i), "--verbose", *extra]
        self.workers[i] = self._spawn(self.cmds[i], self.logdir / f"worker{i}.log")
        return self.workers[i]

    def log(self):
        text = self.coord_log.read_text(errors="replace")
        for i in sorted(self.cmds):
            text += f"\n--- worker {i}\n" + (self.logdir / f"worker{i}.log").read_text(errors="replace")
        return text[-6000:]

    def wait_log(self, text, timeout_s=60):
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            assert self.coord.poll() is None, self.log()
            if text in self.coord_log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        pytest.fail(f"no {text!r} in the coordinator's log\n{self.log()}", pytrace=False)

    def complete(self, name, prompt, wait_s=60):
        """Retried while the cluster answers 503 (workers joining)."""
        end = time.monotonic() + wait_s
        while True:
            st, js = http(self.url + "/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 6,
                                                         "temperature": 0}, timeout=60)
            if st == 200:
                return js["choices"][0]["text"]
            assert st == 503 and time.monotonic() < end, (st, js, self.log())
            time.sleep(0.2)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


@pytest.fixture
def procs():
    made = []
    yield lambda *a, **k: made.append(Procs(*a, **k)) or made[-1]
    for p in made:
        p.stop()


def test_rank_with_other_copy_refused_base_serves(procs, tmp_path):
    """Worker 1 reads adapters from its own directory (--lora-dir), where
    qv8's weights differ by one byte: qv8 is refused naming rank 1 and the
    adapter, all16 (the same bytes there) is attached, and the base and
    all16 serve their embedded texts."""
    other = tmp_path / "host1"
    shutil.copytree(fixture_path("lora/qv8"), other / "qv8")
    shutil.copytree(fixture_path("lora/all16"), other / "all16")
    st = other / "qv8" / "adapter_model.safetensors"
    b = bytearray(st.read_bytes())
    b[-1] ^= 1  # a last-ulp change of one weight: the same shapes, another file
    st.write_bytes(bytes(b))
    (tmp_path / "logs").mkdir()
    c = procs(tmp_path / "logs", ["--lora", f"qv8={fixture_path('lora/qv8')}",
                                  "--lora", f"all16={fixture_path('lora/all16')}"])
    c.start_worker(0)
    c.start_worker(1, ["--lora-dir", str(other)])
    c.wait_log("LoRA all16 attached")
    log = c.coord_log.read_text(errors="replace")
    line = next((l for l in log.splitlines() if "LoRA qv8 not attached" in l), None)
    assert line, c.log()
    assert "rank 1" in line and "qv8" in line and "differs" in line, line
    st_, js = http(c.url + "/v1/models")
    assert [m["id"] for m in js["data"]] == ["tiny_llama", "all16"], js
    assert c.complete("tiny_llama", PROMPT) == solo("tiny_llama", PROMPT)
    assert c.complete("all16", PROMPT) == solo("all16", PROMPT)
    st_, js = http(c.url + "/v1/completions", {"model": "qv8", "prompt": PROMPT, "max_tokens": 2})
    assert st_ == 404, js


def test_worker_restarted_gets_adapters_again(procs, tmp_path):
    """A worker killed (SIGKILL) and started again is sent the attached
    adapters before it counts as ready: adapter requests afterwards give
    their solo texts (a rank without the adapter would fail the step)."""
    (tmp_path / "logs").mkdir()
    c = procs(tmp_path / "logs", ["--lora", f"qv8={fixture_path('lora/qv8')}",
                                  "--lora", f"mlp={fixture_path('lora/mlp8bf16')}"])
    c.start_worker(0)
    victim = c.start_worker(1)
    c.wait_log("LoRA mlp attached")
    assert c.complete("qv8", PROMPT) == solo("qv8", PROMPT)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=5)
    c.wait_log("worker rank 1 (pid")  # lost
    c.start_worker(1)
    for name in ["qv8", "mlp", "tiny_llama"]:
        assert c.complete(name, PROMPT) == solo(name, PROMPT), (name, c.log())
    w1 = (tmp_path / "logs" / "worker1.log").read_text(errors="replace")
    assert w1.count("adapter set 0 attached") == 2 and w1.count("adapter set 1 attached") == 2, c.log()


# ------------------------------------------------------------ three ranks
def synthetic_adapter(d, n_layer=30, dim=576, q=576, kv=192, ff=1536, r=8, seed=0):
    """A PEFT adapter of rank r on all seven projections of a SmolLM2-135M
    shaped base, random weights (the shapes are what matter here)."""
    from conftest import st_save

    rng = np.random.default_rng(seed)
    shapes = {"self_attn.q_proj": (q, dim), "self_attn.k_proj": (kv, dim), "self_attn.v_proj": (kv, dim),
              "self_attn.o_proj": (dim, q), "mlp.gate_proj": (ff, dim), "mlp.up_proj": (ff, dim),
              "mlp.down_proj": (dim, ff)}
    t = {}
    for l in range(n_layer):
        for mod, (n_out, n_in) in shapes.items():
            p = f"base_model.model.model.layers.{l}.{mod}"
            t[f"{p}.lora_A.weight"] = (rng.standard_normal((r, n_in)) * 0.05).astype(np.float32)
            t[f"{p}.lora_B.weight"] = (rng.standard_normal((n_out, r)) * 0.05).astype(np.float32)
    d.mkdir(parents=True)
    st_save(d / "adapter_model.safetensors", t)
    (d / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "bias": "none", "use_rslora": False,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}))
    return d


def test_tensor3_on_smollm2_equals_embedded(smollm2, tmp_path):
    """tensor:3 on SmolLM2-135M (9 heads, 3 KV heads, MLP 1536: each rank a
    third of every unit) with an adapter on every projection: f32 logits
    within 1e-4 relative of the embedded engine's (summation order only),
    and the adapter moves them."""
    ad = synthetic_adapter(tmp_path / "syn")
    ids = "6403,1980,253,655,28,281,253,1165"

    def logits(plan, lora=True):
        out = tmp_path / f"l_{plan.replace(':', '_')}_{lora}.f32"
        info = run_json(["logits", "--model", smollm2, "--ids", ids, "--precision", "f32", "--mode", "decode",
                         "--threads", "2", "--plan", plan, "--out", out,
                         *(["--lora", f"syn={ad}", "--adapter", "syn"] if lora else [])])
        return read_logits(out, len(ids.split(",")), info["n_vocab"])

    want, got, base = logits("none"), logits("tensor:3"), logits("none", lora=False)
    print(f"tensor:3 rel {rel(got, want):.3g}, adapter effect {rel(want, base):.3g}")
    assert rel(got, want) <= 1e-4  # measured 1.3e-6
    assert rel(want, base) > 1e-2, "the adapter changed nothing"
