"""Latency-bounded prefill (issue 21, item 5), end to end on SmolLM2:
three streams decode; a ~3,900-token prompt arrives. While it is
prefilled the streams' token gaps stay within a bound derived from the
step-latency target — 4 decode-only steps (the streams' median gap, measured
in the same run) or 50 ms when that is longer (ie_sched.h) — and the long
prompt's greedy ids equal its solo run's.

Slack: the 90th percentile of the gaps may reach 3x the target, the
largest 12x. The scheduler's own mixed steps sit at the target (measured:
median 61 ms for a 70 ms target); the tail is the machine's: on the shared
2-core machine at load ~19 a process stalls for 100-600 ms now and then
(the gaps before the prompt reached 10x the median too). Measured there
with the final code: p90 1.4x, largest 3.1x the target; two runs before
the budget's growth cap: largest 2.9x, and once a 2.4 s gap. With the budget
off the test fails: IE_PREFILL_FLAGS="--step-latency-ms 0 --prefill-chunk
256" (what --max-batch allows): largest gap 4.6 s = 58x, p90 55x;
"--step-latency-ms 0" (the fixed 32-token chunk): p90 5.6x, largest 7.9x.

Environment as in conftest.py. IE_PREFILL_FLAGS (space-separated) adds
server flags, to show the failure with the target off.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from conftest import IE_BIN, SMOLLM2, need_file
from test_serving import Serve, httpx
from test_service_availability import COUNTING, long_text, recv, req, zsock

TARGET_X, TARGET_MS = 4, 0.050     # IE_SCHED_STEP_LATENCY_X, _MS
SLACK_P90, SLACK_MAX = 3, 12
N_LONG = 3900


@pytest.fixture(scope="module")
def model() -> Path:
    need_file(IE_BIN, "inference-engine binary (set IE_BIN or build it)")
    return need_file(SMOLLM2, "SmolLM2 GGUF (run scripts/setup.sh)")


def long_prompt(base: str) -> tuple:
    """A text of about N_LONG tokens (sized with /tokenize) and its count."""
    lo, hi = 1000, 6000
    while lo < hi:                      # the most words that stay <= N_LONG tokens
        mid = (lo + hi + 1) // 2
        n = httpx.post(base + "/tokenize", json={"prompt": long_text(mid)}, timeout=30).json()["count"]
        lo, hi = (mid, hi) if n <= N_LONG else (lo, mid - 1)
    text = long_text(lo)
    return text, httpx.post(base + "/tokenize", json={"prompt": text}, timeout=30).json()["count"]


def collect(sock, until_s: float) -> dict:
    """Messages of one streaming request until its final one: ids, arrival times."""
    out = {"ids": [], "t": [], "final": None}
    while time.monotonic() < until_s:
        m = recv(sock, 0.2)
        if m is None:
            continue
        if m["type"] == "token":
            out["ids"].append(m["token"])
            out["t"].append(time.monotonic())
        else:
            out["final"] = m
            break
    return out


def test_long_prompt_keeps_stream_gaps_within_the_target(model, tmp_path):
    extra = os.environ.get("IE_PREFILL_FLAGS", "").split()
    srv = Serve(model, tmp_path, ["--batch", 4, "--ctx", 4096, "--no-prefix-cache", *extra], zmq_bind=True,
                threads=1)
    ctx = zmq.Context()
    try:
        text, n_tok = long_prompt(srv.base)
        assert N_LONG - 40 <= n_tok <= N_LONG, n_tok
        streams = [zsock(ctx, srv.zmq_ep) for _ in range(3)]
        for i, s in enumerate(streams):
            s.send(req(f"s{i}", COUNTING, 3600))
        times = [[] for _ in streams]
        poller = zmq.Poller()
        for s in streams:
            poller.register(s, zmq.POLLIN)

        def pump(deadline: float, stop=None) -> None:
            while time.monotonic() < deadline and not (stop and stop()):
                for s, _ in poller.poll(50):
                    m = msgpack.unpackb(s.recv(), raw=False)
                    assert m["type"] == "token", m
                    times[streams.index(s)].append(time.monotonic())

        # the streams' own pace first: 40 tokens each after they all run
        pump(time.monotonic() + 120, lambda: min(len(t) for t in times) >= 45)
        assert min(len(t) for t in times) >= 45, [len(t) for t in times]
        base = [b - a for t in times for a, b in zip(t[5:], t[6:])]
        median = statistics.median(base)
        # the long prompt arrives; the streams go on
        lp = zsock(ctx, srv.zmq_ep)
        lp.send(req("long", text, 8))
        t_sent = time.monotonic()
        n_before = [len(t) for t in times]
        first = {}

        def long_started() -> bool:
            if lp.poll(0):
                m = msgpack.unpackb(lp.recv(), raw=False)
                assert m["type"] == "token", m
                first.update(m, t=time.monotonic())
            return bool(first)

        pump(time.monotonic() + 300, long_started)
        assert first, "the long prompt got no first token in 300 s"
        # gaps of the streams while the prompt was prefilled (sent -> its first token)
        during = []
        for t, n0 in zip(times, n_before):
            ts = [t[n0 - 1]] + [x for x in t[n0:] if x <= first["t"]]
            during += [b - a for a, b in zip(ts, ts[1:])]
        assert len(during) >= 3, during
        worst = max(during)
        q = sorted(during)
        p90 = q[int(len(q) * 0.9)]
        target = max(TARGET_X * median, TARGET_MS)      # the step a prompt token may ride in
        rest = collect(lp, time.monotonic() + 120)
        assert rest["final"] and rest["final"]["type"] == "done", rest["final"]
        ids = [first["token"]] + rest["ids"]
        print(f"\nprefill of {n_tok} tokens took {first['t'] - t_sent:.2f} s; streams' median gap "
              f"{median * 1e3:.1f} ms (largest before it {max(base) * 1e3:.1f}), target {target * 1e3:.0f} ms; "
              f"{len(during)} gaps during it: p90 {p90 * 1e3:.1f} ms, largest {worst * 1e3:.1f} ms")
        for s in streams:
            s.close(0)                   # the server cancels them (disconnect)
        # its solo run: the same ids
        solo = zsock(ctx, srv.zmq_ep)
        t_solo = time.monotonic()
        solo.send(req("solo", text, 8))
        alone = collect(solo, time.monotonic() + 300)
        assert alone["final"] and alone["final"]["type"] == "done", alone["final"]
        assert ids == alone["ids"], (ids, alone["ids"])
        assert p90 <= SLACK_P90 * target and worst <= SLACK_MAX * target, (
            f"streams waited up to {worst * 1e3:.0f} ms (p90 {p90 * 1e3:.0f} ms) while {n_tok} prompt tokens were "
            f"prefilled; the target was {target * 1e3:.0f} ms (median gap {median * 1e3:.1f} ms)")
    finally:
        ctx.destroy(0)
        srv.p.terminate(5.0)
