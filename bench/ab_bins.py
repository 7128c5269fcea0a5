#!/usr/bin/env python3
"""A/B two inference-engine binaries on one model, interleaved in one run.

Each round runs A then B (the order flips every round) with the same prompt
and greedy decoding, and reads prefill_tps and decode_tps from their JSON
lines. The machine's bandwidth drifts within seconds, so only the ratios of
neighbouring runs are meaningful: the table prints each round's B/A ratios
and their median, min and max. Asserts nothing.

    bench/ab_bins.py --a /tmp/old/inference-engine --b build/inference-engine \
        --model models/bench/tinyllama-q4_0.gguf --rounds 6

Only the standard library is used.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "corpus"


def prompt_words(n_words: int) -> str:
    words = []
    for f in sorted(CORPUS.glob("*.txt")):
        words += f.read_text(encoding="utf-8", errors="replace").split()
        if len(words) >= n_words:
            break
    return " ".join(words[:n_words])


def run(binary: str, args, prompt: str) -> dict:
    cmd = [binary, "--model", args.model, "--prompt", prompt, "--max-new", str(args.gen), "--greedy",
           "--threads", str(args.threads)]
    if args.precision:
        cmd += ["--precision", args.precision]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"{binary} failed ({r.returncode}): {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="baseline binary")
    ap.add_argument("--b", required=True, help="binary under test")
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", default="")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--words", type=int, default=380, help="prompt length in words (~512 tokens)")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    prompt = prompt_words(args.words)
    rows = []
    for i in range(args.rounds):
        order = ("a", "b") if i % 2 == 0 else ("b", "a")
        res = {}
        for who in order:
            res[who] = run(getattr(args, who), args, prompt)
        ra, rb = res["a"], res["b"]
        rows.append((ra["prefill_tps"], rb["prefill_tps"], ra["decode_tps"], rb["decode_tps"]))
        print(f"round {i}: tokens_in {ra['tokens_in']}  prefill A {ra['prefill_tps']:.1f} B {rb['prefill_tps']:.1f}"
              f" (B/A {rb['prefill_tps'] / ra['prefill_tps']:.3f})  decode A {ra['decode_tps']:.2f}"
              f" B {rb['decode_tps']:.2f} (B/A {rb['decode_tps'] / ra['decode_tps']:.3f})", flush=True)
    for name, ia, ib in (("prefill", 0, 1), ("decode", 2, 3)):
        ratios = [r[ib] / r[ia] for r in rows]
        print(f"{name} B/A: median {statistics.median(ratios):.3f}  min {min(ratios):.3f}  max {max(ratios):.3f}"
              f"  (A median {statistics.median(r[ia] for r in rows):.1f} t/s,"
              f" B median {statistics.median(r[ib] for r in rows):.1f} t/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
