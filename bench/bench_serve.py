#!/usr/bin/env python3
"""bench_serve.py — serving throughput and latency against concurrency (issue 6).

For every model and mode, one server is started and, for each concurrency C
in --concurrency (1, 2, 4, 8, 16), C client threads send --requests-per-stream
x C requests in all (distinct prompts of ~--prompt-tokens tokens, so the
prefix cache does not help; max_tokens --max-tokens, greedy, streamed with
server-sent events). Measured from the client side:

  aggregate t/s     tokens generated during the level / the level's wall time
                    (tokens from the server's ie_tokens_generated_total when
                    /metrics has it, else the content chunks received)
  token latency     gaps between consecutive content chunks of a stream
                    (p50 / p95 over every gap of the level)
  TTFT              request sent -> first content chunk (p50 / p95)

Modes:
  embedded   inference-engine serve --batch B --threads T
  tensor     ie-coordinator --plan tensor --workers 2 --http-port P --batch B
             + 2 ie-worker --threads T/2 (loopback tcp)
  pipeline   the same with --plan pipeline
  cli        no server: inference-engine --prompts-file (C prompts) --batch C
             --max-new N --greedy, the engine's own batched decode, as an
             upper bound for the serving modes (its latency columns are the
             engine's per-token decode p50/p95 and mean TTFT)

All servers of a model are started first; then each concurrency level runs
every mode back to back (levels outer, modes inner), --rounds times, so drift
of a shared machine spreads over the modes; the table and plots show the
median over the rounds, results.jsonl every round. Idle servers cost little
(heartbeats), and each mode has the machine to itself while it is measured.

Models: smollm2 (models/SmolLM2-135M-Instruct.Q4_1.gguf) and tinyllama
(models/bench/tinyllama-q4_0.gguf, the TinyLlama-1.1B-shaped Q4_0 file of
bench/make_tinyllama_gguf.py --types q4_0; `make bench-serve` makes it), or
--model NAME=PATH (repeatable).

Outputs under --out (default bench/out/serve-<stamp>/, ignored by git):
  results.jsonl   one object per (model, mode, concurrency): the figures,
                  the command, machine and git info
  results.csv     the same, flattened
  requests.csv    one row per request: ttft, tokens, duration, status
  serve_<model>.png   aggregate t/s and latency (p50/p95, TTFT) against
                  concurrency, one line per mode
  summary.md      the markdown table printed at the end

bench/harness.py regenerates docs/PERFORMANCE.md as a whole (keeping only its
hand-written section), so this script does not write there: paste the table
of summary.md into docs/PERFORMANCE_HISTORY.md and update the serving table
of PERFORMANCE.md's hand-written section.

  .venv/bin/python bench/bench_serve.py [--models smollm2,tinyllama]
      [--modes embedded,tensor,pipeline,cli] [--concurrency 1,2,4,8,16]
      [--requests-per-stream 2] [--rounds 1] [--max-tokens 64] [--prompt-tokens 32]
      [--threads 2] [--batch 16]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (corpus words, machine and git info)

try:
    import httpx
except ImportError:  # the openai package of .venv ships its fork under this name
    import httpx2 as httpx

GOAL = ("goal: ≥100 t/s aggregate at 8 streams on the TinyLlama-shaped Q4 model "
        "(2× llama.cpp's 51 t/s single-stream)")
GOAL_TPS, GOAL_STREAMS = 100.0, 8
MODELS = {"smollm2": REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
          "tinyllama": REPO / "models" / "bench" / "tinyllama-q4_0.gguf"}
MODES = ("embedded", "tensor", "pipeline", "cli")


def log(*a):
    print("[bench_serve]", *a, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list, q: float):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def parse_metrics(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and not line.startswith("#"):
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def metric(m: dict, name: str):
    v = [x for k, x in m.items() if k == name or k.startswith(name + "{")]
    return sum(v) if v else None


# ------------------------------------------------------------------ prompts
def make_prompts(n: int, n_words: int, salt: int) -> list:
    """n distinct one-line prompts from different places of the corpus."""
    words = harness.corpus_words()
    out = []
    for i in range(n):
        s = (salt * 7919 + i * 1543) % max(1, len(words) - n_words)
        out.append(" ".join(words[s:s + n_words]))
    return out


# ------------------------------------------------------------------ servers
class Server:
    """A serving process (or a coordinator and its workers) with an HTTP API."""

    def __init__(self, mode: str, bin_dir: Path, model: Path, a, logdir: Path):
        self.mode, self.procs, self.logs = mode, [], []
        self.logdir = logdir
        if mode == "embedded":
            self._spawn([bin_dir / "inference-engine", "serve", "--model", model, "--host", "127.0.0.1",
                         "--port", 0, "--threads", a.threads, "--batch", a.batch, "--queue", 1024,
                         "--ctx", a.ctx], "serve")
            self.base = self._wait_listening(180)
        else:
            wport, hport = free_port(), free_port()
            self._spawn([bin_dir / "ie-coordinator", "--model", model, "--plan", mode, "--workers", 2,
                         "--bind", f"tcp://127.0.0.1:{wport}", "--client-bind", f"tcp://127.0.0.1:{free_port()}",
                         "--http-port", hport, "--batch", a.batch, "--queue", 1024, "--ctx", a.ctx],
                        "coordinator")
            for i in range(2):
                self._spawn([bin_dir / "ie-worker", "--model", model, "--coordinator", f"tcp://127.0.0.1:{wport}",
                             "--threads", max(1, a.threads // 2)], f"worker{i}")
            self.base = f"http://127.0.0.1:{hport}"
        self._wait_health(300)
        r = httpx.get(self.base + "/v1/models", timeout=10)
        r.raise_for_status()
        self.model_name = r.json()["data"][0]["id"]

    def _spawn(self, cmd, name):
        path = self.logdir / f"{name}.log"
        f = open(path, "ab")
        self.logs.append(path)
        env = {k: v for k, v in os.environ.items() if k not in ("IE_API_KEY", "IE_PLAN")}
        self.procs.append(subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=env))
        f.close()

    def tail(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:] for p in self.logs)

    def _check_alive(self):
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited {p.returncode}\n{self.tail()}")

    def _wait_listening(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = re.search(r"listening on (http://[^\s/]+:\d+)", self.logs[0].read_text(errors="replace"))
            if m:
                return m.group(1).replace("://0.0.0.0:", "://127.0.0.1:")
            self._check_alive()
            time.sleep(0.05)
        raise RuntimeError(f"no 'listening on' line in {timeout}s\n{self.tail()}")

    def _wait_health(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self._check_alive()
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"/health not 200 in {timeout}s\n{self.tail()}")

    def metrics(self) -> dict:
        try:
            r = httpx.get(self.base + "/metrics", timeout=10)
            return parse_metrics(r.text) if r.status_code == 200 else {}
        except httpx.HTTPError:
            return {}

    def stop(self) -> list:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        rcs = []
        for p in self.procs:
            try:
                rcs.append(p.wait(timeout=20))
            except subprocess.TimeoutExpired:
                p.kill()
                rcs.append(p.wait())
        return rcs


# ------------------------------------------------------------------ clients
def sse_events(resp):
    """data: payloads of an SSE response. Lines end at LF (CRLF) only:
    httpx's iter_lines also cuts at U+2028, U+0085 and friends, which JSON
    strings may hold unescaped (random-weight models produce them)."""
    buf = b""
    for chunk in resp.iter_bytes():
        buf += chunk
        while (i := buf.find(b"\n")) >= 0:
            line, buf = buf[:i].rstrip(b"\r"), buf[i + 1:]
            if line.startswith(b"data:"):
                yield line[5:].strip().decode("utf-8")


def one_request(base: str, model_name: str, prompt: str, max_tokens: int, timeout: float) -> dict:
    """A streamed greedy completion; chunk arrival times relative to send."""
    body = {"model": model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    rec = {"status": None, "error": None, "chunks": [], "finish": None, "usage_tokens": None}
    t0 = time.monotonic()
    rec["t_send"] = t0
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=10)) as c:
            with c.stream("POST", base + "/v1/completions", json=body) as r:
                rec["status"] = r.status_code
                if r.status_code != 200:
                    r.read()
                    rec["error"] = r.text[:300]
                    return rec
                for data in sse_events(r):
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        rec["error"] = data[:300]
                        break
                    if isinstance(obj.get("usage"), dict):
                        rec["usage_tokens"] = obj["usage"].get("completion_tokens")
                    ch = (obj.get("choices") or [{}])[0]
                    if ch.get("text"):
                        rec["chunks"].append(time.monotonic() - t0)
                    rec["finish"] = ch.get("finish_reason") or rec["finish"]
    except (httpx.HTTPError, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["t_end"] = time.monotonic()
    return rec


def run_level(srv: Server, prompts: list, conc: int, max_tokens: int, timeout: float) -> tuple:
    idx = iter(range(len(prompts)))
    lock = threading.Lock()
    recs: list = []

    def work():
        while True:
            with lock:
                i = next(idx, None)
            if i is None:
                return
            r = one_request(srv.base, srv.model_name, prompts[i], max_tokens, timeout)
            with lock:
                recs.append(r)

    m0 = srv.metrics()
    t0 = time.monotonic()
    th = [threading.Thread(target=work, daemon=True) for _ in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join(timeout + 60)
    wall = time.monotonic() - t0
    m1 = srv.metrics()
    ok = [r for r in recs if r["error"] is None and r["status"] == 200]
    chunks = sum(len(r["chunks"]) for r in ok)
    g0, g1 = metric(m0, "ie_tokens_generated_total"), metric(m1, "ie_tokens_generated_total")
    usage = [r["usage_tokens"] for r in ok]
    if g0 is not None and g1 is not None:
        tokens, source = g1 - g0, "metrics"
    elif ok and all(isinstance(u, int) for u in usage):
        tokens, source = sum(usage), "usage"
    else:
        tokens, source = chunks, "chunks"
    gaps = [b - a for r in ok for a, b in zip(r["chunks"], r["chunks"][1:])]
    ttft = [r["chunks"][0] for r in ok if r["chunks"]]
    row = {"requests": len(prompts), "ok": len(ok), "errors": len(recs) - len(ok) + (len(prompts) - len(recs)),
           "first_error": next((r["error"] for r in recs if r["error"]), None),
           "wall_s": wall, "tokens": tokens, "tokens_from": source, "chunks": chunks, "agg_tps": tokens / wall if wall > 0 else None,
           "tok_lat_p50_ms": _ms(pct(gaps, 0.5)), "tok_lat_p95_ms": _ms(pct(gaps, 0.95)),
           "ttft_p50_ms": _ms(pct(ttft, 0.5)), "ttft_p95_ms": _ms(pct(ttft, 0.95)),
           "per_stream_tps": (statistics.median(len(r["chunks"]) / (r["t_end"] - r["t_send"]) for r in ok)
                              if ok else None)}
    reqs = [{"ttft_ms": _ms(r["chunks"][0]) if r["chunks"] else None, "chunks": len(r["chunks"]),
             "duration_ms": _ms(r.get("t_end", r["t_send"]) - r["t_send"]), "status": r["status"],
             "finish": r["finish"], "error": r["error"]} for r in recs]
    return row, reqs


def _ms(x):
    return None if x is None else round(x * 1e3, 3)


def run_cli_level(bin_dir: Path, model: Path, prompts: list, conc: int, a) -> dict:
    """The engine alone: C prompts decoded together (--batch C)."""
    with tempfile.TemporaryDirectory() as d:
        pf = Path(d) / "p.txt"
        pf.write_text("\n".join(prompts[:conc]) + "\n", encoding="utf-8")
        cmd = [str(bin_dir / "inference-engine"), "--model", str(model), "--prompts-file", str(pf),
               "--batch", str(conc), "--max-new", str(a.max_tokens), "--greedy", "--threads", str(a.threads),
               "--ctx", str(a.ctx), "--warmup", "1"]
        t0 = time.monotonic()
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, errors="replace")
    wall = time.monotonic() - t0
    line = next((l for l in reversed(cp.stdout.split("\n")) if l.startswith("{")), None)  # not splitlines: U+2028 in text
    if cp.returncode != 0 or not line:
        return {"requests": conc, "ok": 0, "errors": conc,
                "first_error": (cp.stderr.strip().splitlines() or ["no output"])[-1], "wall_s": wall}
    j = json.loads(line)
    return {"requests": conc, "ok": conc, "errors": 0, "first_error": None, "wall_s": j.get("wall_s"),
            "tokens": j.get("tokens_out"), "agg_tps": j.get("tps"), "decode_tps": j.get("decode_tps"),
            "tok_lat_p50_ms": j.get("latency_p50_ms"), "tok_lat_p95_ms": j.get("latency_p95_ms"),
            "ttft_p50_ms": j.get("ttft_ms"), "ttft_p95_ms": None, "cmd": cmd}


# ------------------------------------------------------------------ outputs
def write_csv(path: Path, rows: list) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], (dict, list))))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def plot(rows: list, out: Path) -> list:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plots")
        return []
    made = []
    for model in dict.fromkeys(r["model"] for r in rows):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for mode in dict.fromkeys(r["mode"] for r in rows if r["model"] == model):
            rs = sorted((r for r in rows if r["model"] == model and r["mode"] == mode and r.get("agg_tps")),
                        key=lambda r: r["concurrency"])
            if not rs:
                continue
            xs = [r["concurrency"] for r in rs]
            ls = "--" if mode == "cli" else "-"
            ax1.plot(xs, [r["agg_tps"] for r in rs], ls, marker="o", label=mode)
            l, = ax2.plot(xs, [r["tok_lat_p50_ms"] for r in rs], ls, marker="o", label=f"{mode} token p50")
            ax2.plot(xs, [r["tok_lat_p95_ms"] for r in rs], ":", marker="^", color=l.get_color(),
                     label=f"{mode} token p95")
            if mode != "cli":
                ax2.plot(xs, [r["ttft_p50_ms"] for r in rs], "-.", marker="s", color=l.get_color(), alpha=0.6,
                         label=f"{mode} TTFT p50")
        if model == "tinyllama":
            ax1.axhline(GOAL_TPS, color="red", lw=0.8, ls="--")
            ax1.annotate(f"goal {GOAL_TPS:.0f} t/s at {GOAL_STREAMS} streams", (GOAL_STREAMS, GOAL_TPS),
                         textcoords="offset points", xytext=(4, 4), color="red", fontsize=8)
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r["concurrency"] for r in rows}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_xlabel("concurrent streams")
            ax.grid(alpha=0.3)
        ax1.set_ylabel("aggregate tokens/s")
        ax1.set_title(f"{model}: throughput")
        ax1.legend(fontsize=8)
        ax2.set_yscale("log")
        ax2.set_ylabel("ms")
        ax2.set_title(f"{model}: latency")
        ax2.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        p = out / f"serve_{model}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    return made


def medians(rows: list) -> list:
    """One row per (model, mode, concurrency): the median of each figure over
    the rounds (errors summed)."""
    cells: dict = {}
    for r in rows:
        cells.setdefault((r["model"], r["mode"], r["concurrency"]), []).append(r)
    out = []
    for rs in cells.values():
        m = dict(rs[0])
        for k in ("agg_tps", "tok_lat_p50_ms", "tok_lat_p95_ms", "ttft_p50_ms", "ttft_p95_ms", "wall_s", "tokens"):
            v = [r[k] for r in rs if r.get(k) is not None]
            m[k] = statistics.median(v) if v else None
        for k in ("requests", "ok", "errors"):
            m[k] = sum(r.get(k) or 0 for r in rs)
        m["rounds"] = len(rs)
        out.append(m)
    order_m = {k: i for i, k in enumerate(dict.fromkeys(r["model"] for r in rows))}
    return sorted(out, key=lambda r: (order_m[r["model"]], MODES.index(r["mode"]), r["concurrency"]))


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def table(rows: list) -> str:
    L = ["| model | mode | streams | requests | ok | aggregate t/s | token p50 ms | token p95 ms | TTFT p50 ms "
         "| TTFT p95 ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['model']} | {r['mode']} | {r['concurrency']} | {r['requests']} | {r['ok']} "
                 f"| {fmt(r.get('agg_tps'))} | {fmt(r.get('tok_lat_p50_ms'), '.2f')} "
                 f"| {fmt(r.get('tok_lat_p95_ms'), '.2f')} | {fmt(r.get('ttft_p50_ms'))} | {fmt(r.get('ttft_p95_ms'))} |")
    return "\n".join(L)


def goal_lines(rows: list) -> list:
    L = [GOAL]
    for r in rows:
        if r["model"] == "tinyllama" and r["concurrency"] == GOAL_STREAMS and r.get("agg_tps") is not None:
            ok = "met" if r["agg_tps"] >= GOAL_TPS else "NOT met"
            L.append(f"  tinyllama {r['mode']:9s} at {GOAL_STREAMS} streams: {r['agg_tps']:.1f} t/s ({ok})")
    return L


# ------------------------------------------------------------------ main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,tinyllama", help="names of MODELS (smollm2,tinyllama)")
    ap.add_argument("--model", action="append", default=[], help="NAME=PATH, another model (repeatable)")
    ap.add_argument("--modes", default="embedded,tensor,pipeline", help=f"of {','.join(MODES)}")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--requests-per-stream", type=int, default=2, help="requests per level = this x streams (2)")
    ap.add_argument("--rounds", type=int, default=1, help="repetitions of the whole sweep; figures are medians (1)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32, help="about this many prompt tokens (32)")
    ap.add_argument("--threads", type=int, default=2, help="embedded threads; each worker gets half (2)")
    ap.add_argument("--batch", type=int, default=16, help="sequence slots of the server (16)")
    ap.add_argument("--ctx", type=int, default=512, help="KV positions per sequence (512)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per request (600)")
    ap.add_argument("--bin-dir", type=Path, default=Path(os.environ.get("IE_BUILD_DIR", REPO / "build")))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)

    models = {n: MODELS[n] for n in a.models.split(",") if n}
    for spec in a.model:
        n, _, p = spec.partition("=")
        models[n] = Path(p)
    for n, p in models.items():
        if not p.is_file():
            hint = " (bench/make_tinyllama_gguf.py --types q4_0)" if n == "tinyllama" else ""
            ap.error(f"model {n}: {p} not found{hint}")
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}")
    levels = [int(x) for x in a.concurrency.split(",")]
    bin_dir = a.bin_dir if a.bin_dir.is_absolute() else REPO / a.bin_dir
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = a.out or REPO / "bench" / "out" / f"serve-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    meta = {"date": stamp, "machine": harness.machine_info(), **harness.git_info(), "argv": sys.argv,
            "threads": a.threads, "batch": a.batch, "max_tokens": a.max_tokens, "prompt_tokens": a.prompt_tokens}
    n_words = max(4, int(a.prompt_tokens * 0.77))
    rows, req_rows = [], []
    for mname, mpath in models.items():
        servers, failed_modes = {}, {}
        try:
            for mode in modes:
                if mode == "cli":
                    continue
                logdir = out / "logs" / f"{mname}-{mode}"
                logdir.mkdir(parents=True, exist_ok=True)
                t0 = time.monotonic()
                try:
                    srv = Server(mode, bin_dir, mpath, a, logdir)
                    servers[mode] = srv
                    log(f"{mname} / {mode}: ready in {time.monotonic() - t0:.1f}s at {srv.base}")
                    run_level(srv, make_prompts(2, n_words, 999), 2, 8, a.timeout)     # warm-up
                except Exception as e:  # noqa: BLE001 — record it, go on with the other modes
                    log(f"{mname} / {mode}: failed to start: {e}")
                    failed_modes[mode] = str(e)[:2000]
            # interleaved: every level runs each mode back to back, so the machine's drift
            # (other load, memory bandwidth) spreads over the modes instead of biasing one
            for rnd in range(a.rounds):
                for k, conc in enumerate(levels):
                    prompts = make_prompts(conc * a.requests_per_stream, n_words, salt=k + 1 + 100 * rnd)
                    for mode in modes:
                        if mode in failed_modes:
                            continue
                        try:
                            if mode == "cli":
                                row, reqs = run_cli_level(bin_dir, mpath, prompts, conc, a), []
                            else:
                                row, reqs = run_level(servers[mode], prompts, conc, a.max_tokens, a.timeout)
                        except Exception as e:  # noqa: BLE001
                            row, reqs = {"requests": len(prompts), "ok": 0, "errors": len(prompts),
                                         "first_error": f"{type(e).__name__}: {e}"[:2000]}, []
                        row.update(model=mname, mode=mode, concurrency=conc, round=rnd, model_path=str(mpath), **{
                            k2: meta[k2] for k2 in ("date", "threads", "batch", "max_tokens", "prompt_tokens")})
                        rows.append(row)
                        for q in reqs:
                            req_rows.append({"model": mname, "mode": mode, "concurrency": conc, "round": rnd, **q})
                        log(f"{mname} {mode:9s} {conc:2d} streams (round {rnd + 1}): {fmt(row.get('agg_tps'))} t/s, "
                            f"token p50/p95 {fmt(row.get('tok_lat_p50_ms'), '.2f')}/{fmt(row.get('tok_lat_p95_ms'), '.2f')}"
                            f" ms, TTFT p50/p95 {fmt(row.get('ttft_p50_ms'))}/{fmt(row.get('ttft_p95_ms'))} ms, "
                            f"{row['ok']}/{row['requests']} ok"
                            + (f" — {row['first_error']}" if row.get("first_error") else ""))
        finally:
            for mode, srv in servers.items():
                rcs = srv.stop()
                if any(rc != 0 for rc in rcs):
                    log(f"{mname} / {mode}: exit codes on SIGTERM: {rcs}")
        for mode, err in failed_modes.items():
            rows.append({"model": mname, "mode": mode, "concurrency": None, "requests": 0, "ok": 0,
                         "errors": 1, "first_error": err})
    with open(out / "results.jsonl", "w") as f:  # every round; summary.md and the plots take medians
        for r in rows:
            f.write(json.dumps({**r, "machine": meta["machine"], "git_commit": meta.get("git_commit"),
                                "git_dirty": meta.get("git_dirty")}) + "\n")
    write_csv(out / "results.csv", rows)
    write_csv(out / "requests.csv", req_rows)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    good = medians([r for r in rows if r.get("concurrency") is not None])
    pngs = [] if a.no_plots else plot(good, out)
    m = meta["machine"]
    md = [f"Serving benchmark {stamp} ({m.get('cpu_model')}, {a.threads} threads, --batch {a.batch}, "
          f"prompts ~{a.prompt_tokens} tokens, max_tokens {a.max_tokens}, greedy, streamed; "
          f"commit {(meta.get('git_commit') or '?')[:12]}{' dirty' if meta.get('git_dirty') else ''})", "",
          table(good), ""] + goal_lines(good)
    failed = [r for r in rows if r.get("concurrency") is None]
    for r in failed:
        md.append(f"\nfailed: {r['model']} / {r['mode']}: {r['first_error'][:500]}")
    (out / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"\nwritten: {out.relative_to(REPO) if out.is_relative_to(REPO) else out}/ "
          f"(results.jsonl, results.csv, requests.csv, summary.md{', ' + ', '.join(p.name for p in pngs) if pngs else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
