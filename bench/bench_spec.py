#!/usr/bin/env python3
"""bench_spec.py — prompt-lookup speculative decoding (--spec-ngram K)
against plain greedy decoding, A/B interleaved in one run.

Each round runs `inference-engine` twice on the same prompts file, greedy,
once without drafts (A) and once with --spec-ngram K (B), alternating
A B / B A so that the machine's drift falls on both; it prints each arm's
decode tokens/s (median over rounds), the ratio B/A per round, the drafts
fed and confirmed, whether the ids agree, and build/bench_membw's read
bandwidth before and after (the bound of plain decode: a decode step reads
the weights once whatever K confirms).

The default prompts ask for text that repeats the prompt (a list copied,
a function edited), where lookup finds its drafts; pass --prompts FILE for
your own (one per line).

    python3 bench/bench_spec.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --rounds 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import run_probe  # noqa: E402

PROMPTS = [
    "Repeat the list exactly. List: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, "
    "mango, nectarine, orange, papaya. Again: apple, banana, cherry,",
    "Rename x to total in this code. Code: def f(items): x = 0; for i in items: x = x + i; return x. "
    "New code: def f(items): total = 0; for i in items:",
]


def run(exe: Path, model: Path, prompts: Path, k: int, max_new: int, threads: int, batch: int) -> dict:
    cmd = [str(exe), "--model", str(model), "--prompts-file", str(prompts), "--greedy", "--max-new", str(max_new),
           "--threads", str(threads), "--batch", str(batch), "--spec-ngram", str(k)]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if cp.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {cp.returncode}: {cp.stderr[-500:]}")
    return json.loads(cp.stdout.strip().splitlines()[-1])


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=root / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--build", type=Path, default=root / "build")
    ap.add_argument("--prompts", type=Path, help="one prompt per line (default: two that repeat themselves)")
    ap.add_argument("--k", type=int, default=4, help="drafts per step (--spec-ngram)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    a = ap.parse_args()
    exe = a.build / "inference-engine"
    with tempfile.TemporaryDirectory() as tmp:
        prompts = a.prompts
        if prompts is None:
            prompts = Path(tmp) / "prompts.txt"
            prompts.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
        bw0 = run_probe(a.build / "bench_membw", ["--size-mib", "256", "--passes", "2"])["gbps"]
        tps = {0: [], a.k: []}
        ratios, same, drafted, accepted = [], True, 0, 0
        for r in range(a.rounds):
            order = (0, a.k) if r % 2 == 0 else (a.k, 0)
            got = {k: run(exe, a.model, prompts, k, a.max_new, a.threads, a.batch) for k in order}
            for k in order:
                tps[k].append(got[k]["decode_tps"])
            ratios.append(got[a.k]["decode_tps"] / got[0]["decode_tps"])
            same &= got[a.k]["ids"] == got[0]["ids"]
            drafted += got[a.k].get("spec_drafted", 0)
            accepted += got[a.k].get("spec_accepted", 0)
        bw1 = run_probe(a.build / "bench_membw", ["--size-mib", "256", "--passes", "2"])["gbps"]
    print(f"model {a.model.name}, {a.threads} threads, batch {a.batch}, {a.max_new} new tokens a prompt, "
          f"{a.rounds} rounds A/B interleaved")
    print(f"read bandwidth (bench_membw, 2 threads): {bw0} GB/s before, {bw1} GB/s after")
    print(f"decode t/s without drafts: median {statistics.median(tps[0]):.1f}  ({', '.join(f'{x:.1f}' for x in tps[0])})")
    print(f"decode t/s --spec-ngram {a.k}: median {statistics.median(tps[a.k]):.1f}  "
          f"({', '.join(f'{x:.1f}' for x in tps[a.k])})")
    print(f"ratio per round: {', '.join(f'{x:.2f}' for x in ratios)}  (median {statistics.median(ratios):.2f})")
    print(f"drafts fed {drafted}, confirmed {accepted} ({100.0 * accepted / max(drafted, 1):.0f}%); "
          f"ids {'the same' if same else 'DIFFER'} with and without drafts")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
