"""Integrity, security and operability of the distributed service and the
HTTP API (issue 21, items 8-11 and 13), on loopback.

  - a worker whose weights differ from the coordinator's (one tensor's bytes
    changed, same shapes) is refused at registration, with a line on both
    sides, and exits 3;
  - CURVE roles: a client key cannot join as a worker, a worker key cannot
    use the client port (both refusals logged), the right keys work;
  - a worker given the wrong --coordinator-key says so, the coordinator says
    a client failed the handshake, and a plain (no CURVE) client is logged
    with "(CURVE required)";
  - a peer address that cannot be reached is reported before READY (the
    coordinator's log names it; requests get "unavailable");
  - a lone worker waiting for a second one stays registered (no re-register
    loop);
  - IPv6 literal endpoints (tcp://[::1]:PORT) serve a request;
  - systemd's STATUS= follows the workers and requests (a fake
    NOTIFY_SOCKET), and the log lines carry their time;
  - HTTP: a text/plain POST (a cross-site form or fetch without preflight)
    is refused with 415 in OpenAI's error shape and starts nothing; with
    --cors-origin an OPTIONS preflight is answered and answers carry
    Access-Control-Allow-Origin; without it OPTIONS is 405.
"""
from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import binary, free_port
from test_distributed import (MAX_NEW, PROMPTS, Cluster, clusters, curve_flags, curve_keys,  # noqa: F401
                              embedded, ie_client, keygen, start_cluster, tiny_gptoss)
from test_http_api import Server, assert_error_shape, httpx


def wait_for(pred, timeout_s: float, step: float = 0.1) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


# ------------------------------------------------------------ item 8: weights
def tampered_copy(model: Path, dst: Path) -> str:
    """A copy of the GGUF with the bytes of one tensor (blk.3.ffn_down)
    changed; returns the tensor's name."""
    import gguf
    import numpy as np
    shutil.copyfile(model, dst)
    r = gguf.GGUFReader(str(model))
    t = next(t for t in r.tensors if t.name == "blk.3.ffn_down.weight")
    off, n = int(t.data_offset), int(t.n_bytes)
    with open(dst, "r+b") as f:
        f.seek(off)
        raw = np.frombuffer(f.read(n), dtype=np.uint8).copy()
        raw[: n // 2] ^= 0x5A  # same size and type: only the bytes differ
        f.seek(off)
        f.write(raw.tobytes())
    return t.name


def test_worker_with_other_weights_refused(smollm2, clusters, tmp_path):
    bad = tmp_path / "tampered.gguf"
    tampered_copy(smollm2, bad)
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs")
    c.start_worker(0)
    w = c._spawn([str(binary("ie-worker")), "--model", str(bad), "--coordinator", c.worker_ep],
                 tmp_path / "logs" / "bad.log")
    rc = w.wait(timeout=60)
    wlog = text(tmp_path / "logs" / "bad.log")
    assert rc == 3, (rc, wlog)
    assert "weights mismatch" in wlog and "refused by the coordinator" in wlog, wlog
    assert wait_for(lambda: "weights mismatch" in text(c.coord_log), 5), c.log()
    assert re.search(r"refused pid \d+ on .*: weights mismatch", text(c.coord_log)), c.log()
    # the good copy still joins and serves the right text
    c.start_worker(1)
    ref = embedded(smollm2, PROMPTS[:1], tmp_path)
    assert c.generate(PROMPTS[0], max_new=MAX_NEW, wait_s=60)["text"] == ref[0]


def test_worker_with_other_model_exits(smollm2, tiny_gptoss, clusters, tmp_path):
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs")
    c.start_worker(0)
    w = c._spawn([str(binary("ie-worker")), "--model", str(tiny_gptoss), "--coordinator", c.worker_ep],
                 tmp_path / "logs" / "other.log")
    assert w.wait(timeout=60) == 3, text(tmp_path / "logs" / "other.log")
    assert "model mismatch" in text(tmp_path / "logs" / "other.log")


# ------------------------------------------------------------ item 9: roles
def test_curve_roles_refused(smollm2, clusters, curve_keys, tmp_path):
    keys, auth, _ = curve_keys
    coord_flags, worker_flags = curve_flags(keys, auth)
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs", coord_curve=coord_flags)
    client_pub = (keys / "client.pub").read_text().strip()
    w0_pub = (keys / "w0.pub").read_text().strip()
    # a client key asking to join as a worker: refused, logged on both sides
    c.start_worker(0, ["--keys-dir", str(keys), "--key", "client", "--coordinator-key", str(keys / "coord.pub")])
    assert wait_for(lambda: f"refused CURVE client {client_pub}" in text(c.coord_log), 10), c.log()
    assert "authorized as a client, not as a worker" in text(c.coord_log), c.log()
    assert wait_for(lambda: "refused this process's CURVE key" in text(tmp_path / "logs" / "worker0.log"), 10), \
        c.log()
    assert "takes rank" not in text(c.coord_log), c.log()
    # a worker key used as a client: no answer, logged
    as_worker = ie_client.CurveKeys.from_files(str(keys / "coord.pub"), str(keys), "w0")
    with pytest.raises(ie_client.ClientTimeout):
        ie_client.generate(c.client_ep, prompt=PROMPTS[0], max_new=2, temperature=0.0, timeout_s=2.0,
                           curve=as_worker)
    assert wait_for(lambda: "authorized as a worker, not as a client" in text(c.coord_log), 5), c.log()
    assert f"refused CURVE client {w0_pub}" in text(c.coord_log)
    # the client key as a client gets an answer (no workers yet: unavailable)
    me = ie_client.CurveKeys.from_files(str(keys / "coord.pub"), str(keys), "client")
    with pytest.raises(ie_client.ClientError) as e:
        ie_client.generate(c.client_ep, prompt=PROMPTS[0], max_new=2, temperature=0.0, timeout_s=15.0, curve=me)
    assert e.value.code == "unavailable"


# ------------------------------------------------------------ item 10: handshakes, reachability
def test_wrong_coordinator_key_and_plain_client_logged(smollm2, clusters, curve_keys, tmp_path):
    keys, auth, other = curve_keys
    coord_flags, worker_flags = curve_flags(keys, auth)
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs", coord_curve=coord_flags)
    wrong = worker_flags(0)
    wrong[wrong.index("--coordinator-key") + 1] = str(other / "intruder.pub")
    c.start_worker(0, wrong)
    wlog = tmp_path / "logs" / "worker0.log"
    assert wait_for(lambda: "CURVE handshake with" in text(wlog), 10), c.log()
    assert "--coordinator-key" in text(wlog)
    assert wait_for(lambda: "failed the CURVE handshake (cryptographic error)" in text(c.coord_log), 10), c.log()
    # a client without CURVE: the documented line
    with pytest.raises(ie_client.ClientTimeout):
        ie_client.generate(c.client_ep, prompt=PROMPTS[0], max_new=2, temperature=0.0, timeout_s=1.5)
    assert wait_for(lambda: "(CURVE required" in text(c.coord_log), 5), c.log()


def test_unreachable_peer_address_reported_before_ready(smollm2, clusters, tmp_path):
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs", coord_extra=["--retry-ms", "0"])
    # listens on 127.0.0.1 only, tells its peers 127.0.0.3: nobody can reach it there
    c.start_worker(0, ["--peer-bind", "tcp://127.0.0.1:0", "--advertise", "127.0.0.3"])
    c.start_worker(1)
    assert wait_for(lambda: "is not reachable from this host" in text(c.coord_log), 30), c.log()
    log = text(c.coord_log)
    assert re.search(r"rank \d \(pid \d+ on .*\) is not ready: .*peer rank \d's address .*127\.0\.0\.3", log), log
    with pytest.raises(ie_client.ClientError) as e:
        ie_client.generate(c.client_ep, prompt=PROMPTS[0], max_new=2, temperature=0.0, timeout_s=30.0)
    assert e.value.code == "unavailable", str(e.value)  # (its wording is the scheduler's)


def test_wildcard_peer_bind_without_advertise_warns(smollm2, clusters, tmp_path):
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs", bind_host="0.0.0.0")
    c.start_worker(0, ["--peer-bind", "tcp://0.0.0.0:0"])
    c.start_worker(1)
    wlog = tmp_path / "logs" / "worker0.log"
    assert wait_for(lambda: "without --advertise: advertising 127.0.0.1" in text(wlog), 15), c.log()
    # the coordinator's wildcard bind is logged as such, not as loopback
    assert wait_for(lambda: f"workers at tcp://0.0.0.0:{c.wport} (every interface)" in text(c.coord_log), 30), \
        c.log()
    ref = embedded(smollm2, PROMPTS[:1], tmp_path)
    assert c.generate(PROMPTS[0], max_new=MAX_NEW, wait_s=60)["text"] == ref[0]


# ------------------------------------------------------------ item 13
def test_lone_worker_stays_registered(smollm2, clusters, tmp_path):
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs")
    c.start_worker(0)
    assert wait_for(lambda: "takes rank 0" in text(c.coord_log), 30), c.log()
    time.sleep(5)  # > 2 x --dead-ms
    log = c.log()
    assert "lost" not in text(c.coord_log), log
    assert "registering again" not in text(tmp_path / "logs" / "worker0.log"), log
    assert text(c.coord_log).count("takes rank") == 1, log


def test_sd_status_kept_current_and_timestamps(smollm2, clusters, tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    seen: list = []

    def drain_until(text: str, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                seen.extend(sock.recv(4096).decode().splitlines())
            except socket.timeout:
                pass
            if any(text in m for m in seen):
                return True
        return False
    try:
        c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs", coord_env={"NOTIFY_SOCKET": str(path)})
        assert drain_until("STATUS=0 of 2 workers ready; 0 requests running, 0 waiting", 30), seen
        c.start_worker(0)
        c.start_worker(1)
        assert drain_until("STATUS=2 of 2 workers ready; 0 requests running, 0 waiting", 60), (seen, c.log())
        assert any(m == "READY=1" for m in seen), seen
    finally:
        sock.close()
    first = text(c.coord_log).splitlines()[0]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ie-coordinator: ", first), first


def test_step_failure_counted(smollm2, clusters, tmp_path):
    mport = free_port()
    c = start_cluster(clusters, smollm2, "tensor", 2, tmp_path / "logs",
                      coord_extra=["--metrics-port", str(mport), "--retry-ms", "0"])
    c.start_worker(0)
    c.start_worker(1)
    c.generate(PROMPTS[0], max_new=2, wait_s=60)  # ready

    def failures() -> float:
        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        m = re.search(r"^ie_step_failures_total (\S+)$", body, re.M)
        assert m, body
        return float(m.group(1))
    assert failures() == 0
    out: dict = {}

    def long_request():
        try:
            out["done"] = ie_client.generate(c.client_ep, prompt=PROMPTS[1], max_new=2000, temperature=0.0,
                                             timeout_s=60)
        except ie_client.ClientError as e:
            out["error"] = e
    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(1.0)
    c.workers[1].send_signal(signal.SIGKILL)
    t.join(70)
    assert "error" in out and out["error"].code == "unavailable", (out, c.log())
    assert failures() >= 1, c.log()


def test_ipv6_endpoints(smollm2, clusters, tmp_path):
    c = start_cluster(clusters, smollm2, "pipeline", 2, tmp_path / "logs", bind_host="[::1]")
    c.client_ep = c.client_ep.replace("127.0.0.1", "[::1]")
    c.coord.kill()
    c.coord.wait()
    c.procs.remove(c.coord)
    c.coord = c._spawn([str(binary("ie-coordinator")), "--model", str(smollm2), "--plan", "pipeline",
                        "--workers", "2", "--bind", f"tcp://[::1]:{c.wport}", "--client-bind", c.client_ep,
                        "--verbose"], c.coord_log)
    for i in range(2):
        c.start_worker(i, ["--peer-bind", "tcp://[::1]:0"], coordinator=f"tcp://[::1]:{c.wport}")
    ref = embedded(smollm2, PROMPTS[:1], tmp_path)
    assert c.generate(PROMPTS[0], max_new=MAX_NEW, wait_s=60)["text"] == ref[0]
    assert "peers at tcp://[::1]:" in text(c.coord_log), c.log()


# ------------------------------------------------------------ item 11: browsers
@pytest.fixture(scope="module")
def open_server(smollm2):
    s = Server(smollm2, "--batch", 2, "--ctx", 512, api_key=None)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def cors_server(smollm2):
    s = Server(smollm2, "--batch", 2, "--ctx", 512, "--cors-origin", "https://app.example", api_key=None)
    yield s
    s.stop()


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None])
def test_post_without_json_content_type_refused(open_server, ctype):
    body = b'{"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}'
    headers = {"Content-Type": ctype} if ctype else {}
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = httpx.post(open_server.url + path, content=body, headers=headers, timeout=30)
        e = assert_error_shape(r, 415, "unsupported_media_type")
        assert "application/json" in e["message"]
        assert "access-control-allow-origin" not in r.headers
    # the same body as JSON works (charset parameter allowed)
    r = httpx.post(open_server.url + "/v1/completions", content=body,
                   headers={"Content-Type": "application/json; charset=utf-8"}, timeout=60)
    assert r.status_code == 200, r.text
    assert 1 <= r.json()["usage"]["completion_tokens"] <= 4


def test_options_without_cors_is_405(open_server):
    r = httpx.request("OPTIONS", open_server.url + "/v1/completions", timeout=10,
                      headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 405
    assert "access-control-allow-origin" not in r.headers


def test_cors_preflight_and_headers(cors_server):
    r = httpx.request("OPTIONS", cors_server.url + "/v1/chat/completions", timeout=10,
                      headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                               "Access-Control-Request-Headers": "content-type, authorization"})
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "content-type" in r.headers["access-control-allow-headers"].lower()
    r = httpx.post(cors_server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                   headers={"Origin": "https://app.example"}, timeout=60)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    with httpx.stream("POST", cors_server.url + "/v1/completions", timeout=60,
                      json={"prompt": "Hi", "max_tokens": 2, "stream": True}) as s:
        assert s.status_code == 200 and s.headers["access-control-allow-origin"] == "https://app.example"
        s.read()
    r = httpx.get(cors_server.url + "/v1/models", timeout=10)
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    # still no generation from a text/plain POST
    r = httpx.post(cors_server.url + "/v1/completions", content=b'{"prompt": "Hi"}',
                   headers={"Content-Type": "text/plain"}, timeout=10)
    assert_error_shape(r, 415, "unsupported_media_type")
