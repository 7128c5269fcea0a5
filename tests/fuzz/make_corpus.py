#!/usr/bin/env python3
"""make_corpus.py — regenerate the fuzzing seed corpora (tests/fuzz/corpus_*).

Seeds are small valid files written by the reference writers (the `gguf` and
`safetensors` packages from .venv), so the fuzzer starts from inputs that
reach deep into the parsers. Each file stays under 4 KB.

    .venv/bin/python tests/fuzz/make_corpus.py
"""
import os
import struct
import sys

import numpy as np
import gguf
import torch
from safetensors.numpy import save_file as save_np
from safetensors.torch import save_file as save_torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from kquant_np import quantize as kq_quantize  # noqa: E402  (numpy k-quant blocks)

KQ_TYPES = ("Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")


def gguf_file(path, build, version=3):
    w = gguf.GGUFWriter(path, arch="llama")
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version != 3:  # v2 differs from v3 only in the version field
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(struct.pack("<I", version))


def minimal(w):
    w.add_tensor("w", np.arange(4, dtype=np.float32))


def all_types(w):
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "hello")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 2.25)
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_str", ["a", "bc", ""])
    w.add_array("t.arr_f32", [0.5, -1.0])
    w.add_tensor("w.f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("w.f16", np.arange(8, dtype=np.float16))
    q8 = np.arange(2 * 2 * 34, dtype=np.uint8).reshape(2, 2 * 34)  # 2 rows of 64 q8_0 elements
    w.add_tensor("w.q8_0", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    q41 = np.arange(3 * 20, dtype=np.uint8).reshape(3, 20)
    w.add_tensor("w.q4_1", q41, raw_dtype=gguf.GGMLQuantizationType.Q4_1)


def tiny_llama_meta_kv(w, n_embd):
    w.add_name("tiny")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_custom_alignment(64)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b"])
    w.add_array("tokenizer.ggml.token_type", [3, 3, 1, 1])


def tiny_llama_meta(w):
    tiny_llama_meta_kv(w, 32)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float16))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))


def kquants(w):
    """One 1 x 256 tensor of every k-quant type this engine computes, valid
    blocks of a ramp (q8_K, activation-only, the grid i-quants and tq2_0,
    uncomputed, as raw bytes of their block sizes)."""
    x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(1, 256)
    for name in KQ_TYPES:
        qt = gguf.GGMLQuantizationType[name]
        q = kq_quantize(x, qt)
        w.add_tensor(f"w.{name.lower()}", q, raw_shape=q.shape, raw_dtype=qt)
    w.add_tensor("w.q8_k", np.zeros((1, 292), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_K)
    for name, nb in (("IQ2_XXS", 66), ("IQ2_XS", 74), ("IQ2_S", 82), ("IQ3_XXS", 98), ("IQ3_S", 110),
                     ("IQ1_S", 50), ("IQ1_M", 56), ("TQ2_0", 66)):
        w.add_tensor(f"w.{name.lower()}", np.zeros((1, nb), dtype=np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType[name])


def kquant_llama(w):
    """tiny_llama_meta's header with a k-quant embedding (2 rows of 256)."""
    tiny_llama_meta_kv(w, 256)
    w.add_tensor("token_embd.weight", kq_quantize(np.ones((4, 256), dtype=np.float32), gguf.GGMLQuantizationType.Q4_K),
                 raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("output.weight", kq_quantize(np.ones((4, 256), dtype=np.float32), gguf.GGMLQuantizationType.Q6_K),
                 raw_dtype=gguf.GGMLQuantizationType.Q6_K)


def main():
    gdir = os.path.join(HERE, "corpus_gguf")
    sdir = os.path.join(HERE, "corpus_safetensors")
    os.makedirs(gdir, exist_ok=True)
    os.makedirs(sdir, exist_ok=True)
    gguf_file(os.path.join(gdir, "minimal.gguf"), minimal)
    gguf_file(os.path.join(gdir, "all_types.gguf"), all_types)
    gguf_file(os.path.join(gdir, "tiny_llama_v2.gguf"), tiny_llama_meta, version=2)
    gguf_file(os.path.join(gdir, "kquant_types.gguf"), kquants)
    gguf_file(os.path.join(gdir, "kquant_llama.gguf"), kquant_llama)

    save_np({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, os.path.join(sdir, "single.safetensors"))
    save_np({"f32": np.ones((2, 2), dtype=np.float32), "f16": np.ones(3, dtype=np.float16),
             "i64": np.arange(2, dtype=np.int64), "u8": np.zeros((0, 4), dtype=np.uint8),
             "bool": np.array([True, False])},
            os.path.join(sdir, "mixed.safetensors"), metadata={"format": "np"})
    save_torch({"model.layers.0.self_attn.q_proj.weight": torch.ones(4, 4, dtype=torch.bfloat16),
                "scalar": torch.tensor(3.0)},
               os.path.join(sdir, "bf16.safetensors"), metadata={"format": "pt"})

    for d in (gdir, sdir):
        for f in sorted(os.listdir(d)):
            size = os.path.getsize(os.path.join(d, f))
            print(f"{d}/{f}: {size} bytes")
            if size >= 4096:
                sys.exit(f"{f} is too large for a seed")


if __name__ == "__main__":
    main()
