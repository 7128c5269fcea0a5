#!/usr/bin/env python3
"""KV cache types against the f32 cache (docs/KVCACHE.md, "Quality"):
KL divergence of the next-token distribution and top-1 agreement over the
first N tokens of a text, each cache type's logits (inference-engine logits
--precision f32 --cache-type-k T --cache-type-v T --kv-rotate R) against
the f32 cache's.

usage: kv_quality.py --bin build/inference-engine --model M --text FILE
                     [--tokens 512] [--threads 2] [--mode prefill|decode] [TYPE:ROTATE ...]
Prints one JSON line per configuration.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def logits(args, ids, extra, out):
    cmd = [args.bin, "logits", "--model", args.model, "--ids", ",".join(map(str, ids)), "--out", out,
           "--precision", "f32", "--threads", str(args.threads), "--mode", args.mode, *extra]
    cp = subprocess.run(cmd, capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])}...: {cp.stderr.strip()}")
    meta = json.loads(cp.stdout.strip().splitlines()[-1])
    return np.fromfile(out, dtype="<f4").reshape(meta["n_tokens"], meta["n_vocab"])


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=["prefill", "decode"], default="prefill",
                    help="decode: one token a step, attention through the typed-cache kernels")
    ap.add_argument("configs", nargs="*", default=["q8:on", "fp8_e4m3:on", "q4:on", "q4:off"])
    args = ap.parse_args()
    with open(args.text, "rb") as f:
        cp = subprocess.run([args.bin, "tokenize", "--tokenizer", args.model], input=f.read(),
                            capture_output=True)
    ids = json.loads(cp.stdout.decode().strip().splitlines()[0])["ids"][: args.tokens]
    with tempfile.TemporaryDirectory() as d:
        ref = log_softmax(logits(args, ids, [], os.path.join(d, "ref.bin")))
        nll_ref = -ref[np.arange(len(ids) - 1), ids[1:]].mean()
        for c in args.configs:
            t, rot = c.split(":")
            got = log_softmax(logits(args, ids, ["--cache-type-k", t, "--cache-type-v", t, "--kv-rotate", rot],
                                     os.path.join(d, "got.bin")))
            kl = (np.exp(ref) * (ref - got)).sum(axis=1)
            nll = -got[np.arange(len(ids) - 1), ids[1:]].mean()
            print(json.dumps({"mode": args.mode, "type": t, "rotate": rot, "tokens": len(ids), "kl_mean": float(kl.mean()),
                              "kl_p99": float(np.percentile(kl, 99)),
                              "top1_agree": float((ref.argmax(1) == got.argmax(1)).mean()),
                              "dppl_pct": float((np.exp(nll - nll_ref) - 1) * 100)}), flush=True)


if __name__ == "__main__":
    main()
