"""gguf_rewrite.py — helpers for writing a GGUF from another one with some
tensors replaced (test models, bench models): the grid i-quant types, their
scale field, and the copy of a file's keys.

Used by tests/e2e/test_forward_iquant.py, tests/e2e/test_arch_llama3.py and
bench/make_iquant_gguf.py.
"""
import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

# i-quant name -> (ggml type, block bytes, llama_ftype for general.file_type)
IQ = {
    "iq1_s": (QT.IQ1_S, 50, 24), "iq1_m": (QT.IQ1_M, 56, 31),
    "iq2_xxs": (QT.IQ2_XXS, 66, 19), "iq2_xs": (QT.IQ2_XS, 74, 20), "iq2_s": (QT.IQ2_S, 82, 28),
    "iq3_xxs": (QT.IQ3_XXS, 98, 23), "iq3_s": (QT.IQ3_S, 110, 26),
}


def set_iq_d(name, blk, h):
    """Store the f16 bits h (one per block, or one for all) as each block's d.
    blk: uint8 [n_blocks][block bytes]; IQ1_M keeps d in the top nibbles of its
    4 u16 scale words at byte 48 (nibble i of d in word i), the others as
    bytes 0-1. Any other bytes make a valid block once d is finite."""
    h = np.broadcast_to(np.asarray(h, dtype=np.uint16).reshape(-1), (blk.shape[0],)).copy()
    if name != "iq1_m":
        blk[:, 0:2] = h.reshape(-1, 1).view(np.uint8)
        return
    sc = blk[:, 48:56].copy().view(np.uint16)
    for i in range(4):
        sc[:, i] = (sc[:, i] & 0x0FFF) | (((h >> (4 * i)) & 15) << 12)
    blk[:, 48:56] = sc.view(np.uint8)


def copy_keys(r, w, ftype=None, name=None):
    """Every key of reader r into writer w but the architecture (the writer's
    own) and the reader's GGUF.* bookkeeping; general.file_type = ftype and
    general.name = name where given."""
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        t = f.types[0]
        if f.name == "general.file_type" and ftype is not None:
            w.add_uint32(f.name, ftype)
        elif f.name == "general.name" and name is not None:
            w.add_string(f.name, name)
        elif t == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            vals = [bytes(f.parts[i]).decode() if sub == gguf.GGUFValueType.STRING else f.parts[i][0].item()
                    for i in f.data]
            w.add_key_value(f.name, vals, t, sub_type=sub)
        elif t == gguf.GGUFValueType.STRING:
            w.add_key_value(f.name, bytes(f.parts[-1]).decode(), t)
        else:
            w.add_key_value(f.name, f.parts[-1][0].item(), t)
