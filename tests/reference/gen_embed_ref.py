#!/usr/bin/env python3
"""Generate tests/data/embed/ref.npz: the reference for /v1/embeddings.

transformers, at f32, on the tiny Llama fixture (tests/data/tiny_llama, HF
dir): the final-norm hidden states (LlamaModel's last_hidden_state, the
head's input) of a few token-id sequences, and their pooled vectors:

  ids_<k>       int32 [n]       the sequence (k = 0..3)
  hidden_<k>    float32 [n][64] last_hidden_state
  mean_<k>      float32 [64]    mean over the positions, L2-normalized
  last_<k>      float32 [64]    the last position's, L2-normalized
  cls_<k>       float32 [64]    the first position's, L2-normalized
  mean_raw_<k>  float32 [64]    the mean, not normalized (--embd-normalize -1)

Run from the repository root with the reference stack (torch, transformers):
    .venv/bin/python tests/reference/gen_embed_ref.py [--out DIR]
(DIR defaults to tests/data; the file goes to DIR/embed/ref.npz.)
Deterministic: no randomness, a second on one core.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoModelForCausalLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEQS = [
    [1, 17, 300, 42, 7, 511, 99, 250],
    [1, 5],
    [1, 400, 2, 64, 128, 3, 77, 200, 310, 11, 12, 13, 450, 8, 9, 60, 61, 62, 63],
    [250],
]


def l2(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v.astype(np.float64))).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests" / "data"))
    out = Path(ap.parse_args().out) / "embed"
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(ROOT / "tests" / "data" / "tiny_llama", dtype=torch.float32)
    model.eval()
    arrays = {}
    with torch.no_grad():
        for k, ids in enumerate(SEQS):
            h = model.model(torch.tensor([ids])).last_hidden_state[0].numpy().astype(np.float32)
            mean = h.astype(np.float64).mean(axis=0).astype(np.float32)
            arrays[f"ids_{k}"] = np.array(ids, dtype=np.int32)
            arrays[f"hidden_{k}"] = h
            arrays[f"mean_{k}"] = l2(mean)
            arrays[f"last_{k}"] = l2(h[-1])
            arrays[f"cls_{k}"] = l2(h[0])
            arrays[f"mean_raw_{k}"] = mean
    np.savez(out / "ref.npz", **arrays)
    print(f"wrote {out / 'ref.npz'}")


if __name__ == "__main__":
    main()
