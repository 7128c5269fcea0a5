#!/usr/bin/env python3
"""make_iquant_gguf.py — TinyLlama-1.1B-shaped GGUFs in the grid i-quants,
for speed only (bench/bench_iquant.py).

From models/bench/tinyllama-q4_0.gguf (random weights, made by
bench/make_tinyllama_gguf.py): every layer's 2-D weight (attention and FFN)
becomes random blocks of TYPE with d chosen so the values have rms ~0.02;
token_embd and output stay Q4_0 (llama-quantize's mixes give the head more
bits too). Any bytes are a valid i-quant block once d is finite, and the
kernels' speed does not depend on the values; the text is meaningless.

    models/bench/iquant/tinyllama-<TYPE>.gguf   (kept if present)

Usage: make_iquant_gguf.py [--types iq2_xxs,iq3_s,...] [--src FILE] [--out DIR]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "reference"))
from gguf_rewrite import IQ, copy_keys, set_iq_d  # noqa: E402  (name -> (ggml type, block bytes, ftype))


def random_blocks(name, rows, cols, rng):
    qt, bb, _ = IQ[name]
    blk = rng.integers(0, 256, size=(rows * cols // 256, bb), dtype=np.uint8)
    set_iq_d(name, blk, 0x3C00)
    probe = gguf.quants.dequantize(blk[:64], qt)  # the values' rms at d = 1
    d = 0.02 / float(np.sqrt(np.mean(probe.astype(np.float64) ** 2)))
    set_iq_d(name, blk, int(np.float16(d).view(np.uint16)))
    return blk.reshape(rows, -1), qt


def make(src, dst, name, seed):
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst) + ".partial", "llama")
    copy_keys(r, w, IQ[name][2])
    rng = np.random.default_rng(seed)
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if t.name.startswith("blk.") and len(shape) == 2 and shape[1] % 256 == 0:
            q, qt = random_blocks(name, shape[0], shape[1], rng)
        else:
            q, qt = np.array(t.data), t.tensor_type
        w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    Path(str(dst) + ".partial").rename(dst)


def main():
    root = ROOT
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="iq2_xxs,iq2_s,iq3_xxs,iq3_s,iq1_m")
    ap.add_argument("--src", default=str(root / "models/bench/tinyllama-q4_0.gguf"))
    ap.add_argument("--out", default=str(root / "models/bench/iquant"))
    args = ap.parse_args()
    src, out = Path(args.src), Path(args.out)
    if not src.exists():
        sys.exit(f"make_iquant_gguf: {src} missing (bench/make_tinyllama_gguf.py makes it)")
    out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(args.types.split(",")):
        if name not in IQ:
            sys.exit(f"make_iquant_gguf: unknown type {name} (have {', '.join(IQ)})")
        dst = out / f"tinyllama-{name}.gguf"
        if not dst.exists():
            make(src, dst, name, 1000 + i)
        print(dst)


if __name__ == "__main__":
    main()
