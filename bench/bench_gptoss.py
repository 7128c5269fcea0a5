#!/usr/bin/env python3
"""bench_gptoss.py — end-to-end speed of inference-engine on the GPT-OSS-20B shape.

Model: models/bench/gptoss-20b-mxfp4.gguf (bench/make_gptoss20b_gguf.py,
random weights, MXFP4 experts, BF16 attention / router / embeddings / output).

Runs
  * build/bench_membw            -> read_gbps_2t (the machine's bandwidth now)
  * generation: ~64-token prompt, --max-new 16 --greedy --threads N --warmup 1
  * prefill:    ~256-token prompt, --max-new 1 (same flags)
and prints decode t/s, prefill t/s, peak RSS, the weight bytes one decoded
token streams and the bandwidth that implies, as a fraction of the probe.

Bytes per decoded token (from the GGUF's tensor sizes):
  per layer: attention (norms, q/k/v/o weights and biases, sinks), the
  router (weight + bias), the post-attention norm, and only the k =
  expert_used_count routed experts of each *_exps tensor (tensor bytes x k /
  n_expert, weights and biases); plus one token_embd row, output_norm and
  the whole output matrix. (The KV cache read is not counted: ~1 MB/token at
  these context lengths.)

Appends one JSON object per run to bench/out/gptoss.jsonl. Nothing is
asserted; a failing run is reported with its error.

Usage: bench/bench_gptoss.py [--bin PATH] [--model FILE] [--threads N]
                             [--max-new N] [--timeout S] [--membw-json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import fmt, read_membw, run_engine  # noqa: E402  (shared with the dense benchmark)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "models" / "bench" / "gptoss-20b-mxfp4.gguf"
CORPUS = REPO / "tests" / "data" / "corpus" / "austen_1.txt"


def log(*a):
    print("[bench_gptoss]", *a, file=sys.stderr, flush=True)


def austen_words() -> list[str]:
    text = CORPUS.read_text(encoding="utf-8")
    i = text.find("Emma Woodhouse")
    return text[i if i >= 0 else 0:].split()


def prompt_of(bin_path: Path, model: Path, n_tokens: int) -> str:
    """Austen prose cut to about n_tokens tokens (counted with the model's
    own tokenizer when possible, else ~0.75 words per token)."""
    words = austen_words()
    guess = max(8, int(n_tokens * 0.75))
    text = " ".join(words[:guess])
    try:
        for _ in range(4):
            cp = subprocess.run([str(bin_path), "tokenize", "--tokenizer", str(model), "--no-bos"],
                                input=text, capture_output=True, text=True, timeout=120)
            n = len(json.loads(cp.stdout)["ids"])
            if abs(n - n_tokens) <= 2:
                break
            guess = max(8, int(round(guess * n_tokens / n)))
            text = " ".join(words[:guess])
    except Exception as e:      # noqa: BLE001
        log(f"token count of the prompt unavailable ({e}); using {guess} words")
    return text


def bytes_per_token(path: Path) -> dict:
    r = gguf.GGUFReader(str(path))
    f = r.fields
    n_exp = int(f["gpt-oss.expert_count"].contents())
    k = int(f["gpt-oss.expert_used_count"].contents())
    per = {"attention": 0, "router": 0, "norms": 0, "experts_routed": 0, "embedding_row": 0,
           "output": 0}
    total = 0
    for t in r.tensors:
        nb = int(t.n_bytes)
        total += nb
        n = t.name
        if n == "token_embd.weight":
            per["embedding_row"] += nb // int(t.shape[-1])        # ne = [H, V]
        elif n == "output.weight":
            per["output"] += nb
        elif "_exps." in n:
            per["experts_routed"] += nb * k // n_exp
        elif ".ffn_gate_inp." in n:
            per["router"] += nb
        elif "norm" in n:
            per["norms"] += nb
        elif ".attn_" in n:
            per["attention"] += nb
        else:
            raise SystemExit(f"unclassified tensor {n}")
    return {"bytes_per_token": sum(per.values()), "breakdown": per, "tensor_bytes_total": total,
            "n_expert": n_exp, "n_expert_used": k}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", type=Path, default=Path(os.environ.get("IE_BIN", REPO / "build" / "inference-engine")))
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=64, help="generation prompt length (tokens)")
    ap.add_argument("--prefill-tokens", type=int, default=256, help="prefill prompt length (tokens)")
    ap.add_argument("--timeout", type=float, default=600, help="per engine run, seconds")
    ap.add_argument("--membw-json", type=Path)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "gptoss.jsonl")
    args = ap.parse_args()

    rec = {"model": args.model.name, "path": str(args.model), "threads": args.threads,
           "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if not args.model.is_file():
        raise SystemExit(f"{args.model} not found (run bench/make_gptoss20b_gguf.py)")
    bpt = bytes_per_token(args.model)
    rec.update(bpt)
    membw, probe = read_membw(args)
    rec["membw_read_gbps_2t"], rec["membw_probe"] = membw, probe
    log(f"membw read_gbps_2t {fmt(membw, '.2f')}; {bpt['bytes_per_token'] / 1e6:.1f} MB/token")

    if args.bin.is_file():
        gen_prompt = prompt_of(args.bin, args.model, args.gen_tokens)
        pre_prompt = prompt_of(args.bin, args.model, args.prefill_tokens)
        log("generation run ...")
        gen = run_engine(args.bin, args.model, gen_prompt, args.max_new, args.threads, "native", args.timeout)
        log("prefill run ...")
        pre = run_engine(args.bin, args.model, pre_prompt, 1, args.threads, "native", args.timeout)
        for r in (gen, pre):
            r.pop("ids", None)  # keep the JSONL record small
        rec["generate"], rec["prefill"] = gen, pre
        dec = gen.get("decode_tps")
        if isinstance(dec, (int, float)) and dec > 0:
            rec["achieved_gbps"] = bpt["bytes_per_token"] * dec / 1e9
            if membw:
                rec["fraction_of_membw"] = rec["achieved_gbps"] / membw
        errs = [e for e in (gen.get("error"), pre.get("error")) if e]
        if errs:
            rec["error"] = "; ".join(errs)
    else:
        rec["error"] = f"inference-engine binary missing ({args.bin})"

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a", encoding="utf-8") as jf:
        jf.write(json.dumps(rec) + "\n")

    g, p = rec.get("generate", {}), rec.get("prefill", {})
    rss = max([x for x in (g.get("rss_peak_mb"), p.get("rss_peak_mb")) if isinstance(x, (int, float))],
              default=None)
    frac = rec.get("fraction_of_membw")
    print(f"model              {rec['model']} ({bpt['tensor_bytes_total'] / 1e9:.2f} GB of tensors)")
    print(f"membw (2t read)    {fmt(membw, '.2f')} GB/s")
    print(f"prompt / new       {fmt(g.get('tokens_in'), 'd')} / {fmt(g.get('tokens_out'), 'd')} tokens; "
          f"prefill run {fmt(p.get('tokens_in'), 'd')} tokens")
    print(f"decode t/s         {fmt(g.get('decode_tps'), '.2f')}")
    print(f"prefill t/s        {fmt(p.get('prefill_tps'), '.2f')} ({fmt(p.get('tokens_in'), 'd')} tokens); "
          f"{fmt(g.get('prefill_tps'), '.2f')} ({fmt(g.get('tokens_in'), 'd')} tokens)")
    print(f"rss_peak_mb        {fmt(rss, '.0f')}")
    print(f"MB per token       {bpt['bytes_per_token'] / 1e6:.1f}  "
          + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in bpt["breakdown"].items()))
    print(f"achieved GB/s      {fmt(rec.get('achieved_gbps'), '.2f')}")
    print(f"fraction of membw  {fmt(frac, '.2f')}")
    if rec.get("error"):
        print(f"ERROR              {rec['error']}")
    log(f"appended to {args.out}")


if __name__ == "__main__":
    main()
