#!/usr/bin/env python3
"""gen_ppl_ref.py — transformers reference perplexity of SmolLM2 on an Austen excerpt.

The excerpt is a fixed byte range of tests/data/corpus/austen_1.txt (Emma,
from "Emma Woodhouse, handsome, clever, and rich" on, cut at the end of a
line). Its perplexity is computed exactly as `inference-engine perplexity`
does (apps/cli/cli_eval.c, llama.cpp's method):

  ids      tokens of the whole excerpt, no BOS/EOS added (SmolLM2's
           tokenizer adds none; a tokenizer that adds BOS would get it as the
           first token of every window instead, as the CLI does)
  windows  non-overlapping windows of CTX tokens, ids[w*CTX:(w+1)*CTX], the
           first CHUNKS of them; each window is one forward pass from an
           empty cache
  scored   in each window positions p = CTX/2 .. CTX-2, the log-probability
           of ids[p+1] under the logits at p (float64 log-softmax of the fp32
           logits)
  ppl      exp(mean NLL over all scored positions)

Tokenization: Hugging Face `tokenizers` on tests/data/smollm2_tokenizer.json
(the same vocabulary and merges as the GGUF; the tokenizer tests check our
tokenizer against it). The model: transformers loads the GGUF itself
(from_pretrained(..., gguf_file=...)), dequantized to fp32, eager attention.
As a cross-check the script also tokenizes with transformers' GGUF tokenizer
and requires the same ids.

Writes tests/data/smollm2_ppl_ref.json: the excerpt's byte range and sha256,
ids, CTX, CHUNKS, the scored count, per-window mean NLL, total mean NLL and
ppl, and library versions. tests/e2e/test_perplexity.py compares the CLI
with it.

Usage: gen_ppl_ref.py [--out DIR] [--model PATH]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS = REPO / "tests" / "data" / "corpus" / "austen_1.txt"
TOKENIZER = REPO / "tests" / "data" / "smollm2_tokenizer.json"
START_TEXT = b"Emma Woodhouse, handsome, clever, and rich"
MIN_BYTES = 6000   # then up to the end of that line: > 8 windows of 128 tokens
CTX = 128
CHUNKS = 8


def log(*a):
    print("[gen_ppl_ref]", *a, file=sys.stderr)


def excerpt_range(data: bytes) -> tuple[int, int]:
    start = data.index(START_TEXT)
    end = data.index(b"\n", start + MIN_BYTES) + 1
    return start, end


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "data")
    ap.add_argument("--model", type=Path, default=MODEL)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)
    for p, what in ((args.model, "model (run scripts/setup.sh)"), (CORPUS, "corpus"), (TOKENIZER, "tokenizer")):
        if not p.is_file():
            raise SystemExit(f"{what} not found: {p}")

    data = CORPUS.read_bytes()
    start, end = excerpt_range(data)
    excerpt = data[start:end]
    text = excerpt.decode("utf-8")

    tk = Tokenizer.from_file(str(TOKENIZER))
    ids = tk.encode(text, add_special_tokens=False).ids
    # the CLI's rule: BOS per window only if encoding with special tokens adds it
    with_special = tk.encode("a", add_special_tokens=True).ids
    plain = tk.encode("a", add_special_tokens=False).ids
    add_bos = len(with_special) > len(plain) and with_special[1:] == plain
    bos = with_special[0] if add_bos else None
    log(f"excerpt bytes [{start}, {end}) = {end - start} bytes, {len(ids)} tokens, add_bos={add_bos}")

    mdir, mfile = str(args.model.parent), args.model.name
    hf_tok = AutoTokenizer.from_pretrained(mdir, gguf_file=mfile)
    ids_gguf = hf_tok(text, add_special_tokens=False)["input_ids"]
    if ids_gguf != ids:
        raise SystemExit("tokenizer.json and transformers' GGUF tokenizer disagree on the excerpt")

    n_win = len(ids) // CTX
    if n_win < CHUNKS:
        raise SystemExit(f"excerpt too short: {n_win} windows of {CTX} < {CHUNKS}")
    n_win = CHUNKS

    model = AutoModelForCausalLM.from_pretrained(mdir, gguf_file=mfile, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    first = CTX // 2
    win_nll = []
    total = 0.0
    scored = 0
    with torch.no_grad():
        for w in range(n_win):
            win = list(ids[w * CTX:(w + 1) * CTX])
            inp = list(win)
            if add_bos:
                inp[0] = bos
            logits = model(torch.tensor([inp])).logits[0].to(torch.float64)   # [CTX][vocab]
            logp = torch.log_softmax(logits, dim=-1)
            pos = torch.arange(first, CTX - 1)
            tgt = torch.tensor(win[first + 1:CTX])
            nll = -logp[pos, tgt]
            win_nll.append(float(nll.mean()))
            total += float(nll.sum())
            scored += len(pos)
            log(f"window {w}: mean nll {win_nll[-1]:.6f}")
    mean_nll = total / scored
    ppl = math.exp(mean_nll)
    log(f"ppl {ppl:.6f} over {scored} scored tokens (mean nll {mean_nll:.6f})")

    versions = {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                "tokenizers": __import__("tokenizers").__version__,
                "gguf": __import__("importlib.metadata").metadata.version("gguf"),
                "numpy": np.__version__}
    ref = {
        "model": args.model.name,
        "corpus": str(CORPUS.relative_to(REPO)),
        "byte_start": start,
        "byte_end": end,
        "sha256": hashlib.sha256(excerpt).hexdigest(),
        "ctx": CTX,
        "chunks": n_win,
        "add_bos": add_bos,
        "n_ids": len(ids),
        "scored": scored,
        "ppl": ppl,
        "nll": mean_nll,
        "window_nll": win_nll,
        "ids": ids,
        "versions": versions,
    }
    (args.out / "smollm2_ppl_ref.json").write_text(json.dumps(ref, indent=1) + "\n")
    log(f"wrote {args.out / 'smollm2_ppl_ref.json'}")


if __name__ == "__main__":
    main()
