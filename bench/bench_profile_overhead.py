#!/usr/bin/env python3
"""--profile's cost: SmolLM2 decode tokens/s of a baseline binary (built
without the profiling brackets, e.g. main), this build with --profile off and
this build with --profile on, interleaved rounds, medians. Writes
bench/out/profile-overhead.json. Usage:
    bench/bench_profile_overhead.py --base /path/to/old/inference-engine [--rounds 5]"""
import argparse
import json
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(binary, extra, args):
    cmd = [binary, "--model", args.model, "--prompt", "Once upon a time", "--max-new", str(args.tokens),
           "--greedy", "--threads", str(args.threads)] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["decode_tps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--model", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    new = str(Path(args.build) / "inference-engine")
    res = {"base": [], "off": [], "on": []}
    for _ in range(args.rounds):
        res["base"].append(run(args.base, [], args))
        res["off"].append(run(new, [], args))
        res["on"].append(run(new, ["--profile"], args))
    med = {k: statistics.median(v) for k, v in res.items()}
    out = {"decode_tps": res, "median": med,
           "off_vs_base_pct": 100 * (med["off"] / med["base"] - 1),
           "on_vs_off_pct": 100 * (med["on"] / med["off"] - 1)}
    (ROOT / "bench/out").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench/out/profile-overhead.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
