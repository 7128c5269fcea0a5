"""kquant_np.py — small numpy quantizers for ggml's k-quant block layouts.

gguf 0.19 dequantizes every k-quant but quantizes none of them (nor IQ4_NL):
these write VALID blocks of ggml's layouts by simple per-sub-block min/max
(or absmax) rules. Quality does not matter where they are used (the tiny
fixtures of gen_tiny_kquant.py take their references from the dequantized
weights; the fuzz corpus only needs well-formed seeds). Bit positions
follow gguf.quants' dequantize_blocks; gen_tiny_kquant.py checks the round
trip through it before writing anything.

    quantize(w, qtype) -> (rows, n / QK * block bytes) uint8
"""
from __future__ import annotations

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

# Each takes blocks (nb, QK) float32 and returns (codes for the check, bytes
# (nb, block bytes) uint8). Scales are rounded to f16 before the codes are
# chosen, so the codes fit the stored scales.
KV = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.float32)


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def safe_div(a, b):
    return np.where(b != 0, a / np.where(b != 0, b, 1), 0).astype(np.float32)


def le16(h):
    """f16 array (nb,) -> (nb, 2) bytes."""
    return h.astype(np.float16).view(np.uint8).reshape(-1, 2)


def pack_k_scales(sc, mn):
    """Q4_K / Q5_K: 8 six-bit scale and min codes -> 12 bytes (ggml's get_scale_min_k4)."""
    nb = sc.shape[0]
    out = np.zeros((nb, 12), np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    return out


def affine_sub(s, umax, cmax):
    """Per sub-block x ~ (d*sc)*u - (dmin*mn): s (nb, nsub, n) -> d, dmin (f16), sc, mn, u."""
    lo = np.minimum(s.min(-1), 0)
    scale = (s.max(-1) - lo) / umax
    mins = -lo
    d = f16(scale.max(-1) / cmax)
    dmin = f16(mins.max(-1) / cmax)
    df, mf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(safe_div(scale, df)), 0, cmax).astype(np.uint8)
    mn = np.clip(np.rint(safe_div(mins, mf)), 0, cmax).astype(np.uint8)
    dl = (df * sc.astype(np.float32))[..., None]
    ml = (mf * mn.astype(np.float32))[..., None]
    u = np.clip(np.rint(safe_div(s + ml, dl)), 0, umax).astype(np.uint8)
    return d, dmin, sc, mn, u


def sym_sub(s, qmax, cmax):
    """Per sub-block x ~ (d*sc)*q with |q| <= qmax: -> d (f16), sc, q (int)."""
    scale = np.abs(s).max(-1) / qmax
    d = f16(scale.max(-1) / cmax)
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(safe_div(scale, df)), 0, cmax).astype(np.int32)
    dl = (df * sc.astype(np.float32))[..., None]
    q = np.rint(safe_div(s, dl)).astype(np.int32)
    return d, sc, q


def nearest_kv(x, dl):
    """Index of the IQ4_NL code book value nearest to x / dl."""
    return np.argmin(np.abs(KV * dl[..., None] - x[..., None]), axis=-1).astype(np.uint8)


def quant_q2_k(b):
    nb = b.shape[0]
    d, dmin, sc, mn, u = affine_sub(b.reshape(nb, 16, 16), 3, 15)
    u = u.reshape(nb, 2, 4, 32)  # element h*128 + s*32 + i -> bits 2s of qs[h*32 + i]
    qs = (u[:, :, 0] | (u[:, :, 1] << 2) | (u[:, :, 2] << 4) | (u[:, :, 3] << 6)).reshape(nb, 64)
    return np.concatenate([sc | (mn << 4), qs, le16(d), le16(dmin)], axis=1)


def quant_q3_k(b):
    nb = b.shape[0]
    d, sc, q = sym_sub(b.reshape(nb, 16, 16), 4, 31)
    u = (np.clip(q, -4, 3) + 4).astype(np.uint8).reshape(nb, 256)
    lo, hi = u & 3, u >> 2
    l4 = lo.reshape(nb, 2, 4, 32)
    qs = (l4[:, :, 0] | (l4[:, :, 1] << 2) | (l4[:, :, 2] << 4) | (l4[:, :, 3] << 6)).reshape(nb, 64)
    h8 = hi.reshape(nb, 8, 32)  # element b*32 + i -> bit b of hmask[i]
    hmask = np.zeros((nb, 32), np.uint8)
    for k in range(8):
        hmask |= h8[:, k] << k
    s6 = (sc + 32).astype(np.uint8)  # stored code s - 32 = sc
    scales = np.zeros((nb, 12), np.uint8)
    scales[:, 0:8] = (s6[:, 0:8] & 0xF) | ((s6[:, 8:16] & 0xF) << 4)
    for k in range(4):
        scales[:, 8:12] |= ((s6[:, 4 * k:4 * k + 4] >> 4) & 3) << (2 * k)
    return np.concatenate([hmask, qs, scales, le16(d)], axis=1)


def quant_q4_k(b, five=False):
    nb = b.shape[0]
    d, dmin, sc, mn, u = affine_sub(b.reshape(nb, 8, 32), 31 if five else 15, 63)
    u = u.reshape(nb, 256)
    l4 = (u & 0xF).reshape(nb, 4, 2, 32)  # element c*64 + k*32 + i -> nibble k of qs[c*32 + i]
    qs = (l4[:, :, 0] | (l4[:, :, 1] << 4)).reshape(nb, 128)
    parts = [le16(d), le16(dmin), pack_k_scales(sc, mn)]
    if five:
        h8 = (u >> 4).reshape(nb, 8, 32)
        qh = np.zeros((nb, 32), np.uint8)
        for k in range(8):
            qh |= h8[:, k] << k
        parts.append(qh)
    return np.concatenate(parts + [qs], axis=1)


def quant_q6_k(b):
    nb = b.shape[0]
    d, sc, q = sym_sub(b.reshape(nb, 16, 16), 32, 127)
    u = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(nb, 256)
    l4 = (u & 0xF).reshape(nb, 2, 2, 64)  # element h*128 + k*64 + i -> nibble k of ql[h*64 + i]
    ql = (l4[:, :, 0] | (l4[:, :, 1] << 4)).reshape(nb, 128)
    h2 = (u >> 4).reshape(nb, 2, 4, 32)  # element h*128 + s*32 + i -> bits 2s of qh[h*32 + i]
    qh = (h2[:, :, 0] | (h2[:, :, 1] << 2) | (h2[:, :, 2] << 4) | (h2[:, :, 3] << 6)).reshape(nb, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), le16(d)], axis=1)


def quant_iq4_nl(b):
    nb = b.shape[0]
    d = f16(np.abs(b).max(-1) / 127)
    u = nearest_kv(b, np.repeat(d.astype(np.float32)[:, None], 32, axis=1))
    qs = u[:, 0:16] | (u[:, 16:32] << 4)
    return np.concatenate([le16(d), qs], axis=1)


def quant_iq4_xs(b):
    nb = b.shape[0]
    s = b.reshape(nb, 8, 32)
    scale = np.abs(s).max(-1) / 127
    d = f16(scale.max(-1) / 31)
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(safe_div(scale, df)), 0, 31).astype(np.int32)
    dl = df * sc.astype(np.float32)
    u = nearest_kv(s, np.repeat(dl[..., None], 32, axis=2))
    s6 = (sc + 32).astype(np.uint16)
    scales_h = np.zeros(nb, np.uint16)
    for j in range(8):
        scales_h |= ((s6[:, j] >> 4) & 3) << (2 * j)
    s6 = s6.astype(np.uint8)
    scales_l = (s6[:, 0::2] & 0xF) | ((s6[:, 1::2] & 0xF) << 4)
    qs = (u[:, :, 0:16] | (u[:, :, 16:32] << 4)).reshape(nb, 128)
    return np.concatenate([le16(d), scales_h.astype("<u2").view(np.uint8).reshape(nb, 2), scales_l, qs],
                          axis=1)


QUANTIZERS = {
    QT.Q2_K: quant_q2_k, QT.Q3_K: quant_q3_k, QT.Q4_K: quant_q4_k,
    QT.Q5_K: lambda b: quant_q4_k(b, five=True), QT.Q6_K: quant_q6_k,
    QT.IQ4_NL: quant_iq4_nl, QT.IQ4_XS: quant_iq4_xs,
}


def quantize(w: np.ndarray, qt: QT) -> np.ndarray:
    """(rows, n) float32 -> (rows, n / QK * block bytes) uint8 in ggml's layout."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qt in (QT.Q5_0, QT.Q5_1, QT.F32):
        return gguf.quants.quantize(w, qt)
    qk, bb = gguf.GGML_QUANT_SIZES[qt]
    rows, n = w.shape
    assert n % qk == 0, (qt, w.shape)
    q = QUANTIZERS[qt](w.reshape(-1, qk))
    assert q.dtype == np.uint8 and q.shape == (rows * n // qk, bb), (qt, q.shape, q.dtype)
    return q.reshape(rows, n // qk * bb)
