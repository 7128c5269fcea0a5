#!/usr/bin/env python3
"""gen_iquant_ref.py — i-quant fixtures from gguf.quants (the oracle of
ggml's grid layouts), read by tests/unit/test_iquant.c.

For each type T of iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s iq1_m writes into
OUT/iquant/:
    T.blocks   raw ggml blocks: random bytes with the f16 scale d replaced by
               a finite random f16; then blocks whose group indices walk the
               whole grid in order (every entry of the code book used once);
               then edge blocks: all zero, all bytes 0xff with a finite d,
               d = 65504 / -65504 / the smallest subnormal (0x0001)
    T.f32      gguf.quants.dequantize of T.blocks, little-endian f32

Deterministic (fixed seed): tests/reference/regen.sh regenerates and
compares byte for byte.

Usage: gen_iquant_ref.py [--out DIR]   (default tests/data)
"""
import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

# type -> (ggml type, block bytes, grid entries)
TYPES = {
    "iq2_xxs": (QT.IQ2_XXS, 66, 256),
    "iq2_xs": (QT.IQ2_XS, 74, 512),
    "iq2_s": (QT.IQ2_S, 82, 1024),
    "iq3_xxs": (QT.IQ3_XXS, 98, 256),
    "iq3_s": (QT.IQ3_S, 110, 512),
    "iq1_s": (QT.IQ1_S, 50, 2048),
    "iq1_m": (QT.IQ1_M, 56, 2048),
}
N_RANDOM = 24


def random_f16(rng):
    """A finite f16 of random sign and exponent (normal or subnormal)."""
    while True:
        h = int(rng.integers(0, 1 << 16))
        if (h & 0x7C00) != 0x7C00:
            return h


def set_d(name, blk, h):
    """Store the f16 bits h as the block's d (IQ1_M: the scales' top nibbles)."""
    if name != "iq1_m":
        blk[0:2] = np.array([h], dtype=np.uint16).view(np.uint8)
        return
    sc = blk[48:56].view(np.uint16).copy()
    for i in range(4):
        sc[i] = (int(sc[i]) & 0x0FFF) | (((h >> (4 * i)) & 15) << 12)
    blk[48:56] = sc.view(np.uint8)


def set_indices(name, blk, idx):
    """Write the grid indices idx (one per group, in element order) into blk."""
    if name == "iq2_xxs":  # 32 groups: byte l of the u32 at 2 + 8j
        for g, v in enumerate(idx):
            blk[2 + 8 * (g // 4) + g % 4] = v
    elif name == "iq2_xs":  # u16 v: low 9 bits
        q = blk[2:66].view(np.uint16).copy()
        q[:] = (q & 0xFE00) | np.array(idx, dtype=np.uint16)
        blk[2:66] = q.view(np.uint8)
    elif name == "iq2_s":  # qs[g] low 8 bits, qh[g/4] bits 2(g%4)
        for g, v in enumerate(idx):
            blk[2 + g] = v & 0xFF
            blk[66 + g // 4] = (int(blk[66 + g // 4]) & ~(3 << (2 * (g % 4))) & 0xFF) | ((v >> 8) << (2 * (g % 4)))
    elif name == "iq3_xxs":  # 64 entries of 4 values
        blk[2:66] = np.array(idx, dtype=np.uint8)
    elif name == "iq3_s":  # qs[i] low 8 bits, qh[i/8] bit i%8
        for i, v in enumerate(idx):
            blk[2 + i] = v & 0xFF
            blk[66 + i // 8] = (int(blk[66 + i // 8]) & ~(1 << (i % 8)) & 0xFF) | ((v >> 8) << (i % 8))
    elif name == "iq1_s":  # qs[4j+l] low 8 bits, u16 h[j] bits 3l..3l+2
        h = blk[34:50].view(np.uint16).copy()
        for g, v in enumerate(idx):
            j, l = divmod(g, 4)
            blk[2 + g] = v & 0xFF
            h[j] = (int(h[j]) & ~(7 << (3 * l)) & 0xFFFF) | ((v >> 8) << (3 * l))
        blk[34:50] = h.view(np.uint8)
    elif name == "iq1_m":  # qs[g] low 8 bits, nibble g%2 of qh[g/2] bits 0-2
        for g, v in enumerate(idx):
            blk[g] = v & 0xFF
            sh = 4 * (g % 2)
            blk[32 + g // 2] = (int(blk[32 + g // 2]) & ~(7 << sh) & 0xFF) | ((v >> 8) << sh)


def make_blocks(name, rng):
    qt, nbytes, n_grid = TYPES[name]
    per = 64 if name in ("iq3_xxs", "iq3_s") else 32  # grid indices a block
    blocks = []
    for _ in range(N_RANDOM):
        b = rng.integers(0, 256, nbytes, dtype=np.uint8)
        set_d(name, b, random_f16(rng))
        blocks.append(b)
    for start in range(0, n_grid, per):  # every grid entry once
        b = rng.integers(0, 256, nbytes, dtype=np.uint8)
        set_d(name, b, random_f16(rng) & 0x3FFF)
        set_indices(name, b, [(start + i) % n_grid for i in range(per)])
        blocks.append(b)
    blocks.append(np.zeros(nbytes, dtype=np.uint8))
    b = np.full(nbytes, 0xFF, dtype=np.uint8)
    set_d(name, b, 0x3C00)
    blocks.append(b)
    for h in (0x7BFF, 0xFBFF, 0x0001):
        b = rng.integers(0, 256, nbytes, dtype=np.uint8)
        set_d(name, b, h)
        blocks.append(b)
    raw = np.concatenate(blocks)
    vals = quants.dequantize(raw, qt).astype("<f4")
    assert vals.size == 256 * len(blocks) and np.isfinite(vals).all(), name
    return raw, vals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "tests/data"))
    args = ap.parse_args()
    out = Path(args.out) / "iquant"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261128)
    for name in TYPES:
        raw, vals = make_blocks(name, rng)
        (out / f"{name}.blocks").write_bytes(raw.tobytes())
        (out / f"{name}.f32").write_bytes(vals.tobytes())
        print(f"{name}: {raw.size // TYPES[name][1]} blocks")


if __name__ == "__main__":
    main()
