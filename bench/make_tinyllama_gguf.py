#!/usr/bin/env python3
"""make_tinyllama_gguf.py — TinyLlama-1.1B-shaped random-weight GGUFs for benchmarks.

Writes models/bench/tinyllama-{f16,q8_0,q4_0}.gguf (by default; bf16 on request):
22 layers, hidden 2048, 32 heads / 4 KV heads (head dim 64), FFN 5632,
vocab 32000, RoPE theta 10000, RMS eps 1e-5, untied output, context 2048.
Weights are N(0, 0.02) (norms 1.0), generated tensor by tensor from a fixed
seed, so every file holds the same model up to its quantization. 2-D weights
(token_embd and output included) are stored in the file's type, norms F32,
quantized with the gguf package's own quantizer. The Llama-2 SentencePiece
vocabulary (tokenizer.ggml.*) is copied from tests/data/ggml-vocab-llama-spm.gguf
so prompts tokenize.

The output is meaningless text: these files exist to measure speed (bytes
streamed per token), not quality.

Idempotent: an existing output file is left alone (delete it to rebuild).
Files are written to NAME.partial and renamed when complete. Peak memory is
about one f32 tensor (260 MB) plus its encodings — well under 1 GB.

Usage: bench/make_tinyllama_gguf.py [--out DIR] [--types f16,bf16,q8_0,q4_0] [--seed N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

REPO = Path(__file__).resolve().parents[1]
VOCAB_GGUF = REPO / "tests" / "data" / "ggml-vocab-llama-spm.gguf"

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB, N_CTX = 22, 2048, 32, 4, 5632, 32000, 2048
HEAD_DIM = N_EMBD // N_HEAD
STD = 0.02
TYPES = {"f16": (QT.F16, 1), "bf16": (QT.BF16, 32), "q8_0": (QT.Q8_0, 7), "q4_0": (QT.Q4_0, 2)}


def log(*a):
    print("[make_tinyllama_gguf]", *a, file=sys.stderr, flush=True)


def tensor_plan():
    """(name, numpy shape [rows, cols] or [n]) in llama.cpp's converter order."""
    plan = [("token_embd.weight", (N_VOCAB, N_EMBD))]
    kv = N_HEAD_KV * HEAD_DIM
    for i in range(N_LAYER):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (N_EMBD,)),
            (b + "attn_q.weight", (N_EMBD, N_EMBD)),
            (b + "attn_k.weight", (kv, N_EMBD)),
            (b + "attn_v.weight", (kv, N_EMBD)),
            (b + "attn_output.weight", (N_EMBD, N_EMBD)),
            (b + "ffn_norm.weight", (N_EMBD,)),
            (b + "ffn_gate.weight", (N_FF, N_EMBD)),
            (b + "ffn_up.weight", (N_FF, N_EMBD)),
            (b + "ffn_down.weight", (N_EMBD, N_FF)),
        ]
    plan += [("output_norm.weight", (N_EMBD,)), ("output.weight", (N_VOCAB, N_EMBD))]
    return plan


def nbytes_of(shape, qtype: QT) -> int:
    n = int(np.prod(shape))
    if len(shape) == 1 or qtype == QT.F32:
        return 4 * n
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert shape[-1] % block == 0
    return n // block * size


def encode(a: np.ndarray, qtype: QT) -> np.ndarray:
    if a.ndim == 1:
        return a.astype(np.float32)
    if qtype == QT.F16:
        return a.astype(np.float16)
    return gguf.quants.quantize(a, qtype)


def copy_vocab(w: gguf.GGUFWriter, vocab_path: Path):
    r = gguf.GGUFReader(str(vocab_path))
    n = 0
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, list(f.contents()), t, sub_type=f.types[1])
        else:
            w.add_key_value(key, f.contents(), t)
        n += 1
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    if len(tokens) != N_VOCAB:
        raise SystemExit(f"{vocab_path}: {len(tokens)} tokens, expected {N_VOCAB}")
    log(f"copied {n} tokenizer keys from {vocab_path.name}")


def open_writer(path: Path, ftype: int, qtype: QT, plan, vocab_path: Path) -> gguf.GGUFWriter:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"tinyllama-1.1b-random-{path.stem.split('-')[-1].replace('.partial', '')}")
    w.add_type("model")
    w.add_uint32("llama.context_length", N_CTX)
    w.add_uint32("llama.embedding_length", N_EMBD)
    w.add_uint32("llama.block_count", N_LAYER)
    w.add_uint32("llama.feed_forward_length", N_FF)
    w.add_uint32("llama.rope.dimension_count", HEAD_DIM)
    w.add_uint32("llama.attention.head_count", N_HEAD)
    w.add_uint32("llama.attention.head_count_kv", N_HEAD_KV)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_uint32("general.file_type", ftype)
    w.add_uint32("llama.vocab_size", N_VOCAB)
    w.add_uint32("general.quantization_version", 2)
    copy_vocab(w, vocab_path)
    for name, shape in plan:
        tq = QT.F32 if len(shape) == 1 else qtype
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes_of(shape, tq),
                          raw_dtype=tq)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "models" / "bench")
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--vocab", type=Path, default=VOCAB_GGUF)
    args = ap.parse_args()
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    for t in types:
        if t not in TYPES:
            raise SystemExit(f"unknown type {t!r} (have {', '.join(TYPES)})")
    args.out.mkdir(parents=True, exist_ok=True)
    todo = []
    for t in types:
        final = args.out / f"tinyllama-{t}.gguf"
        if final.exists():
            log(f"{final} exists, skipping")
            continue
        todo.append((t, final))
    if not todo:
        return
    if not args.vocab.is_file():
        raise SystemExit(f"vocab GGUF not found: {args.vocab}")

    plan = tensor_plan()
    writers = []
    for t, final in todo:
        qtype, ftype = TYPES[t]
        partial = final.with_name(final.name + ".partial")
        writers.append((t, final, partial, qtype, open_writer(partial, ftype, qtype, plan, args.vocab)))
    t0 = time.time()
    n_params = 0
    for k, (name, shape) in enumerate(plan):
        rng = np.random.default_rng([args.seed, k])
        if len(shape) == 1:
            a = np.ones(shape, dtype=np.float32)
        else:
            a = rng.standard_normal(shape, dtype=np.float32)
            a *= STD
        n_params += a.size
        for t, final, partial, qtype, w in writers:
            w.write_tensor_data(encode(a, qtype))
        del a
        if k % 27 == 0:
            log(f"{k + 1}/{len(plan)} tensors, {time.time() - t0:.0f}s")
    for t, final, partial, qtype, w in writers:
        w.close()
        os.replace(partial, final)
        log(f"wrote {final} ({final.stat().st_size / 1e9:.2f} GB)")
    log(f"{n_params / 1e9:.3f}B parameters, {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
