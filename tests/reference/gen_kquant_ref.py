#!/usr/bin/env python3
"""gen_kquant_ref.py — k-quant fixtures from gguf.quants (the oracle of
ggml's block layouts), read by tests/unit/test_kquant.c.

For each type T of q5_0 q5_1 iq4_nl q2_K q3_K q4_K q5_K q6_K iq4_xs writes
into OUT/kquant/:
    T.blocks   raw ggml blocks: random bytes with every f16 scale field
               replaced by a finite random f16, then edge blocks: all zero;
               all bytes 0xff (every code at its maximum) with finite scales;
               scales 65504 / -65504 / the smallest subnormal (0x0001);
               blocks that together hold every sub-block scale and min code
               (6-bit 0..63, 4-bit 0..15, Q6_K's int8 -128..127) at least once
    T.f32      gguf.quants.dequantize of T.blocks, little-endian f32
For q5_0 and q5_1 also (gguf.quants can quantize these):
    T.qin.f32  random floats (several scales, an all-zero block, a constant
               block, a one-outlier block), n a multiple of 32
    T.qout     gguf.quants.quantize of T.qin.f32 (ggml's reference rule)

Deterministic (fixed seed): tests/reference/regen.sh regenerates and
compares byte for byte.

Usage: gen_kquant_ref.py [--out DIR]   (default tests/data)
"""
import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

# type -> (ggml type, block bytes, offsets of f16 scale fields)
TYPES = {
    "q5_0": (QT.Q5_0, 22, [0]),
    "q5_1": (QT.Q5_1, 24, [0, 2]),
    "iq4_nl": (QT.IQ4_NL, 18, [0]),
    "q2_K": (QT.Q2_K, 84, [80, 82]),
    "q3_K": (QT.Q3_K, 110, [108]),
    "q4_K": (QT.Q4_K, 144, [0, 2]),
    "q5_K": (QT.Q5_K, 176, [0, 2]),
    "q6_K": (QT.Q6_K, 210, [208]),
    "iq4_xs": (QT.IQ4_XS, 136, [0]),
}
N_RANDOM = {32: 40, 256: 10}


def f16_bytes(v):
    return np.array([v], dtype=np.uint16).view(np.uint8)


def random_f16(rng):
    """A finite f16 of random sign and exponent (normal or subnormal)."""
    while True:
        h = int(rng.integers(0, 1 << 16))
        if (h & 0x7C00) != 0x7C00:
            return h


def set_scales(blk, offs, value):
    for o in offs:
        blk[o:o + 2] = f16_bytes(value)


# ---- writers of the sub-block scale fields (ggml's layouts; gguf.quants
# decodes them back, and the test checks every code appears)

def put_q2k(blk, sc, mn):
    blk[0:16] = (np.array(sc) & 15) | ((np.array(mn) & 15) << 4)


def put_q3k(blk, codes):
    s = np.zeros(12, dtype=np.uint8)
    for j, v in enumerate(codes):
        s[j % 8] |= (v & 15) << (4 * (j // 8))
        s[8 + j % 4] |= (v >> 4) << (2 * (j // 4))
    blk[96:108] = s


def put_k4(blk, sc, mn):
    s = np.zeros(12, dtype=np.uint8)
    for j in range(4):
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
        s[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6)
        s[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
    blk[4:16] = s


def put_q6k(blk, sc):
    blk[192:208] = np.array(sc, dtype=np.int8).view(np.uint8)


def put_iq4xs(blk, codes):
    sl = np.zeros(4, dtype=np.uint8)
    sh = 0
    for j, v in enumerate(codes):
        sl[j // 2] |= (v & 15) << (4 * (j % 2))
        sh |= (v >> 4) << (2 * j)
    blk[2:4] = np.array([sh], dtype=np.uint16).view(np.uint8)
    blk[4:8] = sl


def scale_cover_blocks(name, rng, nbytes, offs):
    """Blocks that together use every sub-block scale (and min) code."""
    out = []

    def base():
        b = rng.integers(0, 256, nbytes, dtype=np.uint8)
        set_scales(b, offs, random_f16(rng) & 0x3FFF)  # moderate magnitudes
        return b

    if name == "q2_K":
        b = base()
        put_q2k(b, list(range(16)), list(range(15, -1, -1)))
        out.append(b)
    elif name == "q3_K":
        for i in range(4):
            b = base()
            put_q3k(b, [16 * i + j for j in range(16)])
            out.append(b)
    elif name in ("q4_K", "q5_K"):
        for i in range(8):
            b = base()
            put_k4(b, [8 * i + j for j in range(8)], [63 - (8 * i + j) for j in range(8)])
            out.append(b)
    elif name == "q6_K":
        for i in range(16):
            b = base()
            put_q6k(b, [-128 + 16 * i + j for j in range(16)])
            out.append(b)
    elif name == "iq4_xs":
        for i in range(8):
            b = base()
            put_iq4xs(b, [8 * i + j for j in range(8)])
            out.append(b)
    return out


def make_blocks(name, rng):
    qt, nbytes, offs = TYPES[name]
    qk = 32 if nbytes <= 24 else 256
    blocks = []
    for _ in range(N_RANDOM[qk]):
        b = rng.integers(0, 256, nbytes, dtype=np.uint8)
        for o in offs:
            b[o:o + 2] = f16_bytes(random_f16(rng))
        blocks.append(b)
    blocks.append(np.zeros(nbytes, dtype=np.uint8))  # all zero
    b = np.full(nbytes, 0xFF, dtype=np.uint8)  # every code at its maximum
    set_scales(b, offs, 0x3C00)  # 1.0
    blocks.append(b)
    for v in (0x7BFF, 0xFBFF, 0x0001):  # 65504, -65504, smallest subnormal
        b = rng.integers(0, 256, nbytes, dtype=np.uint8)
        set_scales(b, offs, v)
        blocks.append(b)
    blocks += scale_cover_blocks(name, rng, nbytes, offs)
    return np.stack(blocks)


def quant_inputs(rng):
    """Random floats for the Q5_0 / Q5_1 quantizers, 32 blocks + edges."""
    x = []
    for scale in (1e-3, 1.0, 37.0, 2e3):
        x.append((rng.standard_normal((8, 32)) * scale).astype(np.float32))
    x.append(np.zeros((1, 32), dtype=np.float32))
    x.append(np.full((1, 32), 0.75, dtype=np.float32))
    o = (rng.standard_normal((1, 32)) * 0.01).astype(np.float32)
    o[0, 5] = 9.0
    x.append(o)
    x.append(np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 32))
    return np.concatenate(x).reshape(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data")
    args = ap.parse_args()
    out = Path(args.out) / "kquant"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261126)
    for name, (qt, nbytes, _) in TYPES.items():
        blocks = make_blocks(name, rng)
        vals = quants.dequantize(blocks.reshape(-1), qt).astype("<f4")
        assert vals.size == blocks.shape[0] * (32 if nbytes <= 24 else 256)
        (out / f"{name}.blocks").write_bytes(blocks.tobytes())
        (out / f"{name}.f32").write_bytes(vals.tobytes())
        if name in ("q5_0", "q5_1"):
            x = quant_inputs(rng)
            q = quants.quantize(x.reshape(1, -1), qt)
            (out / f"{name}.qin.f32").write_bytes(x.astype("<f4").tobytes())
            (out / f"{name}.qout").write_bytes(np.asarray(q, dtype=np.uint8).tobytes())


if __name__ == "__main__":
    main()
