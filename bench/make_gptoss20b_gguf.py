#!/usr/bin/env python3
"""make_gptoss20b_gguf.py — a GPT-OSS-20B-shaped GGUF with random weights.

Writes models/bench/gptoss-20b-mxfp4.gguf laid out as llama.cpp's converter
writes openai/gpt-oss-20b (docs/GPTOSS.md §1, §3.3; same keys and tensor names
as tests/reference/gen_tiny_gptoss.py):

  arch "gpt-oss", 24 layers, hidden 2880, 64 query heads / 8 KV heads of dim
  64, vocab 201088, 32 experts top-4, expert FFN 2880, sliding window 128
  (even layers; llama.cpp has no layer-type key), YaRN factor 32 / original
  context 4096 / theta 150000, context 131072, RMS eps 1e-5.

  experts (ffn_{gate,up,down}_exps.weight)  MXFP4, ggml block_mxfp4 (17 bytes
      per 32 elements: e byte then 16 code bytes). Random codes, e uniform in
      118..123, so values are ~1e-2 (2^-9..2^-4 times E2M1 in [-6, 6]).
  attention q/k/v/o, router, token_embd, output   BF16, N(0, 0.02)
  norms F32 1 + N(0, 0.02); biases F32 N(0, 0.01); sinks F32 N(0, 0.5)

Vocabulary: o200k_harmony as a GGUF "gpt2" vocabulary, built from
tests/data/o200k_base.tiktoken + tests/data/o200k_harmony_special_tokens.json:
tokens as GPT-2 byte-level (bytes_to_unicode) strings, special tokens as
written with type CONTROL, merges derived from the tiktoken ranks (token of
rank r = the two parts that BPE over ranks < r leaves, the standard
derivation used by HF's tiktoken converter), tokenizer.ggml.pre "gpt-4o",
bos <|startoftext|>, eos <|return|>, eot <|end|>, padding <|endoftext|>,
add_bos false.

The weights are meaningless: the file exists to measure speed (bytes
streamed per token), not quality. About 13.8 GB.

Memory: tensors are generated and written one at a time (add_tensor_info up
front, write_tensor_data per tensor), the largest being token_embd / output
(1.16 GB as BF16, produced in row chunks) — peak RSS is printed at the end.

Idempotent: an existing, valid output (GGUF parses, right tensor count, last
tensor ends at the file's end) is left alone; delete it to rebuild. The file
is written to NAME.partial and renamed when complete.

Usage: bench/make_gptoss20b_gguf.py [--out FILE] [--seed N] [--force]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

REPO = Path(__file__).resolve().parents[1]
TIKTOKEN = REPO / "tests" / "data" / "o200k_base.tiktoken"
SPECIALS = REPO / "tests" / "data" / "o200k_harmony_special_tokens.json"
DEFAULT_OUT = REPO / "models" / "bench" / "gptoss-20b-mxfp4.gguf"

A = "gpt-oss"
N_LAYER, H, N_HEAD, N_HEAD_KV, HEAD_DIM = 24, 2880, 64, 8, 64
N_VOCAB, N_EXPERT, N_EXPERT_USED, N_FF = 201088, 32, 4, 2880
SWA, N_CTX, ROPE_THETA = 128, 131072, 150000.0
YARN_FACTOR, YARN_ORIG = 32.0, 4096
STD = 0.02
E_LO, E_HI = 118, 123          # MXFP4 E8M0 exponent bytes (inclusive)
MX_BLOCK, MX_BYTES = 32, 17


def log(*a):
    print("[make_gptoss20b_gguf]", *a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ tensors
def tensor_plan():
    """(name, numpy shape [.., rows, cols], qtype) in llama.cpp's order."""
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    plan = [("token_embd.weight", (N_VOCAB, H), QT.BF16)]
    for i in range(N_LAYER):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (H,), QT.F32),
            (b + "attn_q.weight", (q, H), QT.BF16),
            (b + "attn_q.bias", (q,), QT.F32),
            (b + "attn_k.weight", (kv, H), QT.BF16),
            (b + "attn_k.bias", (kv,), QT.F32),
            (b + "attn_v.weight", (kv, H), QT.BF16),
            (b + "attn_v.bias", (kv,), QT.F32),
            (b + "attn_output.weight", (H, q), QT.BF16),
            (b + "attn_output.bias", (H,), QT.F32),
            (b + "attn_sinks.weight", (N_HEAD,), QT.F32),
            (b + "post_attention_norm.weight", (H,), QT.F32),
            (b + "ffn_gate_inp.weight", (N_EXPERT, H), QT.BF16),
            (b + "ffn_gate_inp.bias", (N_EXPERT,), QT.F32),
            (b + "ffn_gate_exps.weight", (N_EXPERT, N_FF, H), QT.MXFP4),
            (b + "ffn_up_exps.weight", (N_EXPERT, N_FF, H), QT.MXFP4),
            (b + "ffn_down_exps.weight", (N_EXPERT, H, N_FF), QT.MXFP4),
            (b + "ffn_gate_exps.bias", (N_EXPERT, N_FF), QT.F32),
            (b + "ffn_up_exps.bias", (N_EXPERT, N_FF), QT.F32),
            (b + "ffn_down_exps.bias", (N_EXPERT, H), QT.F32),
        ]
    plan += [("output_norm.weight", (H,), QT.F32), ("output.weight", (N_VOCAB, H), QT.BF16)]
    return plan


def nbytes_of(shape, qt: QT) -> int:
    n = int(np.prod(shape))
    if qt == QT.F32:
        return 4 * n
    if qt == QT.BF16:
        return 2 * n
    assert qt == QT.MXFP4 and shape[-1] % MX_BLOCK == 0
    return n // MX_BLOCK * MX_BYTES


def bf16_random(rng, shape, std, chunk_rows=16384) -> np.ndarray:
    """N(0, std) as BF16 bits (uint16, round to nearest even), row chunks."""
    rows = int(np.prod(shape[:-1]))
    out = np.empty((rows, shape[-1]), np.uint16)
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        a = rng.standard_normal((r1 - r0, shape[-1]), dtype=np.float32)
        a *= std
        u = a.view(np.uint32)
        u += 0x7FFF + ((u >> 16) & 1)       # RNE (no NaN/Inf here)
        out[r0:r1] = (u >> 16).astype(np.uint16)
        del a, u
    return out.reshape(shape)


def mxfp4_random(rng, shape) -> np.ndarray:
    """Random block_mxfp4 bytes: [.., rows, cols/32*17] uint8."""
    nblk = int(np.prod(shape)) // MX_BLOCK
    b = np.frombuffer(rng.bytes(nblk * MX_BYTES), np.uint8).reshape(nblk, MX_BYTES).copy()
    b[:, 0] = E_LO + b[:, 0] % (E_HI - E_LO + 1)
    return b.reshape(*shape[:-1], shape[-1] // MX_BLOCK * MX_BYTES)


def make_tensor(rng, name: str, shape, qt: QT) -> np.ndarray:
    if qt == QT.MXFP4:
        return mxfp4_random(rng, shape)
    if qt == QT.BF16:
        return bf16_random(rng, shape, STD)
    if name.endswith("norm.weight"):
        return (1.0 + STD * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("attn_sinks.weight"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    assert name.endswith(".bias"), name
    return (0.01 * rng.standard_normal(shape)).astype(np.float32)


# --------------------------------------------------------------- tokenizer
def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def load_tiktoken(path: Path) -> dict[bytes, int]:
    import base64
    ranks = {}
    for line in path.read_bytes().splitlines():
        if not line:
            continue
        tok, r = line.split()
        ranks[base64.b64decode(tok)] = int(r)
    return ranks


def bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """BPE of token using only merges of rank < max_rank (lowest rank first)."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best_i, best_r = -1, max_rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_r:
                best_i, best_r = i, r
        if best_i < 0:
            break
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def build_vocab() -> dict:
    t0 = time.time()
    ranks = load_tiktoken(TIKTOKEN)
    spec = json.loads(SPECIALS.read_text())
    n_vocab = int(spec["n_vocab"])
    specials = {int(i): s for s, i in spec["special_tokens"].items()}
    n_base = len(ranks)
    assert sorted(ranks.values()) == list(range(n_base)), "tiktoken ranks not dense"
    assert set(specials) == set(range(n_base, n_vocab)), "special ids do not fill the vocab"
    b2u = bytes_to_unicode()
    tokens = [""] * n_vocab
    types = [0] * n_vocab
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    merges = []
    bad = 0
    for tok, r in by_rank:
        tokens[r] = "".join(b2u[b] for b in tok)
        types[r] = int(gguf.TokenType.NORMAL)
        if len(tok) < 2:
            continue
        p = bpe_parts(ranks, tok, r)
        if len(p) != 2:
            bad += 1
            continue
        merges.append("".join(b2u[b] for b in p[0]) + " " + "".join(b2u[b] for b in p[1]))
    if bad:
        raise SystemExit(f"{bad} multi-byte tokens have no two-part BPE derivation")
    for i, s in specials.items():
        tokens[i] = s
        types[i] = int(gguf.TokenType.CONTROL)
    ids = {s: i for i, s in specials.items()}
    log(f"vocab: {n_base} BPE tokens + {len(specials)} special, {len(merges)} merges, "
        f"{time.time() - t0:.1f}s")
    return {"tokens": tokens, "types": types, "merges": merges,
            "bos": ids["<|startoftext|>"], "eos": ids["<|return|>"],
            "eot": ids["<|end|>"], "pad": ids["<|endoftext|>"]}


# ------------------------------------------------------------------ writer
def is_valid(path: Path) -> tuple[bool, str]:
    try:
        r = gguf.GGUFReader(str(path))
    except Exception as e:          # noqa: BLE001
        return False, f"unreadable ({e})"
    plan = tensor_plan()
    if len(r.tensors) != len(plan):
        return False, f"{len(r.tensors)} tensors, expected {len(plan)}"
    arch = r.fields.get("general.architecture")
    if arch is None or arch.contents() != A:
        return False, "not gpt-oss"
    last = max(r.tensors, key=lambda t: int(t.data_offset))
    end = int(last.data_offset) + int(last.n_bytes)
    size = path.stat().st_size
    if end > size:
        return False, f"truncated ({size} < {end})"
    return True, f"{size / 1e9:.2f} GB, {len(r.tensors)} tensors"


def add_metadata(w, name: str, vocab: dict, *, n_layer: int, n_ctx: int, hidden: int, n_ff: int, n_head: int,
                 n_head_kv: int, head_dim: int, n_expert: int, n_expert_used: int, swa: int):
    """The gpt-oss GGUF keys (as llama.cpp's converter writes them, YaRN as
    the release) and the o200k_harmony vocabulary from build_vocab(). Shared
    with tests/e2e/test_chat_harmony.py, which writes a tiny model."""
    w.add_name(name)
    w.add_type("model")
    w.add_uint32(f"{A}.block_count", n_layer)
    w.add_uint32(f"{A}.context_length", n_ctx)
    w.add_uint32(f"{A}.embedding_length", hidden)
    w.add_uint32(f"{A}.feed_forward_length", n_ff)
    w.add_uint32(f"{A}.attention.head_count", n_head)
    w.add_uint32(f"{A}.attention.head_count_kv", n_head_kv)
    w.add_float32(f"{A}.rope.freq_base", ROPE_THETA)
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{A}.expert_count", n_expert)
    w.add_uint32(f"{A}.expert_used_count", n_expert_used)
    w.add_uint32(f"{A}.attention.key_length", head_dim)
    w.add_uint32(f"{A}.attention.value_length", head_dim)
    w.add_string(f"{A}.rope.scaling.type", "yarn")
    w.add_float32(f"{A}.rope.scaling.factor", YARN_FACTOR)
    w.add_uint32(f"{A}.rope.scaling.original_context_length", YARN_ORIG)
    w.add_float32(f"{A}.rope.scaling.yarn_beta_fast", 32.0)
    w.add_float32(f"{A}.rope.scaling.yarn_beta_slow", 1.0)
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE))
    w.add_uint32(f"{A}.attention.sliding_window", swa)
    w.add_uint32(f"{A}.expert_feed_forward_length", n_ff)
    w.add_uint32(f"{A}.vocab_size", len(vocab["tokens"]))
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "gpt-4o")
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    w.add_uint32("tokenizer.ggml.bos_token_id", vocab["bos"])
    w.add_uint32("tokenizer.ggml.eos_token_id", vocab["eos"])
    w.add_uint32("tokenizer.ggml.eot_token_id", vocab["eot"])
    w.add_uint32("tokenizer.ggml.padding_token_id", vocab["pad"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_uint32("general.quantization_version", 2)


def write(path: Path, seed: int):
    plan = tensor_plan()
    vocab = build_vocab()
    partial = path.with_name(path.name + ".partial")
    w = gguf.GGUFWriter(str(partial), A)
    add_metadata(w, "gpt-oss-20b-random-mxfp4", vocab, n_layer=N_LAYER, n_ctx=N_CTX, hidden=H, n_ff=N_FF,
                 n_head=N_HEAD, n_head_kv=N_HEAD_KV, head_dim=HEAD_DIM, n_expert=N_EXPERT,
                 n_expert_used=N_EXPERT_USED, swa=SWA)
    del vocab
    total = 0
    for name, shape, qt in plan:
        nb = nbytes_of(shape, qt)
        total += nb
        w.add_tensor_info(name, shape, np.dtype(np.float32), nb, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    log(f"{len(plan)} tensors, {total / 1e9:.2f} GB of tensor data")
    t0 = time.time()
    done = 0
    for k, (name, shape, qt) in enumerate(plan):
        rng = np.random.default_rng([seed, k])
        a = make_tensor(rng, name, shape, qt)
        assert a.nbytes == nbytes_of(shape, qt), name
        w.write_tensor_data(a)
        done += a.nbytes
        del a
        if k % 19 == 0 or k == len(plan) - 1:
            log(f"{k + 1}/{len(plan)} tensors, {done / 1e9:.2f} GB, {time.time() - t0:.0f}s")
    w.close()
    os.replace(partial, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--force", action="store_true", help="rebuild even if a valid file exists")
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.exists() and not args.force:
        ok, why = is_valid(args.out)
        if ok:
            log(f"{args.out} exists and is valid ({why}), skipping")
            return
        log(f"{args.out} exists but is not valid ({why}); rebuilding")
    t0 = time.time()
    write(args.out, args.seed)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log(f"wrote {args.out} ({args.out.stat().st_size / 1e9:.2f} GB) in {time.time() - t0:.0f}s, "
        f"peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()
