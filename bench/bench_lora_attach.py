#!/usr/bin/env python3
"""bench_lora_attach.py — how long base streams stall while an adapter is
attached (issue 20: the embedded engine prepares adapters off its serving
thread). A figure, not a test.

Two `inference-engine` binaries (A and B, e.g. an older build that
attaches on the serving thread and this one), interleaved ABAB / BABA
rounds. Each run: `serve --threads 2 --batch 8` on --model, the adapter
loaded at run time (`POST /v1/load_lora_adapter`: read, not attached), 4
base streams of 48 tokens; once each has 12 tokens, one request names the
adapter (1 token), which attaches it. Printed per run: the worst gap
between two tokens of a base stream that overlaps that request, the
median gap outside it, the request's latency, and the load average.

    .venv/bin/python bench/bench_lora_attach.py --model models/bench/tinyllama-q4_0.gguf \\
        --adapter bench/out/lora/bf16/a16 --bin A=/tmp/old/inference-engine --bin B=build/inference-engine
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import threading
import time
import urllib.request


def start(binp, model):
    p = subprocess.Popen([binp, "serve", "--model", model, "--port", "0", "--threads", "2", "--batch", "8"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.match(r"listening on http://(\S+):(\d+)$", line.strip())
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()  # drain
            return p, f"http://127.0.0.1:{m.group(2)}"
    raise SystemExit(f"{binp}: the server did not start")


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read()


def stream(url, model, n, times):
    body = {"model": model, "prompt": "Once upon a time there was", "max_tokens": n, "temperature": 0,
            "stream": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.monotonic())


def one(binp, model, adapter):
    """(worst gap overlapping the attach, median gap otherwise, attach request), ms."""
    p, url = start(binp, model)
    try:
        base = json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"][0]["id"]
        post(url, "/v1/load_lora_adapter", {"lora_name": "ad", "lora_path": adapter})
        ts = [[] for _ in range(4)]
        th = [threading.Thread(target=stream, args=(url, base, 48, ts[i])) for i in range(4)]
        for t in th:
            t.start()
        while min(len(x) for x in ts) < 12:
            time.sleep(0.01)
        t0 = time.monotonic()
        post(url, "/v1/completions", {"model": "ad", "prompt": "Hi", "max_tokens": 1, "temperature": 0})
        t1 = time.monotonic()
        for t in th:
            t.join()
        inside, outside = [], []
        for x in ts:
            for a, b in zip(x, x[1:]):
                (inside if b > t0 and a < t1 else outside).append(b - a)
        return max(inside) * 1e3, statistics.median(outside) * 1e3, (t1 - t0) * 1e3
    finally:
        p.terminate()
        p.wait(60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True, help="a PEFT directory or GGUF LoRA for --model")
    ap.add_argument("--bin", action="append", required=True, help="NAME=PATH of an inference-engine (twice)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    bins = dict(b.split("=", 1) for b in a.bin)
    res = {k: [] for k in bins}
    print(f"load average {os.getloadavg()[0]:.1f}")
    for r in range(a.rounds):
        for k in (list(bins) if r % 2 == 0 else list(bins)[::-1]):
            m = one(bins[k], a.model, a.adapter)
            res[k].append(m)
            print(f"{k}: worst base gap during the attach {m[0]:.0f} ms, median gap otherwise {m[1]:.0f} ms, "
                  f"attach request {m[2]:.0f} ms, load {os.getloadavg()[0]:.1f}", flush=True)
    for k, v in res.items():
        print(f"{k}: median worst gap {statistics.median(x[0] for x in v):.0f} ms, median attach request "
              f"{statistics.median(x[2] for x in v):.0f} ms")


if __name__ == "__main__":
    main()
