#!/usr/bin/env python3
"""bench_lora.py — decode throughput with LoRA adapters mixed in one batch.

Random PEFT adapters (N(0, 0.02) A and B, so they cost what trained ones
do) of rank 16 and 32 on all seven projections are written for the
TinyLlama-shaped benchmark model (bench/make_tinyllama_gguf.py: 22 layers,
hidden 2048, 32/4 heads, FFN 5632) under bench/out/lora/. Then
`inference-engine serve --batch 8` with the adapters gets 8 concurrent
greedy completions twice per round, alternating:
  base   — the 8 prompts on the base model (adapters loaded, unused)
  mixed  — the same 8 prompts over 4 adapters (2 streams each, the OpenAI
           "model" field naming the adapter)
and reports generated tokens/s of wall time (prefill included) of each
and the ratio mixed / base (the issue's target for decode: >= 0.95). A
figure, not a test; run on a quiet machine.

Usage: bench/bench_lora.py [--model models/bench/tinyllama-q4_0.gguf]
       [--threads N] [--max-new 32] [--rounds 3] [--dtype bf16|f32]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[1]
MODS = {"q_proj": ("self_attn", 2048, 2048), "k_proj": ("self_attn", 256, 2048), "v_proj": ("self_attn", 256, 2048),
        "o_proj": ("self_attn", 2048, 2048), "gate_proj": ("mlp", 5632, 2048), "up_proj": ("mlp", 5632, 2048),
        "down_proj": ("mlp", 2048, 5632)}


def make_adapter(d: Path, r: int, seed: int, dtype: str, n_layer: int = 22) -> None:
    if (d / "adapter_model.safetensors").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    t = {}
    for layer in range(n_layer):
        for m, (blk, n_out, n_in) in MODS.items():
            pre = f"base_model.model.model.layers.{layer}.{blk}.{m}"
            t[pre + ".lora_A.weight"] = rng.normal(0, 0.02, (r, n_in)).astype(np.float32)
            t[pre + ".lora_B.weight"] = rng.normal(0, 0.02, (n_out, r)).astype(np.float32)
    if dtype == "bf16":  # truncated to bf16 bits, written through torch (safetensors.numpy has no bf16)
        import torch
        from safetensors.torch import save_file as save_torch
        save_torch({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in t.items()},
                   str(d / "adapter_model.safetensors"))
    else:
        save_file(t, str(d / "adapter_model.safetensors"))
    (d / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": r, "target_modules": list(MODS)}))


def serve(args, loras: list[str]):
    """`inference-engine serve` with the adapters loaded; returns (proc, url)."""
    proc = subprocess.Popen([str(REPO / "build/inference-engine"), "serve", "--model", args.model, "--port", "0",
                             "--batch", "8", "--threads", str(args.threads), *loras],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.match(r"listening on http://(\S+):(\d+)$", line.strip())
        if m:
            return proc, f"http://127.0.0.1:{m.group(2)}"
    raise RuntimeError("server did not start")


def run(args, url: str, jobs: list[tuple[str, str]]) -> float:
    """The 8 requests at once; generated tokens per second of wall time."""
    def one(job):
        body = json.dumps({"model": job[0], "prompt": job[1], "max_tokens": args.max_new, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())["usage"]["completion_tokens"]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as ex:
        n = sum(ex.map(one, jobs))
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(REPO / "models/bench/tinyllama-q4_0.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="bf16", help="adapter weights (bf16 needs torch)")
    args = ap.parse_args()
    names = {"a16": 16, "b16": 16, "c32": 32, "d32": 32}
    loras = []
    for i, (n, r) in enumerate(names.items()):
        d = REPO / f"bench/out/lora/{args.dtype}/{n}"
        make_adapter(d, r, i, args.dtype)
        loras += ["--lora", f"{n}={d}"]
    texts = [f"Once upon a time number {i}" for i in range(8)]
    proc, url = serve(args, loras)
    base_name = json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"][0]["id"]
    base_tps, mix_tps = [], []
    try:
        for _ in range(args.rounds):
            base_tps.append(run(args, url, [(base_name, t) for t in texts]))
            mix_tps.append(run(args, url, [(list(names)[i % 4], t) for i, t in enumerate(texts)]))
    finally:
        proc.terminate()
        proc.wait(60)
    b, x = float(np.median(base_tps)), float(np.median(mix_tps))
    print(json.dumps({"model": args.model, "threads": args.threads, "streams": 8, "adapters": names,
                      "dtype": args.dtype,
                      "base_tps": base_tps, "mixed_tps": mix_tps,
                      "median_base": b, "median_mixed": x, "ratio": x / b}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
