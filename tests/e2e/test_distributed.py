"""End-to-end tests of the distributed service.

  a) inference-engine --plan pipeline:N|tensor:N (in-process workers over
     inproc) gives the same greedy text as the embedded engine (plan none):
     a pipeline always, a tensor plan up to near ties (its ranks sum
     partials in another order), so a tensor cluster is held to the
     in-process run of the same split (plan_ref); a plan the model's
     shapes forbid fails with a clear error line.
  b) ie-coordinator + ie-worker processes, clients through
     apps/clients/ie_client.py and the C ie-client-example.
  c) a worker killed with SIGKILL mid-generation: the client gets an
     "unavailable" error reply quickly, and the restarted worker rejoins.
  d) CURVE: keys from ie-keygen, encrypted cluster, an unknown client is
     refused (and logged).
  e) workers in two network namespaces routed through the root namespace.

Environment: IE_BUILD_DIR (default <repo>/build) holds the binaries;
IE_SMOLLM2 / IE_FIXTURES_DIR as in conftest.py. Missing binaries, models
or a failing `ip netns add` are failures, never skips.
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO, THREADS, binary, free_port, need_file, parse_single_json_line

sys.path.insert(0, str(REPO / "apps" / "clients"))
import ie_client  # noqa: E402

TINY_GPTOSS = FIXTURES / "tiny_gptoss.gguf"
PROMPTS = ["The capital of France is", "Once upon a time, in a small village,",
           "def fibonacci(n):"]
MAX_NEW = 32
LONG_PROMPT = "Once upon a time"


# ------------------------------------------------------------ embedded runs
def run_engine(model: Path, prompts, plan: str, tmp: Path, max_new: int = MAX_NEW):
    pf = tmp / f"prompts_{uuid.uuid4().hex[:6]}.txt"
    pf.write_text("\n".join(prompts) + "\n")
    cmd = [str(binary("inference-engine")), "--model", str(model), "--prompts-file", str(pf),
           "--max-new", str(max_new), "--greedy", "--threads", str(THREADS), "--plan", plan]
    cp = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120)
    return cp


def engine_texts(model: Path, prompts, plan: str, tmp: Path, max_new: int = MAX_NEW) -> list:
    cp = run_engine(model, prompts, plan, tmp, max_new)
    assert cp.returncode == 0, f"--plan {plan}: exit {cp.returncode}\n{cp.stderr[-2000:]}"
    out = parse_single_json_line(cp.stdout)
    text = out["text"]
    texts = text if isinstance(text, list) else [text]
    assert len(texts) == len(prompts), out
    assert out["tokens_out"] == max_new * len(prompts), out  # no early stop: a full comparison
    return texts


_EMBEDDED: dict = {}


def embedded(model: Path, prompts, tmp: Path, max_new: int = MAX_NEW) -> list:
    key = (str(model), tuple(prompts), max_new)
    if key not in _EMBEDDED:
        _EMBEDDED[key] = engine_texts(model, prompts, "none", tmp, max_new)
    return _EMBEDDED[key]


def plan_ref(model: Path, prompts, plan: str, tmp: Path, max_new: int = MAX_NEW) -> list:
    """The texts a 2-rank cluster of `plan` must give: the embedded engine's
    for a pipeline (its bits), the in-process `--plan tensor:2` run's for a
    tensor plan (the same split: its ranks sum partials in another order
    than one worker, and PROMPTS[1] sits on a near tie, TENSOR2_NEAR_TIE;
    test_tensor_logits_match_within_isa_noise bounds that difference)."""
    if plan == "pipeline":
        return embedded(model, prompts, tmp, max_new)
    key = (str(model), tuple(prompts), max_new, "tensor:2")
    if key not in _EMBEDDED:
        _EMBEDDED[key] = engine_texts(model, prompts, "tensor:2", tmp, max_new)
    return _EMBEDDED[key]


@pytest.fixture(scope="session")
def tiny_gptoss() -> Path:
    return need_file(TINY_GPTOSS, "tests/data/tiny_gptoss.gguf")


TENSOR2_NEAR_TIE = ("tensor-parallel ranks sum the attention-output and MLP partials in another order than "
                    "one worker does; with 2 ranks 'Once upon a time, in a small village,' flips at generated "
                    "token 17 (' a' / ' known' after 'Elwes was'), where the embedded model's top two logits are "
                    "0.0085 apart (18.3886 / 18.3801, measured 2026-11-27 with the fused online-softmax attention)")

TENSOR_NEAR_TIE = ("tensor-parallel ranks sum the attention-output and MLP partials in another order than "
                   "one worker does; with quantized activations (Q8 blocks) that rounding difference is "
                   "amplified to the same size as AVX2-vs-AVX-512 differences of the unsharded engine "
                   "(both ~0.5-1 logit on SmolLM2, measured by test_tensor_logits_match_within_isa_noise); "
                   "with 3 ranks 'Once upon a time, in a small village,' flips at token 6 where the "
                   "embedded model's top two logits are 0.04 apart")

LOGIT_IDS = "6403,1980,253,655,28,281,253,1165,6560,28,665,436,253,9357,1573"


def run_logits(model: Path, plan: str, tmp: Path, extra=(), env=None):
    import numpy as np
    out = tmp / f"logits_{plan.replace(':', '_')}_{len(extra)}.bin"
    r = subprocess.run([str(binary("inference-engine")), "logits", "--model", str(model), "--ids", LOGIT_IDS,
                        "--mode", "decode", "--threads", "2", "--plan", plan, "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.float32).reshape(len(LOGIT_IDS.split(",")), -1)


@pytest.mark.parametrize("plan", ["tensor:2", "tensor:3"])
def test_tensor_logits_exact_in_f32(plan, smollm2, tmp_path):
    """With f32 weights and activations the sharded math equals one worker's
    up to float summation order."""
    import numpy as np
    ref = run_logits(smollm2, "none", tmp_path, ("--precision", "f32"))
    got = run_logits(smollm2, plan, tmp_path, ("--precision", "f32"))
    assert np.abs(ref - got).max() < 1e-3 * np.abs(ref).max()


@pytest.mark.parametrize("plan", ["tensor:2", "tensor:3"])
def test_tensor_logits_match_within_isa_noise(plan, smollm2, tmp_path):
    """Natively (Q8 activations) tensor-parallel logits differ from one
    worker's no more than the unsharded engine's AVX2 run differs from its
    AVX-512 run, and every arg max that moves sits on a near tie."""
    import numpy as np
    ref = run_logits(smollm2, "none", tmp_path)
    got = run_logits(smollm2, plan, tmp_path)
    isa = run_logits(smollm2, "none", tmp_path, env=dict(os.environ, IE_ISA="avx2"))
    noise = np.abs(ref - isa).max()
    assert noise > 0  # the bound is a measured one, not a constant
    assert np.abs(ref - got).max() <= 2.0 * noise
    for r, g in zip(ref, got):
        if r.argmax() != g.argmax():
            top2 = np.sort(r)[-2:]
            assert top2[1] - top2[0] < 0.25, "arg max moved away from a near tie"


@pytest.mark.parametrize("plan", ["pipeline:2", pytest.param("tensor:2", marks=pytest.mark.xfail(
                                      strict=True, reason=TENSOR2_NEAR_TIE)), "pipeline:3",
                                  pytest.param("tensor:3", marks=pytest.mark.xfail(
                                      strict=True, reason=TENSOR_NEAR_TIE))])
def test_inproc_plans_match_embedded_smollm2(plan, smollm2, tmp_path):
    ref = embedded(smollm2, PROMPTS, tmp_path)
    got = engine_texts(smollm2, PROMPTS, plan, tmp_path)
    for p, r, g in zip(PROMPTS, ref, got):
        assert g == r, f"--plan {plan}, prompt {p!r}:\n  embedded {r!r}\n  got      {g!r}"


@pytest.mark.parametrize("plan", ["pipeline:2", "tensor:2", "pipeline:3"])  # tensor:3: 2 KV heads only
def test_inproc_plans_match_embedded_tiny_gptoss(plan, tiny_gptoss, tmp_path):
    prompts = ["hello world", "The quick brown fox"]
    ref = embedded(tiny_gptoss, prompts, tmp_path, 16)
    got = engine_texts(tiny_gptoss, prompts, plan, tmp_path, 16)
    assert got == ref, f"--plan {plan}: {got!r} != {ref!r}"


def run_lookahead(model: Path, prompts, plan: str, tmp: Path, lookahead: str | None, extra=()) -> dict:
    """inference-engine over the prompts decoded together (--batch), with
    IE_LOOKAHEAD set to `lookahead` (None: unset); the JSON line."""
    pf = tmp / f"prompts_{uuid.uuid4().hex[:6]}.txt"
    pf.write_text("\n".join(prompts) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "IE_LOOKAHEAD"}
    if lookahead is not None:
        env["IE_LOOKAHEAD"] = lookahead
    cmd = [str(binary("inference-engine")), "--model", str(model), "--prompts-file", str(pf), "--batch",
           str(len(prompts)), "--max-new", str(MAX_NEW), "--greedy", "--threads", str(THREADS), "--plan", plan,
           *extra]
    cp = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120, env=env)
    assert cp.returncode == 0, f"{cmd}: exit {cp.returncode}\n{cp.stderr[-2000:]}"
    return parse_single_json_line(cp.stdout)


def test_lookahead_chained_steps_match_embedded(smollm2, tmp_path):
    """Chained steps (docs/PROTOCOL.md): with IE_LOOKAHEAD=1 the cluster sends
    every all-greedy decode step's successor ahead, the ranks pick its tokens
    themselves; the ids are those of the same plan without chaining (a
    tensor plan's own: TENSOR2_NEAR_TIE). Requests that all end by length
    drop nothing (the scheduler says so beforehand); a stop string that ends
    one request of a batch early drops the step sent ahead, and the ids are
    still the unchained run's. The stop strings come from well into the
    text: a step is sent ahead only when no prompt waits to join (early on,
    whether the third prompt joined yet is a matter of timing) and no row's
    next position starts a KV block (so a given stop may send nothing ahead
    at its step, every time: of three candidates, one must drop)."""
    emb = run_lookahead(smollm2, PROMPTS, "none", tmp_path, None)
    assert "lookahead_used" not in emb, emb  # no cluster, no chaining
    # off: nothing sent ahead
    ref = run_lookahead(smollm2, PROMPTS, "tensor:2", tmp_path, "0")
    assert ref["lookahead_used"] == 0 and ref["lookahead_dropped"] == 0, ref
    got = run_lookahead(smollm2, PROMPTS, "tensor:2", tmp_path, "1")
    assert got["ids"] == ref["ids"], (got["ids"], ref["ids"])
    assert got["lookahead_used"] > 0 and got["lookahead_dropped"] == 0, got
    # stop strings from the middle of the second prompt's text
    text = ref["text"][1]
    dropped = []
    for at in (40, 60, 80):
        stop = text[at:at + 8]
        assert len(stop) == 8 and stop.strip() and stop not in text[:at], text
        ref_s = run_lookahead(smollm2, PROMPTS, "tensor:2", tmp_path, "0", ("--stop", stop))
        assert "stop" in ref_s["stop_reason"], ref_s
        got_s = run_lookahead(smollm2, PROMPTS, "tensor:2", tmp_path, "1", ("--stop", stop))
        assert got_s["ids"] == ref_s["ids"] and got_s["text"] == ref_s["text"], (got_s, ref_s)
        assert got_s["lookahead_used"] > 0, got_s
        dropped.append(got_s["lookahead_dropped"])
    assert max(dropped) >= 1, dropped


def test_lookahead_auto_needs_a_spare_cpu(smollm2, tmp_path):
    """Unset IE_LOOKAHEAD: the cluster chains only when the ranks' threads
    on its host leave it a CPU (2 ranks x 1 thread here)."""
    got = run_lookahead(smollm2, PROMPTS[:1], "tensor:2", tmp_path, None)
    cpus = len(os.sched_getaffinity(0))
    rank_threads = 2 * max(1, THREADS // 2)
    if rank_threads >= cpus:
        assert got["lookahead_used"] == 0 and got["lookahead_dropped"] == 0, (cpus, got)
    else:
        assert got["lookahead_used"] > 0, (cpus, got)


@pytest.mark.parametrize("plan,words", [("tensor:64", ("tensor", "KV heads")),
                                        ("pipeline:64", ("pipeline", "layers"))])
def test_plan_the_shapes_forbid_fails(plan, words, tiny_gptoss, tmp_path):
    cp = run_engine(tiny_gptoss, ["hello"], plan, tmp_path, 4)
    assert cp.returncode != 0, f"--plan {plan} should fail; stdout {cp.stdout[:300]!r}"
    assert cp.stdout == "", cp.stdout
    lines = [l for l in cp.stderr.splitlines() if l.startswith("error:")]
    assert lines, f"no error line on stderr: {cp.stderr!r}"
    assert all(w in lines[0] for w in words), lines


# ------------------------------------------------------------ processes
class Cluster:
    """An ie-coordinator and its ie-worker processes; logs under `logdir`."""

    def __init__(self, model: Path, plan: str, n_workers: int, logdir: Path, *,
                 bind_host: str = "127.0.0.1", worker_host: str = "127.0.0.1",
                 coord_curve: list | None = None, coord_extra: list | None = None,
                 coord_env: dict | None = None):
        self.model, self.plan, self.n = model, plan, n_workers
        self.logdir = logdir
        self.wport, self.cport = free_port(), free_port()
        self.worker_ep = f"tcp://{worker_host}:{self.wport}"
        self.client_ep = f"tcp://127.0.0.1:{self.cport}"
        self.procs: list = []
        self.workers: dict = {}
        self.worker_cmds: dict = {}
        cmd = [str(binary("ie-coordinator")), "--model", str(model), "--plan", plan,
               "--workers", str(n_workers), "--bind", f"tcp://{bind_host}:{self.wport}",
               "--client-bind", self.client_ep, "--verbose"] + (coord_curve or []) + (coord_extra or [])
        self.coord_log = logdir / "coordinator.log"
        self.coord = self._spawn(cmd, self.coord_log, dict(os.environ, **coord_env) if coord_env else None)

    def _spawn(self, cmd, log: Path, env: dict | None = None) -> subprocess.Popen:
        with open(log, "ab") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        self.procs.append(p)
        return p

    def start_worker(self, i: int, extra: list | None = None, prefix: list | None = None,
                     coordinator: str | None = None) -> subprocess.Popen:
        if i not in self.worker_cmds:
            self.worker_cmds[i] = (prefix or []) + [
                str(binary("ie-worker")), "--model", str(self.model),
                "--coordinator", coordinator or self.worker_ep] + (extra or [])
        p = self._spawn(self.worker_cmds[i], self.logdir / f"worker{i}.log")
        self.workers[i] = p
        return p

    def log(self) -> str:
        text = self.coord_log.read_text(errors="replace")
        for i in sorted(self.worker_cmds):
            text += f"\n--- worker {i}\n" + (self.logdir / f"worker{i}.log").read_text(errors="replace")
        return text[-6000:]

    def generate(self, prompt: str, *, wait_s: float = 30, **kw) -> dict:
        """A greedy request, retried while the cluster answers "unavailable"
        (workers still registering / loading) for at most wait_s."""
        deadline = time.monotonic() + wait_s
        last = None
        while time.monotonic() < deadline:
            assert self.coord.poll() is None, f"coordinator exited {self.coord.returncode}\n{self.log()}"
            try:
                return ie_client.generate(self.client_ep, prompt=prompt, temperature=0.0,
                                          timeout_s=max(5.0, deadline - time.monotonic()), **kw)
            except ie_client.ClientError as e:
                if e.code != "unavailable":
                    raise
                last = e
                time.sleep(0.2)
        pytest.fail(f"cluster not serving within {wait_s}s: {last}\n{self.log()}", pytrace=False)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        t_end = time.monotonic() + 3
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


@pytest.fixture
def clusters():
    made: list = []
    yield made
    for c in made:
        c.stop()


def start_cluster(clusters, model, plan, n, logdir, **kw) -> Cluster:
    logdir.mkdir(parents=True, exist_ok=True)
    c = Cluster(model, plan, n, logdir, **kw)
    clusters.append(c)
    return c


@pytest.mark.parametrize("plan,lookahead", [("tensor", None), ("tensor", "1"), ("pipeline", None)])
def test_processes_greedy_and_streaming(plan, lookahead, smollm2, clusters, tmp_path):
    """lookahead "1": the coordinator chains every greedy step (IE_LOOKAHEAD)."""
    ref = plan_ref(smollm2, PROMPTS, plan, tmp_path)
    mport = free_port()
    c = start_cluster(clusters, smollm2, plan, 2, tmp_path / "logs", coord_extra=["--metrics-port", str(mport)],
                      coord_env={"IE_LOOKAHEAD": lookahead} if lookahead else None)
    c.start_worker(0)
    c.start_worker(1)
    done = c.generate(PROMPTS[0], max_new=MAX_NEW)
    assert done["type"] == "done" and done["text"] == ref[0], (done, ref[0])
    assert done["n_gen"] == MAX_NEW and done["finish"] == "length", done
    # the other prompts, streamed: the events add up to the final text
    for p, r in zip(PROMPTS[1:], ref[1:]):
        done = ie_client.generate(c.client_ep, prompt=p, stream=True, max_new=MAX_NEW,
                                  temperature=0.0, timeout_s=60)
        evs = done["events"]
        assert [e["type"] for e in evs] == ["token"] * len(evs) and evs, done
        assert "".join(e["text"] for e in evs) == done["text"], done
        assert [e["index"] for e in evs] == list(range(len(evs))), [e["index"] for e in evs]
        assert done["text"] == r, (p, done["text"], r)

    if lookahead:  # the chained steps were used, none dropped (every request ends by length)
        import urllib.request
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        used = [l for l in text.splitlines() if l.startswith('ie_lookahead_steps_total{outcome="used"}')]
        dropped = [l for l in text.splitlines() if l.startswith('ie_lookahead_steps_total{outcome="dropped"}')]
        assert used and float(used[0].split()[-1]) > 0, text
        assert not dropped or float(dropped[0].split()[-1]) == 0, text

def serve_embedded(model: Path, logdir: Path):
    """inference-engine serve behind the same client protocol (ZeroMQ):
    (process, client endpoint)."""
    ep = f"tcp://127.0.0.1:{free_port()}"
    log = open(logdir / f"serve-{uuid.uuid4().hex[:6]}.log", "w")
    p = subprocess.Popen([str(binary("inference-engine")), "serve", "--model", str(model), "--port", "0",
                          "--zmq-bind", ep, "--batch", "1", "--threads", str(THREADS)],
                         stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return p, ep


def test_processes_sampled_and_penalized_rows_whole(smollm2, clusters, tmp_path):
    """Only greedy requests without penalties or a logit bias get
    arg-max-only rows from the ranks (PROTOCOL.md, RESULT); sampled,
    penalized and biased ones get the whole logits. A pipeline gives the embedded engine's bits, so with the same
    seed those requests must give the embedded engine's text — which only
    holds if the coordinator saw every logit; the tensor plan must serve
    them too, and its greedy request must still match."""
    logdir = tmp_path / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    reqs = [dict(temperature=0.9, seed=7, max_new=24),                 # sampled: top-k/top-p/min-p defaults
            dict(temperature=1.3, top_k=0, top_p=1.0, min_p=0.0, seed=11, max_new=24),  # every logit counts
            dict(temperature=0.0, repeat_penalty=1.5, max_new=24),       # greedy with a penalty
            dict(temperature=0.0, max_new=24)]                            # arg max only
    serve, ep = serve_embedded(smollm2, logdir)
    try:
        first = ie_client.generate(ep, prompt=PROMPTS[1], timeout_s=120, temperature=0.0, max_new=1, logprobs=0)
        reqs.append(dict(temperature=0.0, logit_bias={first["logprobs"][0]["token"]: -100.0}, max_new=24))
        ref = []
        for r in reqs:
            d = ie_client.generate(ep, prompt=PROMPTS[1], timeout_s=120, **r)
            assert d["type"] == "done", d
            ref.append(d["text"])
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert ref[2] != ref[3], "the penalty should change the greedy text (else this test checks nothing)"
    assert ref[4] != ref[3], "so should the bias"
    for plan in ("pipeline", "tensor"):
        c = start_cluster(clusters, smollm2, plan, 2, logdir / plan)
        c.start_worker(0)
        c.start_worker(1)
        assert c.generate(PROMPTS[0], max_new=1)["type"] == "done"  # waits until both ranks serve
        got = []
        for r in reqs:
            d = ie_client.generate(c.client_ep, prompt=PROMPTS[1], timeout_s=120, **r)
            assert d["type"] == "done" and d["n_gen"] == 24, (plan, r, d)
            got.append(d["text"])
        if plan == "pipeline":
            assert got == ref, (got, ref)
        else:  # the same split's greedy text (TENSOR2_NEAR_TIE)
            want = engine_texts(smollm2, [PROMPTS[1]], "tensor:2", tmp_path, 24)[0]
            assert got[3] == want, (got[3], want)
        c.stop()


def test_processes_malformed_requests_and_c_client(smollm2, clusters, tmp_path):
    ref = plan_ref(smollm2, PROMPTS, "tensor", tmp_path)
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs")
    c.start_worker(0)
    c.start_worker(1)
    c.generate(PROMPTS[0], max_new=4)  # serving
    bad = [b"\xc1\xff\x00garbage",                                  # not MessagePack
           ie_client.msgpack.packb([1, 2, 3]),                      # not a map
           ie_client.msgpack.packb({"v": 1, "type": "generate", "id": "b1", "prompt": 123}),
           ie_client.msgpack.packb({"v": 1, "type": "generate", "id": "b2", "prompt": "x",
                                    "max_new": "lots"}),
           ie_client.msgpack.packb({"v": 1, "type": "generate", "id": "b3", "prompt": "x",
                                    "temperature": [1]}),
           ie_client.msgpack.packb({"v": 99, "type": "generate", "id": "b4", "prompt": "x"}),
           ie_client.msgpack.packb({"v": 1, "type": "launch", "id": "b5"}),
           b""]
    with ie_client.Connection(c.client_ep) as conn:
        for raw in bad:
            conn.send(raw)
            rep = conn.recv(5.0)
            assert rep.get("type") == "error", (raw, rep)
            assert isinstance(rep.get("code"), str) and rep["code"], rep
            assert isinstance(rep.get("message"), str) and rep["message"], rep
            assert rep["code"] in ("invalid_request", "unsupported"), (raw, rep)
    assert c.coord.poll() is None, c.log()
    done = c.generate(PROMPTS[0], max_new=MAX_NEW, wait_s=10)
    assert done["text"] == ref[0]

    # the C example client
    cp = subprocess.run([str(binary("ie-client-example")), "--endpoint", c.client_ep,
                         "--prompt", PROMPTS[1], "--max-new", str(MAX_NEW), "--timeout-ms", "30000"],
                        capture_output=True, timeout=60)
    out = cp.stdout.decode("utf-8", "replace")
    assert cp.returncode == 0, (cp.returncode, out, cp.stderr.decode(errors="replace"))
    text, sep, summary = out.rpartition("\ndone ")
    assert sep, out
    assert text == ref[1], (text, ref[1])
    assert f"n_gen={MAX_NEW}" in summary and "finish=length" in summary, summary

    # the Python CLI
    cp = subprocess.run([sys.executable, str(REPO / "apps" / "clients" / "ie_client.py"),
                         "--endpoint", c.client_ep, "--prompt", PROMPTS[2], "--stream",
                         "--max-new", str(MAX_NEW), "--greedy"], capture_output=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.decode() == ref[2] + "\n"


@pytest.mark.parametrize("lookahead", [None, "1"])
def test_worker_killed_mid_generation(lookahead, smollm2, clusters, tmp_path):
    """With --retry-ms 0 a request hit by a lost worker fails at once (also
    with a chained step in flight: IE_LOOKAHEAD=1)."""
    ref = plan_ref(smollm2, PROMPTS, "tensor", tmp_path)
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs", coord_extra=["--retry-ms", "0"],
                      coord_env={"IE_LOOKAHEAD": lookahead} if lookahead else None)
    c.start_worker(0)
    victim = c.start_worker(1)
    c.generate(PROMPTS[0], max_new=4)
    n, t_kill = 0, None
    with pytest.raises(ie_client.ClientError) as ei:
        # idle timeout 5 s: after the kill the error reply must come within 5 s, never silence
        for ev in ie_client.stream(c.client_ep, prompt=LONG_PROMPT, max_new=400, temperature=0.0,
                                   timeout_s=120, idle_timeout_s=5.0):
            assert ev["type"] == "token", f"generation finished before the kill: {ev}"
            n += 1
            if n == 10:
                victim.send_signal(signal.SIGKILL)
                t_kill = time.monotonic()
    took = time.monotonic() - t_kill if t_kill else None
    assert t_kill is not None, f"failed before the kill: {ei.value}"
    assert ei.value.code == "unavailable", (ei.value.code, ei.value.message, c.log())
    assert took <= 5.0, took
    victim.wait(timeout=5)
    assert c.coord.poll() is None, c.log()
    # restart it (same command): a new request completes within 30 s
    t0 = time.monotonic()
    c.start_worker(1)
    done = c.generate(PROMPTS[0], max_new=MAX_NEW, wait_s=30)
    assert time.monotonic() - t0 < 30
    assert done["text"] == ref[0], (done["text"], ref[0])


def wait_for_line(path: Path, text: str, timeout_s: float) -> float | None:
    """Seconds until `text` appears in the file at `path` (None: not within timeout_s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if path.exists() and text in path.read_text(errors="replace"):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def test_tensor_reduce_shared_memory(smollm2, clusters, tmp_path):
    """Tensor ranks on one host reduce through shared memory, with the text
    of the ZeroMQ path (which one rank started with IE_TP_SHM=0 makes the
    whole cluster use). A rank killed -9 mid-generation makes its peer fail
    the step it waits in within dead_ms, not hang; the restarted rank gets
    a new epoch's segments and the cluster serves the same text again."""
    ref = embedded(smollm2, PROMPTS[:1], tmp_path)
    dead_ms = 1500
    for mode in ("zmq", "shm"):
        c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / mode,
                          coord_extra=["--dead-ms", str(dead_ms), "--retry-ms", "0"])
        # ranks pinned: the kill below must hit rank 1 (two workers started at
        # once may otherwise register in either order)
        c.start_worker(0, extra=["--verbose", "--rank", "0"])
        c.start_worker(1, extra=["--verbose", "--rank", "1"], prefix=["env", "IE_TP_SHM=0"] if mode == "zmq" else None)
        done = c.generate(PROMPTS[0], max_new=MAX_NEW)
        assert done["text"] == ref[0], (mode, done["text"], ref[0])
        want = "tensor reduce: shared memory (2 ranks" if mode == "shm" else "tensor reduce: ZeroMQ"
        for i in range(2):
            assert want in (c.logdir / f"worker{i}.log").read_text(errors="replace"), (mode, c.log())
    # c is the shared-memory cluster: kill rank 1 while rank 0 computes and reduces
    victim, log0 = c.workers[1], c.logdir / "worker0.log"
    n, t_kill = 0, None
    with pytest.raises(ie_client.ClientError):
        for ev in ie_client.stream(c.client_ep, prompt=LONG_PROMPT, max_new=400, temperature=0.0,
                                   timeout_s=120, idle_timeout_s=5.0):
            n += 1
            if n == 10:
                victim.send_signal(signal.SIGKILL)
                t_kill = time.monotonic()
    assert t_kill is not None
    # Usually rank 0 is inside a step when rank 1 dies and gives up on its
    # reduce within dead_ms. When the kill falls between two steps, the
    # coordinator's send to the dead rank fails first and rank 0 is never
    # given the step; then the coordinator's "lost" line is the evidence.
    if wait_for_line(log0, "no partial sum from rank 1 within", 10.0) is not None:
        since_kill = time.monotonic() - t_kill  # a bound on when rank 0 gave up (slack: a loaded machine)
        assert since_kill < dead_ms / 1e3 + 3.0, (since_kill, c.log())
    else:
        assert "worker rank 1" in c.coord_log.read_text(errors="replace") and " lost: " in c.log(), c.log()
    victim.wait(timeout=5)
    c.start_worker(1)
    done = c.generate(PROMPTS[0], max_new=MAX_NEW, wait_s=30)
    assert done["text"] == ref[0], (done["text"], ref[0])
    text0 = log0.read_text(errors="replace")
    assert text0.count("tensor reduce: shared memory (2 ranks") >= 2, c.log()  # a new epoch, new segments


@pytest.mark.parametrize("plan,victim_rank", [("tensor", 1), ("pipeline", 1), ("pipeline", 0)])
def test_worker_killed_request_rerun_after_restart(plan, victim_rank, smollm2, clusters, tmp_path):
    """By default a request in flight when a worker dies waits for a
    replacement and is recomputed: the stream goes on where it stopped (no
    token repeated or lost) and the whole answer equals embedded. Killing
    pipeline stage 0 makes the next tries fail at once (the coordinator's
    send to it fails) until its heartbeat times out: the request keeps
    trying within --retry-ms instead of giving up."""
    max_new = 48
    # the uninterrupted run of the same plan (tensor sums partials in another
    # order than embedded and this prompt has a near tie; pipeline is exact)
    ref = engine_texts(smollm2, [LONG_PROMPT], f"{plan}:2", tmp_path, max_new)[0]
    c = start_cluster(clusters, smollm2, plan, 2, tmp_path / "logs")
    c.start_worker(1 - victim_rank, extra=["--rank", str(1 - victim_rank)])
    victim = c.start_worker(victim_rank, extra=["--rank", str(victim_rank)])
    c.generate(PROMPTS[0], max_new=4)
    texts, done, n = [], None, 0
    for ev in ie_client.stream(c.client_ep, prompt=LONG_PROMPT, max_new=max_new, temperature=0.0,
                               timeout_s=120, idle_timeout_s=30.0):
        if ev["type"] == "token":
            texts.append(ev["text"])
            n += 1
            if n == 8:
                victim.send_signal(signal.SIGKILL)
                victim.wait(timeout=5)
                time.sleep(0.5)
                c.start_worker(victim_rank)
        elif ev["type"] == "done":
            done = ev
    assert done is not None, c.log()
    assert n == done["n_gen"], (n, done)
    assert done["text"] == ref, (done["text"], ref, c.log())
    assert "".join(texts) == ref


# ------------------------------------------------------------ CURVE
def keygen(d: Path, name: str) -> None:
    cp = subprocess.run([str(binary("ie-keygen")), "--dir", str(d), "--name", name],
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, cp.stderr
    key, pub = d / f"{name}.key", d / f"{name}.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600, oct(key.stat().st_mode)
    assert len(pub.read_text().strip()) == 40 and len(key.read_text().strip()) == 40


@pytest.fixture
def curve_keys(tmp_path):
    keys, auth, other = tmp_path / "keys", tmp_path / "authorized", tmp_path / "other"
    for d in (keys, auth, auth / "workers", auth / "clients", other):
        d.mkdir()
    for n in ("coord", "w0", "w1", "client"):
        keygen(keys, n)
    for n in ("w0", "w1"):  # roles: worker keys may join, client keys may only ask
        (auth / "workers" / f"{n}.pub").write_text((keys / f"{n}.pub").read_text())
    (auth / "clients" / "client.pub").write_text((keys / "client.pub").read_text())
    keygen(other, "intruder")
    # a second run with the same name refuses to overwrite the secret key
    cp = subprocess.run([str(binary("ie-keygen")), "--dir", str(keys), "--name", "w0"],
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode != 0
    return keys, auth, other


def curve_flags(keys: Path, auth: Path):
    coord = ["--keys-dir", str(keys), "--key", "coord", "--authorized", str(auth)]

    def worker(i):
        return ["--keys-dir", str(keys), "--key", f"w{i}", "--coordinator-key",
                str(keys / "coord.pub"), "--authorized", str(auth)]
    return coord, worker


def test_curve_cluster(smollm2, clusters, curve_keys, tmp_path):
    keys, auth, other = curve_keys
    ref = plan_ref(smollm2, PROMPTS, "tensor", tmp_path)
    coord_flags, worker_flags = curve_flags(keys, auth)
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs", coord_curve=coord_flags)
    c.start_worker(0, worker_flags(0))
    c.start_worker(1, worker_flags(1))
    me = ie_client.CurveKeys.from_files(str(keys / "coord.pub"), str(keys), "client")
    done = c.generate(PROMPTS[0], max_new=MAX_NEW, curve=me)
    assert done["text"] == ref[0]
    # no CURVE at all, and an unknown key: no answer
    intruder = ie_client.CurveKeys.from_files(str(keys / "coord.pub"), str(other), "intruder")
    for curve in (None, intruder):
        with pytest.raises(ie_client.ClientTimeout):
            ie_client.generate(c.client_ep, prompt=PROMPTS[0], max_new=4, temperature=0.0,
                               timeout_s=2.0, curve=curve)
    time.sleep(0.3)
    log = c.coord_log.read_text(errors="replace")
    assert f"refused CURVE client {intruder.public}" in log, log[-3000:]
    # the cluster still serves the known client (and over the C example with CURVE)
    assert c.generate(PROMPTS[1], max_new=MAX_NEW, curve=me, wait_s=10)["text"] == ref[1]
    cp = subprocess.run([str(binary("ie-client-example")), "--endpoint", c.client_ep,
                         "--prompt", PROMPTS[2], "--max-new", str(MAX_NEW),
                         "--server-key", str(keys / "coord.pub"), "--keys-dir", str(keys),
                         "--key", "client"], capture_output=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.decode().rpartition("\ndone ")[0] == ref[2]


# ------------------------------------------------------------ namespaces
def sh(*args, check=True):
    cp = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=30)
    if check and cp.returncode != 0:
        pytest.fail(f"`{' '.join(map(str, args))}` failed ({cp.returncode}): {cp.stderr.strip()}",
                    pytrace=False)
    return cp


@pytest.fixture
def netns_pair():
    """Two namespaces, each with a veth pair to the root namespace and a
    default route through it; forwarding on. Yields [(ns, ns_addr, root_addr)]."""
    tag = uuid.uuid4().hex[:6]
    rnd = int(tag, 16)
    net = f"10.{100 + rnd % 100}.{(rnd >> 8) % 127 * 2}"  # two /24s: .X and .X+1
    base_x = int(net.split(".")[2])
    made_ns, made_links = [], []
    fwd = Path("/proc/sys/net/ipv4/ip_forward")
    old_fwd = fwd.read_text().strip() if fwd.exists() else None
    try:
        out = []
        for k in range(2):
            ns, host_if, ns_if = f"iet{tag}{k}", f"vh{tag}{k}", f"vn{tag}{k}"
            sub = f"10.{net.split('.')[1]}.{base_x + k}"
            cp = sh("ip", "netns", "add", ns, check=False)
            if cp.returncode != 0:
                pytest.fail(f"ip netns add {ns} failed: {cp.stderr.strip()}", pytrace=False)
            made_ns.append(ns)
            sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            made_links.append(host_if)
            sh("ip", "link", "set", ns_if, "netns", ns)
            sh("ip", "addr", "add", f"{sub}.1/24", "dev", host_if)
            sh("ip", "link", "set", host_if, "up")
            sh("ip", "-n", ns, "addr", "add", f"{sub}.2/24", "dev", ns_if)
            sh("ip", "-n", ns, "link", "set", ns_if, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", f"{sub}.1")
            out.append((ns, f"{sub}.2", f"{sub}.1"))
        fwd.write_text("1\n")
        # each namespace reaches the other through the root namespace
        sh("ip", "netns", "exec", out[0][0], "ping", "-c", "1", "-W", "2", out[1][1], check=False)
        yield out
    finally:
        for ns in made_ns:
            subprocess.run(["ip", "netns", "pids", ns], capture_output=True)  # (none of ours left)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for l in made_links:
            subprocess.run(["ip", "link", "del", l], capture_output=True, timeout=30)
        if old_fwd is not None:
            fwd.write_text(old_fwd + "\n")


def test_netns_tensor_cluster_with_curve(smollm2, clusters, curve_keys, netns_pair, tmp_path):
    keys, auth, _ = curve_keys
    ref = plan_ref(smollm2, PROMPTS, "tensor", tmp_path)
    coord_flags, worker_flags = curve_flags(keys, auth)
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs", bind_host="0.0.0.0",
                      coord_curve=coord_flags)
    for i, (ns, addr, root_addr) in enumerate(netns_pair):
        c.start_worker(i, worker_flags(i) + ["--peer-bind", "tcp://0.0.0.0:0", "--advertise", addr],
                       prefix=["ip", "netns", "exec", ns],
                       coordinator=f"tcp://{root_addr}:{c.wport}")
    me = ie_client.CurveKeys.from_files(str(keys / "coord.pub"), str(keys), "client")
    done = c.generate(PROMPTS[0], max_new=MAX_NEW, curve=me, wait_s=30)
    assert done["text"] == ref[0]
    log = c.coord_log.read_text(errors="replace")
    for _, addr, _ in netns_pair:
        assert f"peers at tcp://{addr}:" in log, log[-3000:]
    assert c.generate(PROMPTS[1], max_new=MAX_NEW, curve=me, wait_s=10)["text"] == ref[1]


# ------------------------------------------------------------ bad input: plan specs and config files

@pytest.mark.parametrize("value", ["-1", "x", "1000001", ""])
def test_cpu_latency_bad_values_refused(value, smollm2):
    """--cpu-latency-us / IE_CPU_LATENCY_US (ie_cpulat.h): a bad value is a
    usage error (exit 2) naming it, before anything starts."""
    cmds = [[str(binary("ie-worker")), "--model", str(smollm2), "--coordinator", "tcp://127.0.0.1:1",
             "--cpu-latency-us", value],
            [str(binary("ie-coordinator")), "--model", str(smollm2), "--cpu-latency-us", value]]
    for cmd in cmds:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert cp.returncode == 2 and f"--cpu-latency-us '{value}'" in cp.stderr, (cmd, cp.returncode, cp.stderr)
    cp = subprocess.run([str(binary("inference-engine")), "--model", str(smollm2), "--prompt", "hi"],
                        capture_output=True, text=True, timeout=30, env=dict(os.environ, IE_CPU_LATENCY_US=value))
    assert cp.returncode == 2 and f"IE_CPU_LATENCY_US '{value}'" in cp.stderr, (cp.returncode, cp.stderr)


def test_cpu_latency_request_changes_no_result(smollm2, clusters, tmp_path):
    """IE_CPU_LATENCY_US=0 / --cpu-latency-us 0 hold a PM QoS request (or
    warn when /dev/cpu_dma_latency is not writable); the ids are the same."""
    ref = plan_ref(smollm2, PROMPTS, "tensor", tmp_path)
    cp = subprocess.run([str(binary("inference-engine")), "--model", str(smollm2), "--prompt", PROMPTS[0],
                         "--max-new", str(MAX_NEW), "--greedy", "--threads", str(THREADS)],
                        capture_output=True, text=True, timeout=120, env=dict(os.environ, IE_CPU_LATENCY_US="0"))
    assert cp.returncode == 0, cp.stderr
    assert parse_single_json_line(cp.stdout)["text"] == ref[0]
    writable = os.access("/dev/cpu_dma_latency", os.W_OK)
    assert ("warning" in cp.stderr) != writable, cp.stderr
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs", coord_extra=["--cpu-latency-us", "0"])
    c.start_worker(0, ["--cpu-latency-us", "0"])
    c.start_worker(1, ["--cpu-latency-us", "0"])
    done = c.generate(PROMPTS[1], max_new=MAX_NEW)
    assert done["text"] == ref[1], (done["text"], ref[1])


@pytest.mark.parametrize("spec", ["tensor", "foo:2", "tensor:0", "tensor:65", "pipeline:x", "none:2", ":2"])
def test_bad_plan_spec_refused(spec, smollm2):
    r = subprocess.run([str(binary("inference-engine")), "--model", str(smollm2), "--prompt", "hi",
                        "--max-new", "1", "--plan", spec], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"error: bad plan '{spec}' (none, pipeline:N or tensor:N)"]


def test_bad_plan_in_environment_refused(smollm2):
    r = subprocess.run([str(binary("inference-engine")), "--model", str(smollm2), "--prompt", "hi",
                        "--max-new", "1"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, IE_PLAN="tensor:two"))
    assert r.returncode == 2 and "bad plan 'tensor:two'" in r.stderr, r.stderr


@pytest.mark.parametrize("body, words", [
    ("bogus_key = 1\n", "unknown or incomplete option '--bogus-key'"),
    ("plan = diagonal\n", "bad value 'diagonal'"),
    ("Bad Key = 1\n", "bad key 'Bad Key'"),
    ("= 3\n", "bad key ''"),
    ("workers = " + "9" * 5000 + "\n", "line too long"),
])
def test_bad_config_file_refused(body, words, smollm2, tmp_path):
    conf = tmp_path / "c.conf"
    conf.write_text(body)
    for name in ("ie-coordinator", "ie-worker"):
        r = subprocess.run([str(binary(name)), "--config", str(conf), "--model", str(smollm2),
                            "--coordinator", "tcp://127.0.0.1:1"], capture_output=True, text=True, timeout=30)
        want = "unknown or incomplete option '--plan'" if name == "ie-worker" and "plan" in body else words
        assert r.returncode == 2, (name, r.stderr)
        assert want in r.stderr, (name, r.stderr)  # --plan is not a worker flag


def test_config_file_missing_refused(tmp_path):
    for name in ("ie-coordinator", "ie-worker"):
        r = subprocess.run([str(binary(name)), "--config", str(tmp_path / "nope.conf")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "cannot read config file" in r.stderr, (name, r.stderr)


def test_config_file_values_and_command_line_precedence(smollm2, tmp_path):
    """Comments, blanks, quoted values and '_' keys are read; a flag given on
    the command line wins over the file."""
    conf = tmp_path / "c.conf"
    conf.write_text("# coordinator\n\nplan = pipeline   # trailing comment\nworkers = 3\n"
                    f"model = \"{smollm2}\"\nclient_bind = tcp://127.0.0.1:0\n")
    p = subprocess.Popen([str(binary("ie-coordinator")), "--config", str(conf), "--workers", "2",
                          "--bind", "tcp://127.0.0.1:0"], stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.time() + 30
        while time.time() < deadline and "plan," not in line:
            line = p.stderr.readline()
        assert "pipeline plan, 2 workers" in line, line
    finally:
        p.kill()
        p.wait()
