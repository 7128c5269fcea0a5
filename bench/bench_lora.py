#!/usr/bin/env python3
"""bench_lora.py — multi-LoRA serving figures (issue 20). A figure, not a test.

Base: the TinyLlama-shaped Q4_0 model (bench/make_tinyllama_gguf.py: 22
layers, hidden 2048, 32/4 heads, FFN 5632). Adapters are random PEFT
directories made here with numpy (A, B ~ N(0, 0.02), so they cost what
trained ones do) on all seven projections, under bench/out/lora/ (bf16
needs torch only to write the file; --dtype f32 needs none).

Part "mix" (the issue's <= 5% target): `serve --batch 8` with 4 adapters of
rank 16, 16, 32, 32; each round runs, interleaved, A = 8 streams on the base
alone and B = the same 8 prompts over the 4 adapters (2 streams each, the
OpenAI "model" field naming the adapter), in the order ABBA / BAAB
alternating so that a drift of the machine hits both alike. Each run streams
(SSE) and times every token; its aggregate decode rate is the tokens that
arrive while all 8 streams are decoding (from the last stream's first token
to the first stream's last) over that window — prefill excluded. Before
each run, build/bench_membw (bench/harness.py's probe: read GB/s with 2
threads) measures the bandwidth of that moment, printed beside the figure:
decode is bandwidth-bound, and this machine's bandwidth moves by 2x within
seconds. Target: median B / A >= 0.95. Printed beside it: the bytes ratio,
base bytes / (base + adapter bytes) a step, what B / A would be if an
adapter byte cost what a base byte does.

Part "zipf" (run-time adapters: `POST /v1/load_lora_adapter`,
`--lora-budget-mb`): 64 adapters of rank --zipf-rank are
loaded at run time into a budget with room for 16 (each charged its
weights and, run in int8, the worker's int8 copy); then --zipf-requests
requests whose adapter follows a Zipf law (p(k) ~ 1 / k^s, seeded) from 8
clients. Reported: generated tokens/s of wall time, requests/s, the
adapter (re)load latency p50 / p95 from the server's `ie_lora_load_seconds`
histogram (the loads during the trace only; bucket-interpolated like
Prometheus' histogram_quantile), and the hit rate 1 - loads / requests,
beside bench_membw's read bandwidth just before and just after the trace
and the load average (a reload is a disk/page-cache read plus checks; the
trace's decode is bandwidth-bound like the mix part's). Without those
endpoints the part says so and is skipped.

Usage: bench/bench_lora.py [--parts mix,zipf] [--model M] [--threads N]
       [--max-new 32] [--rounds 3] [--dtype bf16|f32] [--zipf-requests 128] ...
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from harness import run_probe  # noqa: E402

MODS = {"q_proj": ("self_attn", 2048, 2048), "k_proj": ("self_attn", 256, 2048), "v_proj": ("self_attn", 256, 2048),
        "o_proj": ("self_attn", 2048, 2048), "gate_proj": ("mlp", 5632, 2048), "up_proj": ("mlp", 5632, 2048),
        "down_proj": ("mlp", 2048, 5632)}
MIX = {"a16": 16, "b16": 16, "c32": 32, "d32": 32}


def make_adapter(d: Path, r: int, seed: int, dtype: str, n_layer: int = 22) -> int:
    """A random PEFT adapter in d (kept when already there); its weight bytes."""
    st = d / "adapter_model.safetensors"
    if not st.exists():
        d.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        t = {}
        for layer in range(n_layer):
            for m, (blk, n_out, n_in) in MODS.items():
                pre = f"base_model.model.model.layers.{layer}.{blk}.{m}"
                t[pre + ".lora_A.weight"] = rng.normal(0, 0.02, (r, n_in)).astype(np.float32)
                t[pre + ".lora_B.weight"] = rng.normal(0, 0.02, (n_out, r)).astype(np.float32)
        if dtype == "bf16":  # safetensors.numpy has no bf16: written through torch
            import torch
            from safetensors.torch import save_file as save_torch
            save_torch({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in t.items()}, str(st))
        else:
            save_file(t, str(st))
        (d / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": r, "lora_alpha": r, "target_modules": list(MODS)}))
    return st.stat().st_size


def serve(args, extra: list[str]):
    """`inference-engine serve` (--batch 8); returns (proc, url)."""
    proc = subprocess.Popen([str(args.build / "inference-engine"), "serve", "--model", args.model, "--port", "0",
                             "--batch", "8", "--threads", str(args.threads), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line.strip())
        m = re.match(r"listening on http://(\S+):(\d+)$", line.strip())
        if m:
            return proc, f"127.0.0.1:{m.group(2)}"
    raise RuntimeError(f"server did not start (exit {proc.wait()}): {' | '.join(seen[-2:])[-200:]}")


def post(host: str, path: str, body: dict, timeout: float = 600):
    """(status, text) of a JSON POST."""
    req = urllib.request.Request(f"http://{host}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def stream(host: str, model: str, prompt: str, max_new: int) -> list[float]:
    """One streamed greedy completion; the arrival time of each token's chunk."""
    c = http.client.HTTPConnection(host, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_new, "temperature": 0, "ignore_eos": True,
        "stream": True}), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{model}: HTTP {r.status}: {r.read()[:200]!r}")
    times = []
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        if json.loads(line[5:]).get("choices"):
            times.append(time.perf_counter())
    c.close()
    return times


def decode_rate(host: str, jobs: list[tuple[str, str]], max_new: int) -> float:
    """The 8 streams at once; aggregate tokens/s while all of them decode."""
    with ThreadPoolExecutor(len(jobs)) as ex:
        ts = list(ex.map(lambda j: stream(host, j[0], j[1], max_new), jobs))
    lo, hi = max(t[0] for t in ts), min(t[-1] for t in ts)
    n = sum(sum(1 for x in t if lo < x <= hi) for t in ts)
    return n / (hi - lo) if hi > lo else float("nan")


def int8_bytes(r: int, n_layer: int = 22) -> int:
    """Bytes of a worker's int8 copy of a rank-r adapter on all seven
    projections: a byte a weight (B^T's rank padded to groups of four) and
    a float scale per column of A and of B^T (ie_lora_int8_bytes)."""
    r4 = (r + 3) // 4 * 4
    return n_layer * sum(r * n_in + r4 * n_out + 4 * (n_in + n_out) for _, n_out, n_in in MODS.values())


def step_bytes(model: str, run_dtype: str) -> tuple[float, float]:
    """Bytes one decode step must read: the base's weights (every tensor but
    the token embedding, of which a step reads a row) and the mix's adapters
    as the worker holds them (int8: a byte a weight plus a float scale per
    column of A and of B^T; wide: the file's bf16, 2 bytes a weight)."""
    from gguf import GGUFReader
    base = sum(int(t.n_bytes) for t in GGUFReader(model).tensors if t.name != "token_embd.weight")
    if run_dtype == "wide":
        ad = sum(22 * 2 * r * (n_in + n_out) for r in MIX.values() for _, n_out, n_in in MODS.values())
    else:
        ad = sum(int8_bytes(r) for r in MIX.values())
    return float(base), float(ad)


def part_mix(args) -> dict:
    loras = []
    for i, (n, r) in enumerate(MIX.items()):
        d = REPO / f"bench/out/lora/{args.dtype}/{n}"
        make_adapter(d, r, i, args.dtype)
        loras += ["--lora", f"{n}={d}"]
    texts = [f"Once upon a time number {i}" for i in range(8)]
    proc, host = serve(args, loras)
    base = json.loads(urllib.request.urlopen(f"http://{host}/v1/models").read())["data"][0]["id"]
    jobs = {"A": [(base, t) for t in texts], "B": [(list(MIX)[i % 4], t) for i, t in enumerate(texts)]}
    rows = []
    try:
        decode_rate(host, jobs["B"], 4)  # warm-up: first touches of the weights
        for rnd in range(args.rounds):
            for which in ("ABBA" if rnd % 2 == 0 else "BAAB"):
                bw = run_probe(args.build / "bench_membw", ["--size-mib", "256", "--passes", "2"])["gbps"]
                tps = decode_rate(host, jobs[which], args.max_new)
                rows.append({"round": rnd, "run": which, "decode_tps": tps, "read_gbps": bw})
                print(f"  round {rnd} {'base 8x  ' if which == 'A' else 'mixed 4x2'} decode {tps:7.2f} tok/s"
                      f"   paired read {bw if bw is None else round(bw, 1)} GB/s", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    a = [r["decode_tps"] for r in rows if r["run"] == "A"]
    b = [r["decode_tps"] for r in rows if r["run"] == "B"]
    ratio = float(np.median(b) / np.median(a))
    bws = [r["read_gbps"] for r in rows if r["read_gbps"]]
    print(f"mix: median decode base {np.median(a):.2f} tok/s, mixed {np.median(b):.2f} tok/s, "
          f"ratio {ratio:.3f} (target >= 0.95); read bandwidth {min(bws, default=0):.1f}.."
          f"{max(bws, default=0):.1f} GB/s, load average {os.getloadavg()[0]:.1f}", flush=True)
    # the bytes ratio: what the ratio would be if an adapter byte cost what a
    # base byte does (a bound when the base step is at the bandwidth limit)
    try:
        base_b, ad_b = step_bytes(args.model, args.run_dtype)
        ceiling = base_b / (base_b + ad_b)
        print(f"mix: a step reads {base_b / 1e6:.0f} MB of base weights + {ad_b / 1e6:.1f} MB of adapters "
              f"({'bf16' if args.run_dtype == 'wide' else 'int8'}): bytes ratio {ceiling:.3f}; "
              f"measured {ratio / ceiling:.3f} of it", flush=True)
    except (ImportError, OSError, ValueError) as e:
        base_b = ad_b = ceiling = float("nan")
        print(f"mix: step bytes unknown ({e})", flush=True)
    return {"part": "mix", "model": args.model, "threads": args.threads, "streams": 8, "adapters": MIX,
            "dtype": args.dtype, "run_dtype": args.run_dtype, "max_new": args.max_new, "runs": rows, "median_base_tps": float(np.median(a)),
            "median_mixed_tps": float(np.median(b)), "ratio": ratio, "base_bytes": base_b, "adapter_bytes": ad_b,
            "bytes_ratio": ceiling}


def metrics(host: str) -> str:
    return urllib.request.urlopen(f"http://{host}/metrics", timeout=60).read().decode()


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name}(?:{{}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def buckets(text: str, name: str) -> list[tuple[float, float]]:
    """(le, cumulative count) of a Prometheus histogram, le ascending."""
    out = [(float("inf") if le == "+Inf" else float(le), float(v))
           for le, v in re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M)]
    return sorted(out)


def quantile(q: float, before, after) -> float:
    """histogram_quantile over the difference of two scrapes."""
    d = [(le, a - b) for (le, a), (_, b) in zip(after, before)]
    if not d or d[-1][1] <= 0:
        return float("nan")
    rank, prev_le, prev_n = q * d[-1][1], 0.0, 0.0
    for le, n in d:
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_n) / max(n - prev_n, 1e-12)
        prev_le, prev_n = le, n
    return prev_le


def part_zipf(args) -> dict | None:
    n, room = args.zipf_adapters, args.zipf_room
    dirs, size = [], 0
    for k in range(n):
        d = REPO / f"bench/out/lora/zipf-r{args.zipf_rank}-{args.dtype}/z{k:02d}"
        size = max(size, make_adapter(d, args.zipf_rank, 100 + k, args.dtype))
        dirs.append(d)
    # room for `room` adapters, not one more: the budget (MiB) charges each
    # its weights and, on a quantized base run in int8, the worker's copy
    copy = 0 if args.run_dtype == "wide" else int8_bytes(args.zipf_rank)
    budget_mb = room * (size + copy) / 1048576 * 1.01
    try:
        proc, host = serve(args, ["--lora-budget-mb", f"{budget_mb:.3f}"])
    except RuntimeError as e:
        print(f"zipf: skipped: this build has no run-time adapters (--lora-budget-mb: {e})")
        return None
    try:
        st, txt = post(host, "/v1/load_lora_adapter", {"lora_name": "z00", "lora_path": str(dirs[0])})
        if st == 404 or (st != 200 and "load_lora_adapter" in txt):
            print(f"zipf: skipped: this build has no run-time adapter loading (HTTP {st}: {txt[:120]})")
            return None
        assert st == 200, (st, txt)
        for k in range(1, n):
            st, txt = post(host, "/v1/load_lora_adapter", {"lora_name": f"z{k:02d}", "lora_path": str(dirs[k])})
            assert st == 200, (k, st, txt)
        rng = np.random.default_rng(args.seed)
        p = 1.0 / np.arange(1, n + 1) ** args.zipf_s
        trace = rng.choice(n, size=args.zipf_requests, p=p / p.sum())
        bw0 = run_probe(args.build / "bench_membw", ["--size-mib", "256", "--passes", "2"])["gbps"]
        m0 = metrics(host)

        def one(k):
            body = {"model": f"z{k:02d}", "prompt": f"Request for adapter {k}", "max_tokens": args.zipf_new,
                    "temperature": 0, "ignore_eos": True}
            st, txt = post(host, "/v1/completions", body)
            assert st == 200, (st, txt[:200])
            return json.loads(txt)["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            toks = sum(ex.map(one, trace.tolist()))
        wall = time.perf_counter() - t0
        m1 = metrics(host)
        bw1 = run_probe(args.build / "bench_membw", ["--size-mib", "256", "--passes", "2"])["gbps"]
    finally:
        proc.terminate()
        proc.wait(60)
    loads = metric(m1, "ie_lora_loads_total") - metric(m0, "ie_lora_loads_total")
    b0, b1 = buckets(m0, "ie_lora_load_seconds"), buckets(m1, "ie_lora_load_seconds")
    res = {"part": "zipf", "adapters": n, "room": room, "rank": args.zipf_rank, "dtype": args.dtype,
           "adapter_bytes": size, "budget_mb": budget_mb, "requests": args.zipf_requests, "s": args.zipf_s,
           "distinct": int(len(set(trace.tolist()))), "wall_s": wall, "tokens_per_s": toks / wall,
           "requests_per_s": args.zipf_requests / wall, "loads": loads,
           "hit_rate": 1.0 - loads / args.zipf_requests,
           "evictions": metric(m1, "ie_lora_evictions_total") - metric(m0, "ie_lora_evictions_total"),
           "load_p50_s": quantile(0.5, b0, b1), "load_p95_s": quantile(0.95, b0, b1),
           "read_gbps_before": bw0, "read_gbps_after": bw1, "loadavg": os.getloadavg()[0]}
    gbps = "/".join("n/a" if b is None else f"{b:.1f}" for b in (bw0, bw1))
    print(f"zipf: {n} adapters (r {args.zipf_rank}, {size / 1e6:.1f} MB each), room {room}, "
          f"{args.zipf_requests} requests (s {args.zipf_s}, {res['distinct']} distinct): "
          f"{res['tokens_per_s']:.1f} tok/s, {res['requests_per_s']:.2f} req/s, hit rate {res['hit_rate']:.3f}, "
          f"{loads:.0f} loads, load p50 {res['load_p50_s'] * 1e3:.0f} ms p95 {res['load_p95_s'] * 1e3:.0f} ms; "
          f"read bandwidth {gbps} GB/s (before/after), load average {res['loadavg']:.1f}", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="mix,zipf")
    ap.add_argument("--model", default=str(REPO / "models/bench/tinyllama-q4_0.gguf"))
    ap.add_argument("--build", type=Path, default=REPO / "build")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="bf16", help="adapter weights (bf16 needs torch)")
    ap.add_argument("--run-dtype", choices=["auto", "int8", "wide"], default="auto",
                    help="how the worker holds them (env IE_LORA_DTYPE; auto: int8 on a quantized base)")
    ap.add_argument("--zipf-adapters", type=int, default=64)
    ap.add_argument("--zipf-room", type=int, default=16)
    ap.add_argument("--zipf-rank", type=int, default=16)
    ap.add_argument("--zipf-requests", type=int, default=128)
    ap.add_argument("--zipf-new", type=int, default=16)
    ap.add_argument("--zipf-s", type=float, default=1.1)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    if args.run_dtype != "auto":
        os.environ["IE_LORA_DTYPE"] = args.run_dtype  # the server inherits it
    out = []
    parts = args.parts.split(",")
    if "mix" in parts:
        out.append(part_mix(args))
    if "zipf" in parts:
        z = part_zipf(args)
        if z:
            out.append(z)
    for o in out:
        print(json.dumps(o))
    return 0


if __name__ == "__main__":
    sys.exit(main())
