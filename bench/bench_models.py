#!/usr/bin/env python3
"""bench_models.py — end-to-end speed of inference-engine on the bench models.

For each model (SmolLM2-135M Q4_1 and the random-weight TinyLlama-1.1B
F16 / Q8_0 / Q4_0 files from bench/make_tinyllama_gguf.py):
  * generation run: ~64-token prompt, --max-new 64 --greedy --threads N
  * prefill run:    ~512-token prompt, --max-new 1
and prints a table:

  model | precision | prefill t/s (512) | decode t/s | MB/token | GB/s | % of membw

  MB/token   weight bytes streamed per decoded token: every weight tensor's
             bytes, counting one row of token_embd (the lookup) — plus the
             whole token_embd again when the output projection is tied to it
  GB/s       MB/token x decode t/s
  % of membw that over the machine's measured 2-thread read bandwidth
             (build/bench_membw's JSON field read_gbps_2t)

Every result is also appended as one JSON object per line to
bench/out/models.jsonl. Nothing is asserted; a failing run is reported in
the table and the JSONL with its error.

Usage: bench/bench_models.py [--bin PATH] [--threads N] [--membw-json FILE]
                             [--models a.gguf,b.gguf] [--precision native|f32]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import gguf

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = [
    REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    REPO / "models" / "bench" / "tinyllama-f16.gguf",
    REPO / "models" / "bench" / "tinyllama-q8_0.gguf",
    REPO / "models" / "bench" / "tinyllama-q4_0.gguf",
]

PARAGRAPH = (
    "The river wound slowly through the valley, past fields of barley and old stone farmhouses "
    "whose chimneys had not smoked in years. Every morning the ferryman rowed across with the "
    "post, the bread and whatever news had reached the town overnight, and every evening he "
    "rowed back with letters, empty baskets and questions nobody could answer. "
)


def prompt_of(n_paragraphs: int) -> str:
    return (PARAGRAPH * n_paragraphs).strip()


def weight_bytes_per_token(path: Path) -> tuple[int, int]:
    """(bytes streamed per decoded token, total tensor bytes)."""
    r = gguf.GGUFReader(str(path))
    total = 0
    per_tok = 0
    embd = None
    has_output = False
    for t in r.tensors:
        nb = int(t.n_bytes)
        total += nb
        if t.name == "token_embd.weight":
            embd = t
            continue
        if t.name == "output.weight":
            has_output = True
        per_tok += nb
    if embd is not None:
        rows = int(embd.shape[-1])          # GGUF shape: [n_embd, n_vocab]
        per_tok += int(embd.n_bytes) // rows
        if not has_output:                  # tied: the whole matrix is the output projection
            per_tok += int(embd.n_bytes)
    return per_tok, total


def read_membw(args) -> tuple[float | None, str]:
    if args.membw_json:
        try:
            obj = json.loads(Path(args.membw_json).read_text())
            return float(obj["read_gbps_2t"]), str(args.membw_json)
        except Exception as e:
            return None, f"{args.membw_json}: {e}"
    exe = REPO / "build" / "bench_membw"
    if not exe.is_file():
        return None, f"{exe} not found"
    try:
        cp = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
        for line in reversed(cp.stdout.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                obj = json.loads(line)
                if "read_gbps_2t" in obj:
                    return float(obj["read_gbps_2t"]), str(exe)
        return None, f"{exe}: no JSON with read_gbps_2t (exit {cp.returncode})"
    except Exception as e:
        return None, f"{exe}: {e}"


def run_engine(bin_path: Path, model: Path, prompt: str, max_new: int, threads: int,
               precision: str, timeout: float) -> dict:
    cmd = [str(bin_path), "--model", str(model), "--prompt", prompt, "--max-new", str(max_new),
           "--greedy", "--threads", str(threads), "--warmup", "1"]  # warm: weights paged in
    if precision != "native":
        cmd += ["--precision", precision]
    t0 = time.time()
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout}s"}
    if cp.returncode != 0:
        return {"error": f"exit {cp.returncode}: {cp.stderr.strip()[-300:]}"}
    lines = cp.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except Exception as e:
        return {"error": f"bad stdout ({e}): {cp.stdout[:200]!r}"}
    out["_wall_outer_s"] = round(time.time() - t0, 3)
    return out


def fmt(v, spec):
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", type=Path, default=Path(os.environ.get("IE_BIN", REPO / "build" / "inference-engine")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--membw-json", type=Path)
    ap.add_argument("--models", help="comma-separated GGUF paths (default: SmolLM2 + TinyLlama f16/q8_0/q4_0)")
    ap.add_argument("--precision", default="native", choices=["native", "f32"])
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "models.jsonl")
    args = ap.parse_args()

    models = [Path(m) for m in args.models.split(",")] if args.models else DEFAULT_MODELS
    membw, membw_src = read_membw(args)
    print(f"# membw: {fmt(membw, '.2f')} GB/s (read, 2 threads) from {membw_src}", file=sys.stderr)
    if not args.bin.is_file():
        print(f"# inference-engine not found at {args.bin}", file=sys.stderr)
    gen_prompt, pre_prompt = prompt_of(1), prompt_of(8)   # ~64 and ~512 tokens

    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(args.out, "a", encoding="utf-8") as jf:
        for m in models:
            rec = {"model": m.name, "path": str(m), "precision": args.precision,
                   "threads": args.threads, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                   "membw_read_gbps_2t": membw}
            if not m.is_file():
                rec["error"] = "model file missing"
            else:
                bpt, total = weight_bytes_per_token(m)
                rec["weight_bytes_per_token"] = bpt
                rec["weight_bytes_total"] = total
                if args.bin.is_file():
                    gen = run_engine(args.bin, m, gen_prompt, args.max_new, args.threads,
                                     args.precision, args.timeout)
                    pre = run_engine(args.bin, m, pre_prompt, 1, args.threads,
                                     args.precision, args.timeout)
                    rec["generate"], rec["prefill512"] = gen, pre
                    dec = gen.get("decode_tps")
                    if isinstance(dec, (int, float)) and dec > 0:
                        rec["achieved_gbps"] = bpt * dec / 1e9
                        if membw:
                            rec["fraction_of_membw"] = rec["achieved_gbps"] / membw
                    errs = [e for e in (gen.get("error"), pre.get("error")) if e]
                    if errs:
                        rec["error"] = "; ".join(errs)
                else:
                    rec["error"] = "inference-engine binary missing"
            jf.write(json.dumps(rec) + "\n")
            rows.append(rec)

    hdr = (f"{'model':34} {'prec':6} {'tok_in':>6} {'prefill t/s':>11} {'pp512 t/s':>9} "
           f"{'decode t/s':>10} {'MB/tok':>8} {'GB/s':>6} {'%membw':>6}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        g, p = r.get("generate", {}), r.get("prefill512", {})
        prec = g.get("precision", r["precision"])
        frac = r.get("fraction_of_membw")
        print(f"{r['model'][:34]:34} {str(prec)[:6]:6} {fmt(p.get('tokens_in'), 'd'):>6} "
              f"{fmt(g.get('prefill_tps'), '.1f'):>11} {fmt(p.get('prefill_tps'), '.1f'):>9} "
              f"{fmt(g.get('decode_tps'), '.2f'):>10} "
              f"{fmt(r.get('weight_bytes_per_token', 0) / 1e6 if 'weight_bytes_per_token' in r else None, '.1f'):>8} "
              f"{fmt(r.get('achieved_gbps'), '.2f'):>6} {fmt(frac * 100 if frac else None, '.0f'):>6}"
              + (f"   ERROR: {r['error']}" if r.get("error") else ""))
    print(f"(results appended to {args.out})", file=sys.stderr)


if __name__ == "__main__":
    main()
