#!/usr/bin/env python3
"""bench_distributed.py — decode (and prefill) speed of the distributed
execution against the embedded engine (issue 5).

Configurations, interleaved round-robin over --rounds rounds:
  embedded        inference-engine --threads T
  inproc-tensor   inference-engine --threads T --plan tensor:2
                  (two in-process workers over inproc://, T/2 threads each)
  inproc-pipeline inference-engine --threads T --plan pipeline:2
  proc-tensor     ie-coordinator --plan tensor --workers 2 + two ie-worker
                  --threads T/2 on loopback tcp; one request through the
                  client protocol (the "done" map carries decode_tps)
  proc-pipeline   the same with --plan pipeline
  proc-embedded   inference-engine serve --threads T --zmq-bind: the embedded
                  engine behind the same client protocol and serving loop,
                  measured the same way as proc-* (decode_tps of the done
                  map: time between tokens, sampling and the loop
                  included) — the baseline of the proc-* ratios; the CLI's
                  decode_tps (embedded, inproc-*) counts step time only
  proc-tensor-la  proc-tensor with IE_LOOKAHEAD=1: chained steps forced on
                  (the plain configurations leave the coordinator its
                  default, off where the ranks fill the CPUs as here; the
                  A/B of docs/PROTOCOL.md "Chained steps")
  *-lat0          the configuration with IE_CPU_LATENCY_US=0 in every
                  process (a PM QoS request: idle CPUs poll instead of
                  sleeping, ie_cpulat.h), against its baseline also run so
                  (proc-embedded-lat0 / embedded-lat0)
  *-tensor-zmq    the tensor configurations with IE_TP_SHM=0: partial sums
                  over ZeroMQ instead of shared memory (the A/B of the
                  same-host reduce, ie_shmreduce.h; the plain tensor
                  configurations run with IE_TP_SHM=1)

For the process configurations the workers serve /metrics, and the script
reads ie_worker_transfer_seconds_total / ie_worker_compute_seconds_total /
ie_worker_steps_total before and after the measured request: the time per
step a worker spent exchanging partial sums / hidden states (for tensor
ranks that includes waiting for the slower peer) and computing.

Bytes on the wire per decoded token are computed from the model's shapes
(payload only, message headers excluded):
  tensor   every rank sends 2 reductions per layer x n_embd x 4 bytes to each
           of the (ranks-1) others (over shared memory, off the wire, unless
           IE_TP_SHM=0); the ranks send their arg max (8 bytes each: the
           requests are greedy; a sampled request would get the logits
           slices, n_vocab x 4 in all) to the coordinator; the coordinator sends
           13 bytes of token/pos/seq/flag to each rank
  pipeline n_embd x 4 per hop (ranks-1 hops), the arg max (8 bytes) from
           the last stage, 13 bytes to stage 0 (and along each hop)

Prefill for the process configurations is n_prompt / ttft_ms of the done
map (ttft includes the queue and the request's own tokenization), so it is
a slight underestimate next to the CLI's prefill_tps.

Writes bench/out/distributed-<stamp>.json and prints a table.

  .venv/bin/python bench/bench_distributed.py [--rounds 3] [--gen 64] [--prompt-tokens 64]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (corpus, GGUF header reader, machine info)

CONFIGS = ["embedded", "inproc-tensor", "inproc-tensor-zmq", "inproc-pipeline", "proc-embedded", "proc-tensor",
           "proc-tensor-zmq", "proc-tensor-la",
           "proc-pipeline", "proc-embedded-lat0", "proc-tensor-lat0"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shapes(model: Path) -> dict:
    meta, tensors = harness.gguf_tensors(model)
    arch = meta.get("general.architecture", "llama")
    d = {"arch": arch, "n_embd": meta.get(f"{arch}.embedding_length"), "n_layer": meta.get(f"{arch}.block_count"),
         "n_head_kv": meta.get(f"{arch}.attention.head_count_kv"), "n_vocab": meta.get(f"{arch}.vocab_size")}
    if not d["n_vocab"]:
        for name, dims, _ in tensors:
            if name in ("token_embd.weight", "output.weight") and len(dims) == 2:
                d["n_vocab"] = dims[1]
                break
    return d


def wire_bytes(sh: dict, plan: str, ranks: int, shm: bool = False, greedy: bool = True) -> dict:
    """greedy: the requests are greedy without penalties, so each head rank
    sends its arg max (8 bytes) instead of its logits slice."""
    e, L, V = sh["n_embd"], sh["n_layer"], sh["n_vocab"]
    step_in = 13  # token, pos, seq (int32) + logits flag (u8) per token
    if plan == "tensor":
        per_rank_peers = 2 * L * e * 4 * (ranks - 1)
        peers = per_rank_peers * ranks
        logits = 8 * ranks if greedy else V * 4
        coord_out = step_in * ranks
        return {"peer_bytes_per_rank": per_rank_peers, "peer_bytes": peers, "peer_via": "shm" if shm else "zmq",
                "logits_bytes": logits, "coord_out_bytes": coord_out,
                "total_bytes": (0 if shm else peers) + logits + coord_out}
    hops = (ranks - 1) * (e * 4 + step_in)
    logits = 8 if greedy else V * 4
    return {"peer_bytes": hops, "logits_bytes": logits, "coord_out_bytes": step_in,
            "total_bytes": hops + logits + step_in}


# ------------------------------------------------------------ embedded CLI
def run_cli(bin_dir: Path, model: Path, prompt: str, gen: int, threads: int, plan: str | None,
            env: dict | None = None) -> dict:
    cmd = [str(bin_dir / "inference-engine"), "--model", str(model), "--prompt", prompt, "--max-new", str(gen),
           "--threads", str(threads), "--greedy", "--warmup", "1", "--seed", "1"]
    if plan:
        cmd += ["--plan", plan]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    line = next((l for l in reversed(cp.stdout.splitlines()) if l.startswith("{")), None)
    if cp.returncode != 0 or not line:
        return {"error": (cp.stderr.strip().splitlines() or ["no output"])[-1]}
    j = json.loads(line)
    return {"decode_tps": j.get("decode_tps"), "prefill_tps": j.get("prefill_tps"), "n_prompt": j.get("tokens_in"),
            "n_gen": j.get("tokens_out")}


# ------------------------------------------------------- real processes
def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def worker_sum(m: dict, name: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(name + "{") or k == name)


def request(sock, zmq, msgpack, rid: str, prompt: str, gen: int, timeout_s: float = 120) -> dict:
    sock.send(msgpack.packb({"v": 1, "type": "generate", "id": rid, "prompt": prompt, "max_new": gen,
                             "temperature": 0, "seed": 1, "stream": False}))
    end = time.time() + timeout_s
    while time.time() < end:
        if not sock.poll(1000):
            continue
        m = msgpack.unpackb(sock.recv(), raw=False)
        if m.get("id") != rid:
            continue
        if m.get("type") in ("done", "error"):
            return m
    return {"type": "error", "code": "timeout", "message": f"no answer in {timeout_s} s"}


def done_fields(d: dict) -> dict:
    """The figures of a done map."""
    return {"decode_tps": d["decode_tps"],
            "prefill_tps": d["n_prompt"] / (d["ttft_ms"] / 1e3) if d.get("ttft_ms") else None,
            "n_prompt": d["n_prompt"], "n_gen": d["n_gen"], "ttft_ms": d["ttft_ms"], "total_ms": d["total_ms"]}


def run_procs(bin_dir: Path, model: Path, prompt: str, gen: int, threads: int, plan: str,
              env: dict | None = None) -> dict:
    import msgpack
    import zmq
    wport, cport, mport = free_port(), free_port(), free_port()
    wm = [free_port(), free_port()]
    procs = []
    logs = []
    res: dict = {}
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        f = open(os.devnull, "w")
        logs.append(f)
        if plan == "embedded":  # the embedded engine behind the same protocol and loop
            procs.append(subprocess.Popen(
                [str(bin_dir / "inference-engine"), "serve", "--model", str(model), "--port", "0",
                 "--zmq-bind", f"tcp://127.0.0.1:{cport}", "--batch", "1", "--threads", str(threads)],
                stdout=f, stderr=subprocess.STDOUT, env=env))
            sock.connect(f"tcp://127.0.0.1:{cport}")
            w = request(sock, zmq, msgpack, "warmup", prompt, gen)
            if w.get("type") != "done":
                return {"error": f"warm-up: {w.get('code')}: {w.get('message')}"}
            d = request(sock, zmq, msgpack, "measured", prompt, gen)
            if d.get("type") != "done":
                return {"error": f"{d.get('code')}: {d.get('message')}"}
            res.update(done_fields(d))
            return res
        procs.append(subprocess.Popen(
            [str(bin_dir / "ie-coordinator"), "--model", str(model), "--plan", plan, "--workers", "2",
             "--bind", f"tcp://127.0.0.1:{wport}", "--client-bind", f"tcp://127.0.0.1:{cport}",
             "--metrics-port", str(mport), "--batch", "1"], stdout=f, stderr=subprocess.STDOUT, env=env))
        for r in range(2):
            procs.append(subprocess.Popen(
                [str(bin_dir / "ie-worker"), "--model", str(model), "--coordinator", f"tcp://127.0.0.1:{wport}",
                 "--rank", str(r), "--threads", str(max(1, threads // 2)), "--metrics-port", str(wm[r])],
                stdout=f, stderr=subprocess.STDOUT, env=env))
        t0 = time.time()
        while True:  # ready when both ranks are up
            try:
                m = scrape(mport)
                if m.get('ie_worker_up{worker="0"}') == 1 and m.get('ie_worker_up{worker="1"}') == 1:
                    break
            except OSError:
                pass
            if time.time() - t0 > 120 or any(p.poll() is not None for p in procs):
                return {"error": "cluster did not become ready"}
            time.sleep(0.1)
        res["ready_s"] = time.time() - t0
        sock.connect(f"tcp://127.0.0.1:{cport}")
        w = request(sock, zmq, msgpack, "warmup", prompt, gen)
        if w.get("type") != "done":
            return {"error": f"warm-up: {w.get('code')}: {w.get('message')}"}
        before = [scrape(p) for p in wm]
        cb = scrape(mport)
        d = request(sock, zmq, msgpack, "measured", prompt, gen)
        after = [scrape(p) for p in wm]
        ca = scrape(mport)
        for k in ("used", "dropped"):  # chained steps sent ahead (ie_cluster_lookahead)
            key = f'ie_lookahead_steps_total{{outcome="{k}"}}'
            res[f"lookahead_{k}"] = ca.get(key, 0) - cb.get(key, 0)
        if d.get("type") != "done":
            return {"error": f"{d.get('code')}: {d.get('message')}"}
        res.update(done_fields(d))
        per = []
        for r in range(2):
            dd = {k: worker_sum(after[r], k) - worker_sum(before[r], k)
                  for k in ("ie_worker_steps_total", "ie_worker_transfer_seconds_total",
                            "ie_worker_compute_seconds_total")}
            steps = dd["ie_worker_steps_total"]
            per.append({"rank": r, "steps": steps,
                        "transfer_ms_per_step": dd["ie_worker_transfer_seconds_total"] * 1e3 / steps if steps else None,
                        "compute_ms_per_step": dd["ie_worker_compute_seconds_total"] * 1e3 / steps if steps else None})
        res["workers"] = per
        return res
    finally:
        sock.close()
        ctx.term()
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()


def baseline_of(cfg: str) -> str:
    """The configuration a ratio of cfg is taken against."""
    lat = "-lat0" if cfg.endswith("-lat0") else ""
    return ("proc-embedded" if cfg.startswith("proc-") else "embedded") + lat


def run_config(cfg: str, a, prompt: str) -> dict:
    env = dict(os.environ, IE_TP_SHM="0" if cfg.endswith("-zmq") else "1")
    env.pop("IE_LOOKAHEAD", None)
    env.pop("IE_CPU_LATENCY_US", None)
    if cfg.endswith("-lat0"):
        env["IE_CPU_LATENCY_US"] = "0"
        cfg = cfg[:-len("-lat0")]
    if cfg.endswith("-la"):
        env["IE_LOOKAHEAD"] = "1"
    if cfg == "embedded":
        return run_cli(a.bin_dir, a.model, prompt, a.gen, a.threads, None, env)
    if cfg.startswith("inproc-"):
        return run_cli(a.bin_dir, a.model, prompt, a.gen, a.threads, cfg.split("-")[1] + ":2", env)
    return run_procs(a.bin_dir, a.model, prompt, a.gen, a.threads, cfg.split("-")[1], env)


def stats(vals: list[float]) -> dict:
    vals = [v for v in vals if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def f1(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", type=Path, default=REPO / "build")
    ap.add_argument("--model", type=Path, default=REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", type=Path, default=REPO / "bench/out")
    a = ap.parse_args(argv)
    configs = [c for c in a.configs.split(",") if c]

    words = harness.corpus_words()
    n_words, n_tok = harness.words_for_tokens(a.bin_dir / "inference-engine", a.model, a.prompt_tokens, words)
    prompt = " ".join(words[:n_words])
    sh = shapes(a.model)
    machine = harness.machine_info()
    log(f"model {a.model.name}: {sh}; prompt ~{n_tok} tokens, {a.gen} generated, {a.threads} threads; "
        f"load average {machine.get('loadavg')}")

    runs = {c: [] for c in configs}
    loads = []
    for rnd in range(a.rounds):
        for c in configs:
            loads.append(os.getloadavg()[0])
            r = run_config(c, a, prompt)
            r["round"] = rnd
            runs[c].append(r)
            log(f"round {rnd} {c:16s} " + (f"error: {r['error']}" if "error" in r else
                f"decode {f1(r.get('decode_tps'))} t/s, prefill {f1(r.get('prefill_tps'))} t/s"))

    summary = {}
    for c in configs:
        ok = [r for r in runs[c] if "error" not in r]
        s = {"decode_tps": stats([r.get("decode_tps") for r in ok]),
             "prefill_tps": stats([r.get("prefill_tps") for r in ok]), "errors": len(runs[c]) - len(ok)}
        if c.startswith("proc-") and not c.startswith("proc-embedded"):
            for k in ("transfer_ms_per_step", "compute_ms_per_step"):
                s[k] = {str(rk): stats([w[k] for r in ok for w in r.get("workers", []) if w["rank"] == rk])
                        for rk in range(2)}
        if c != baseline_of(c):
            s["wire"] = wire_bytes(sh, c.split("-")[1], 2, shm=c.split("-")[1] == "tensor" and not c.endswith("-zmq"))
        summary[c] = s
    base = summary.get("embedded", {}).get("decode_tps", {}).get("median")
    base_p = summary.get("embedded", {}).get("prefill_tps", {}).get("median")
    # process configurations against the embedded engine behind the same
    # serving path (proc-embedded) when it ran, the others against the CLI
    pbase = summary.get("proc-embedded", {}).get("decode_tps", {}).get("median")
    pbase_p = summary.get("proc-embedded", {}).get("prefill_tps", {}).get("median")
    for c, s in summary.items():
        m, mp = s["decode_tps"]["median"], s["prefill_tps"]["median"]
        b, bp = (pbase, pbase_p) if c.startswith("proc-") and pbase else (base, base_p)
        if c.endswith("-lat0"):
            bs = summary.get(baseline_of(c), {})
            b, bp = bs.get("decode_tps", {}).get("median"), bs.get("prefill_tps", {}).get("median")
        s["decode_ratio"] = m / b if m and b else None
        s["prefill_ratio"] = mp / bp if mp and bp else None
        # paired: each round's run against its baseline's run of the same
        # round (minutes apart at most), so a bandwidth phase that flips
        # between rounds moves both sides of a ratio
        bc = "proc-embedded" if c.startswith("proc-") and "proc-embedded" in runs else "embedded"
        if c.endswith("-lat0"):
            bc = baseline_of(c)
        pairs = []
        for r, rb in zip(runs[c], runs.get(bc, [])):
            x, y = r.get("decode_tps"), rb.get("decode_tps")
            if "error" not in r and "error" not in rb and x and y:
                pairs.append(x / y)
        s["decode_ratio_paired"] = stats(pairs) if bc in runs and c != bc else None

    print(f"\n{a.model.name} distributed vs embedded ({a.rounds} rounds, prompt ~{n_tok} tokens, {a.gen} generated, "
          f"{a.threads} threads; load average at start {machine.get('loadavg')})")
    print(f"{'config':16s} {'decode t/s med [min-max]':>28s} {'x emb':>6s} {'prefill t/s med [min-max]':>30s} "
          f"{'x emb':>6s} {'wire B/token':>13s} {'xfer ms/step r0,r1':>19s} {'compute ms/step r0,r1':>22s} "
          f"{'x emb paired med [min-max]':>27s}")
    for c, s in summary.items():
        d, p = s["decode_tps"], s["prefill_tps"]
        xf = cp = "-"
        if "transfer_ms_per_step" in s:
            xf = ",".join(f1(s["transfer_ms_per_step"][k]["median"], ".2f") for k in ("0", "1"))
            cp = ",".join(f1(s["compute_ms_per_step"][k]["median"], ".2f") for k in ("0", "1"))
        wire = s.get("wire", {}).get("total_bytes")
        print(f"{c:16s} {f1(d['median']):>8s} [{f1(d['min'])}-{f1(d['max'])}]".ljust(46)
              + f"{f1(s['decode_ratio'], '.2f'):>6s} "
              + f"{f1(p['median']):>10s} [{f1(p['min'])}-{f1(p['max'])}]".ljust(30)
              + f" {f1(s['prefill_ratio'], '.2f'):>6s} {('-' if wire is None else str(wire)):>13s} "
              f"{xf:>19s} {cp:>22s} "
              + (f"{f1(pr['median'], '.2f')} [{f1(pr['min'], '.2f')}-{f1(pr['max'], '.2f')}]".rjust(27)
                 if (pr := s.get("decode_ratio_paired")) and pr["n"] else "-".rjust(27))
              + (f"  ({s['errors']} errors)" if s["errors"] else ""))
    print("wire B/token: payload bytes per decoded token summed over all links (headers excluded; tensor partial "
          "sums go through shared memory except in *-zmq); xfer ms/step: ie_worker_transfer_seconds_total per step "
          "(tensor: includes waiting for the peer); x emb: proc-* against proc-embedded (same serving path and "
          "measurement) when it ran, the others against the CLI's embedded run; paired: the median of the "
          "per-round ratios (each run against the same round's baseline run)")
    for suffix, what in (("", "shared-memory reduce"), ("-zmq", "IE_TP_SHM=0"),
                         ("-lat0", "IE_CPU_LATENCY_US=0 everywhere")):
        goal = summary.get("proc-tensor" + suffix, {}).get("decode_ratio")
        inproc = summary.get("inproc-tensor" + suffix, {}).get("decode_ratio")
        gp = (summary.get("proc-tensor" + suffix, {}).get("decode_ratio_paired") or {}).get("median")
        ip = (summary.get("inproc-tensor" + suffix, {}).get("decode_ratio_paired") or {}).get("median")
        if goal is not None or inproc is not None:
            print(f"goal tensor-parallel >= 0.9x embedded ({what}): processes {f1(goal, '.2f')}x "
                  f"(paired {f1(gp, '.2f')}x), in-process {f1(inproc, '.2f')}x (paired {f1(ip, '.2f')}x)")

    a.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = a.out / f"distributed-{stamp}.json"
    doc = {"stamp": stamp, "model": str(a.model), "shapes": sh, "prompt_tokens": n_tok, "gen": a.gen,
           "threads": a.threads, "rounds": a.rounds, "machine": machine, "loadavg_per_run": loads,
           "git": harness.git_info(), "summary": summary, "runs": runs}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
