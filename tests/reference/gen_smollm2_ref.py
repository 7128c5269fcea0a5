#!/usr/bin/env python3
"""gen_smollm2_ref.py — transformers reference for the real SmolLM2-135M GGUF.

transformers loads models/SmolLM2-135M-Instruct.Q4_1.gguf itself
(from_pretrained(..., gguf_file=...) dequantizes every tensor to fp32 with
gguf's dequantizer and un-permutes Q/K back to HF layout) and its tokenizer
the same way. For each of five fixed prompts it records:

  prompt_ids        tokens of the prompt (special tokens parsed, no BOS —
                    SmolLM2 adds none)
  cont_ids          greedy continuation (do_sample=False, no repetition
                    penalty, max_new_tokens = the prompt's budget, 32 or more;
                    stops at an end-of-generation id: <|endoftext|> 0 or
                    <|im_end|> 2; the stop id is kept). Every prompt must give
                    at least MIN_CONT = 32 tokens before any end-of-generation
                    id, or the script fails
  topk_ids/vals     [T][50] top-50 logits at every position of
                    prompt_ids + cont_ids (T = len(prompt)+len(cont)), row t =
                    logits after consuming tokens 0..t, from ONE fp32 forward
  last_logits       full [49152] fp32 logits at the last prompt position
  margins           top1 - top2 at each position that predicts a
                    continuation token

into tests/data/smollm2_ref.npz (arrays named p<i>_<field>) plus
tests/data/smollm2_ref.json (prompts, ids, continuations, per-prompt
max_new, versions, decoded continuation text) — human-readable and used by
the run-mode tests.

Checks here: transformers' dequantized weights give the same logits as our
own dequantize + un-permute path (gen_tiny_llama.model_from_gguf) and tied
embeddings are really tied; greedy continuation equals the argmax of the
one-pass forward (teacher forcing reproduces generate()). It also prints how
the continuation behaves under simulated Q8 activation quantization
(the engine's native path) — informative, not stored as truth.

Usage: gen_smollm2_ref.py [--out DIR] [--model PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_tiny_llama as tiny  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TOPK = 50
MAX_NEW = 32       # default generation budget per prompt
MIN_CONT = 32      # every prompt: at least this many tokens before any EOG id
EOG_IDS = [0, 2]   # <|endoftext|>, <|im_end|>

# Picked from ~25 candidates (English prose, numbers, code, chat) for
# well-conditioned greedy continuations: an int8-activation engine cannot be
# expected to reproduce an fp32 argmax whose top1-top2 margin is 0.001, and
# most free-text continuations have such near ties somewhere in 32 tokens.
# These have the largest minimum margins of their kind (printed when run; the
# tests still tolerate near ties, see tests/e2e/test_smollm2_ref.py).
# The chat and Q/A prompts were re-picked from ~100 more candidates so that
# every prompt covers at least MIN_CONT tokens (the earlier "capital of
# France?" / "12 + 30?" answers ended after 8 and 21): both have minimum
# margins above 0.3 and were reproduced token for token by the engine's
# avx512, avx2 and reference kernels when picked.
# (text, max_new): the chat answer ends with <|im_end|> after 35 tokens, so
# it gets a larger budget and the run-mode test also sees an EOS stop.
PROMPTS = [
    # plain English
    ("Photosynthesis is the process by which green plants", MAX_NEW),
    # digits
    ("1, 2, 3, 4, 5, 6, 7, 8,", MAX_NEW),
    # code-like
    ("class Stack:\n    def __init__(self):\n        self.items = []\n\n"
     "    def push(self, item):\n", MAX_NEW),
    # chat formatted (special tokens parsed), a list answer; stops with
    # <|im_end|> after 35 tokens
    ("<|im_start|>user\nWrite a numbered list of the four seasons and describe each."
     "<|im_end|>\n<|im_start|>assistant\n", 48),
    # question / answer, prose answer (runs past 32 tokens)
    ("Question: What is the Pythagorean theorem?\nAnswer:", MAX_NEW),
]


def log(*a):
    print("[gen_smollm2_ref]", *a, file=sys.stderr)


@torch.no_grad()
def full_logits(model, ids) -> np.ndarray:
    x = torch.tensor([list(ids)], dtype=torch.long)
    return model(input_ids=x, use_cache=False).logits[0].float().numpy()


@torch.no_grad()
def greedy(model, ids, max_new) -> list[int]:
    x = torch.tensor([list(ids)], dtype=torch.long)
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                         max_new_tokens=max_new, repetition_penalty=1.0, eos_token_id=EOG_IDS,
                         pad_token_id=2, top_k=None, top_p=None, temperature=None)
    return out[0, len(ids):].tolist()


def strip_eog(ids):
    ids = list(ids)
    while ids and ids[-1] in EOG_IDS:
        ids.pop()
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "data")
    ap.add_argument("--model", type=Path, default=MODEL)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)
    if not args.model.is_file():
        raise SystemExit(f"model not found: {args.model} (run scripts/setup.sh)")

    mdir, mfile = str(args.model.parent), args.model.name
    tok = AutoTokenizer.from_pretrained(mdir, gguf_file=mfile)
    model = AutoModelForCausalLM.from_pretrained(mdir, gguf_file=mfile, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.config
    assert cfg.tie_word_embeddings and \
        model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    n_vocab = cfg.vocab_size

    # Independent check of transformers' GGUF path (dequant + Q/K un-permute).
    ours = tiny.model_from_gguf(args.model, cfg)
    probe = tok("The quick brown fox", add_special_tokens=False)["input_ids"]
    e = tiny.rel_err(full_logits(ours, probe), full_logits(model, probe))
    log(f"transformers GGUF loader vs own dequant/un-permute: rel {e:.2e}")
    if not e <= 1e-5:
        raise SystemExit("transformers' GGUF model differs from our own dequantization")
    del ours

    versions = {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                "gguf": __import__("importlib.metadata").metadata.version("gguf"),
                "numpy": np.__version__}
    arrays = {}
    meta = {"generator": "tests/reference/gen_smollm2_ref.py", "model": MODEL.name,
            "n_vocab": n_vocab, "topk": TOPK, "max_new": MAX_NEW, "min_cont": MIN_CONT,
            "eog_ids": EOG_IDS,
            "versions": versions, "prompts": []}
    for i, (text, max_new) in enumerate(PROMPTS):
        assert max_new >= MIN_CONT
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok(text)["input_ids"] == ids, "SmolLM2 should add no special tokens"
        cont = greedy(model, ids, max_new)
        if len(cont) < MIN_CONT or any(t in EOG_IDS for t in cont[:MIN_CONT]):
            raise SystemExit(f"prompt {i}: greedy continuation has {len(cont)} tokens, "
                             f"ends before {MIN_CONT}: {tok.decode(cont)!r}")
        seq = ids + cont
        lg = full_logits(model, seq)                       # [T][V]
        P = len(ids)
        # Teacher forcing must reproduce generate()'s choices.
        tf = lg[P - 1:P - 1 + len(cont)].argmax(-1).tolist()
        if tf != cont:
            raise SystemExit(f"prompt {i}: one-pass argmax {tf} != generate() {cont}")
        srt = np.sort(lg, axis=-1)
        margins = (srt[:, -1] - srt[:, -2])[P - 1:P - 1 + len(cont)]
        top = np.argsort(-lg, axis=-1, kind="stable")[:, :TOPK].astype(np.int32)
        arrays[f"p{i}_prompt_ids"] = np.array(ids, dtype=np.int32)
        arrays[f"p{i}_cont_ids"] = np.array(cont, dtype=np.int32)
        arrays[f"p{i}_topk_ids"] = top
        arrays[f"p{i}_topk_vals"] = np.take_along_axis(lg, top, axis=-1).astype(np.float32)
        arrays[f"p{i}_last_logits"] = lg[P - 1].astype(np.float32)
        arrays[f"p{i}_margins"] = margins.astype(np.float32)
        sim = tiny.act_quant_sim_logits(model, seq)
        sim_tf = sim[P - 1:P - 1 + len(cont)].argmax(-1)
        n_agree = int((sim_tf == np.array(cont)).sum())
        log(f"prompt {i}: {P} prompt tokens, {len(cont)} generated "
            f"({'stopped at EOG' if cont and cont[-1] in EOG_IDS else 'max_new'}), "
            f"min margin {margins.min():.3f} ({int((margins <= 0.5).sum())} <= 0.5); "
            f"simulated Q8 activations: teacher-forced argmax "
            f"agrees at {n_agree}/{len(cont)}, rel err {tiny.rel_err(sim, lg):.2e}")
        meta["prompts"].append({
            "text": text, "max_new": max_new, "prompt_ids": ids, "cont_ids": cont,
            "cont_text": tok.decode(cont, skip_special_tokens=False),
            # what the run mode's "text" should be: the continuation without
            # its trailing end-of-generation token
            "cont_text_plain": tok.decode(strip_eog(cont), skip_special_tokens=False),
            "min_margin": float(margins.min()),
        })
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    np.savez_compressed(args.out / "smollm2_ref.npz", **arrays)
    (args.out / "smollm2_ref.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    log(f"wrote {args.out / 'smollm2_ref.npz'} ({(args.out / 'smollm2_ref.npz').stat().st_size} bytes)")


if __name__ == "__main__":
    main()
