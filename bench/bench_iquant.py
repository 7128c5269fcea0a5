#!/usr/bin/env python3
"""bench_iquant.py — the grid i-quants on the TinyLlama-1.1B shape, clocher
against llama.cpp on the same GGUF files, A/B interleaved.

Models: models/bench/tinyllama-q4_0.gguf (the baseline) and, per type, the
GGUF bench/make_iquant_gguf.py writes (random codes in every layer matrix,
token_embd and output Q4_0; made when missing).

Per round, for every model in turn (the order flips each round):
  * clocher decode: build/bench_decode --tokens N (each token paired with a
    read of the same bytes by the same threads: its fraction of the read is
    printed beside the rate, the machine's limit at that moment);
  * clocher prefill: inference-engine, a ~P-token corpus prompt, --max-new 1;
  * llama.cpp: llama-bench -p P -n N -r 1 on the same file and threads
    (scripts/llama_cpp.sh builds it with the other tools; skipped if absent).
Medians over rounds; ratios are clocher / llama.cpp of the same round. One
JSON line per run to bench/out/iquant-<stamp>.jsonl. Asserts nothing.

Usage: bench/bench_iquant.py [--types iq2_xxs,iq3_s,...] [--rounds N] [--tokens N] [--pp N] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_kquant import decode, f, med, prefill  # noqa: E402  (bench_decode, the engine's pp run, medians)
from harness import corpus_words, words_for_tokens  # noqa: E402

BASE = REPO / "models" / "bench" / "tinyllama-q4_0.gguf"
LLAMA_BENCH = REPO / "third_party" / "llama.cpp" / "build" / "bin" / "llama-bench"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def lcpp(model: Path, args) -> dict:
    """llama-bench's pp and tg rates (t/s) on model, or an error."""
    if not LLAMA_BENCH.is_file():
        return {"error": "no llama-bench (scripts/llama_cpp.sh)"}
    cmd = [str(LLAMA_BENCH), "-m", str(model), "-t", str(args.threads), "-p", str(args.pp), "-n", str(args.tokens),
           "-r", "1", "-o", "json"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if cp.returncode != 0:
        return {"error": f"llama-bench exit {cp.returncode}: {cp.stderr.strip()[-300:]}"}
    out = {}
    for rec in json.loads(cp.stdout):
        out["pp" if rec.get("n_prompt") else "tg"] = rec.get("avg_ts")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=Path, default=Path(os.environ.get("IE_BUILD_DIR", REPO / "build")))
    ap.add_argument("--types", default="iq2_xxs,iq2_s,iq3_xxs,iq3_s,iq1_m")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="decode tokens a run (32)")
    ap.add_argument("--pp", type=int, default=128, help="prompt tokens of the prefill runs (128)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not BASE.is_file():
        subprocess.run([sys.executable, str(REPO / "bench" / "make_tinyllama_gguf.py"), "--types", "q4_0"], check=True)
    cp = subprocess.run([sys.executable, str(REPO / "bench" / "make_iquant_gguf.py"), "--types", args.types],
                        capture_output=True, text=True, check=True)
    models = [("q4_0", BASE)] + [(t, Path(p)) for t, p in zip(args.types.split(","), cp.stdout.split())]

    words = corpus_words()
    n_words, n_tok = words_for_tokens(args.build / "inference-engine", BASE, args.pp, words)
    prompt = " ".join(words[:n_words])
    log(f"prompt: {n_words} words = {n_tok} tokens")
    pargs = argparse.Namespace(threads=args.threads, tokens=args.tokens)
    out = REPO / "bench" / "out" / f"iquant-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {name: [] for name, _ in models}
    load0 = os.getloadavg()
    with open(out, "w", encoding="utf-8") as jf:
        for rnd in range(args.rounds):
            for name, path in (models if rnd % 2 == 0 else models[::-1]):
                rec = {"model": name, "round": rnd, "loadavg": os.getloadavg()[0],
                       "decode": decode(args.build, path, pargs), "pp": prefill(args.build, path, prompt, pargs),
                       "lcpp": lcpp(path, args)}
                jf.write(json.dumps(rec) + "\n")
                jf.flush()
                runs[name].append(rec)
                d = rec["decode"].get("all", {})
                log(f"round {rnd} {name:8} decode {f(d.get('decode_tps'), '.1f')} t/s (read {f(d.get('frac_jobs'), '.2f')})"
                    f" pp {f(rec['pp'].get('prefill_tps'), '.1f')}  llama.cpp tg {f(rec['lcpp'].get('tg'), '.1f')}"
                    f" pp {f(rec['lcpp'].get('pp'), '.1f')}")
    load1 = os.getloadavg()
    print(f"TinyLlama-1.1B shape, {args.threads} threads, {args.rounds} round(s), decode {args.tokens} tokens,"
          f" prefill {n_tok} tokens; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end\n")
    print("| type | MB a token | decode t/s (of the read) | llama.cpp tg t/s | ratio | prefill t/s | llama.cpp pp t/s"
          " | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in models:
        rs = runs[name]
        dec = [r["decode"].get("all", {}) for r in rs]
        tg = [r["decode"].get("all", {}).get("decode_tps", 0) / r["lcpp"]["tg"] for r in rs
              if r["lcpp"].get("tg") and r["decode"].get("all", {}).get("decode_tps")]
        pp = [r["pp"].get("prefill_tps", 0) / r["lcpp"]["pp"] for r in rs
              if r["lcpp"].get("pp") and r["pp"].get("prefill_tps")]
        print(f"| {name} | {f(med([r['decode'].get('mb_per_token') for r in rs]), '.0f')}"
              f" | {f(med([d.get('decode_tps') for d in dec]), '.1f')} ({f(med([d.get('frac_jobs') for d in dec]), '.2f')})"
              f" | {f(med([r['lcpp'].get('tg') for r in rs]), '.1f')} | {f(med(tg), '.2f')}"
              f" | {f(med([r['pp'].get('prefill_tps') for r in rs]), '.1f')} | {f(med([r['lcpp'].get('pp') for r in rs]), '.1f')}"
              f" | {f(med(pp), '.2f')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
