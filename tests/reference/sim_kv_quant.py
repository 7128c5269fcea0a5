#!/usr/bin/env python3
"""sim_kv_quant.py — simulate KV cache quantization schemes on SmolLM2-135M.

Not a fixture generator (writes nothing under tests/data, not in regen.sh):
a study tool for docs/KVCACHE.md's Quality section. transformers loads
models/SmolLM2-135M-Instruct.Q4_1.gguf (dequantized to fp32, as
gen_smollm2_ref.py does); the eager attention function is replaced by one
that quantizes K and V after RoPE the way a cache scheme would, then
attends in f32. Perplexity follows the engine's `perplexity` mode
(apps/cli/cli_eval.c): non-overlapping windows of N tokens of the text,
each from an empty cache, only the second half scored (positions N/2 ..
N-2 predicting the next token).

Each position's K/V is quantized on its own (or per block of positions for
the per-channel scheme), so causal prefill over quantized K/V is what a
decode over the same cache computes.

Schemes (K and V each: TYPE[+options]):
  f32          no quantization
  q4           the engine's q4_0: groups of 32 along the head, f16 scale =
               signed max / -8, codes round(x/d) + 8 clamped to 0..15
  q8           int8, one scale (absmax / 127) per head
  e4m3         OCP FP8 E4M3 (saturating at 448), no scale
  options:
  r            Walsh-Hadamard rotation of each head before the codec
  sB           smoothing: subtract m = the mean of the first B positions'
               rows (per KV head and layer); those B rows are kept in f32
               (exact: softmax is invariant to adding q.m to every score,
               and for V the output shifts by m since sum(p) = 1)
  SB           the same, but the first B rows are stored in the codec
               unsmoothed and m is the mean of their decoded values (what
               the engine can rebuild from its cache alone)
  f<B>         keep the first B rows in f32 (no smoothing)
  cG           (q4 only) per-channel asymmetric 4-bit over blocks of G
               positions (KIVI's K); the block holding the query is f32
  RG           (K only) the block of G positions holding the query read in
               f32, the codec per position otherwise (KIVI's f32 residual
               without its per-channel groups)
  WN           (K only) the last N positions (the query's included) read
               in f32: a sliding window instead of (or with R) the block
  BG           causal block smoothing: the rows of block b (G positions)
               stored less the mean of block b-1's decoded rows (block 0
               as is)

Usage: sim_kv_quant.py [--ctx 512] [--windows 8] [--text FILE] SCHEME...
  where SCHEME is K/V, e.g.  f32/f32  q4r/q4r  q4rs16/q4r  e4m3r/e4m3r
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = Path("/work/shared/data/corpus/austen_1.txt")


def hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def f16_round(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-65504, 65504).to(torch.float16).to(torch.float32)


def q4_0(x: torch.Tensor) -> torch.Tensor:
    """llama.cpp q4_0 along the last dim (groups of 32), dequantized."""
    sh = x.shape
    g = x.reshape(*sh[:-1], sh[-1] // 32, 32)
    idx = g.abs().argmax(-1, keepdim=True)
    mx = torch.gather(g, -1, idx)
    d = f16_round(mx / -8.0)
    idd = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.floor(g * idd + 8.5).clamp(0, 15)
    return ((q - 8) * d).reshape(sh)


def q8(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(-1, keepdim=True) / 127.0
    idd = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return torch.round(x * idd) * d


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.float32)


def q4_channel(x: torch.Tensor, G: int) -> torch.Tensor:
    """Asymmetric 4-bit per channel over blocks of G positions (dim -2)."""
    B, H, T, D = x.shape
    pad = (-T) % G
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad))
    g = xp.reshape(B, H, (T + pad) // G, G, D)
    if pad:  # padded rows must not widen the last block's range
        valid = torch.arange(T + pad).reshape((T + pad) // G, G) < T
        valid = valid[None, None, :, :, None]
        lo = torch.where(valid, g, torch.full_like(g, float("inf"))).amin(3, keepdim=True)
        hi = torch.where(valid, g, torch.full_like(g, float("-inf"))).amax(3, keepdim=True)
    else:
        lo, hi = g.amin(3, keepdim=True), g.amax(3, keepdim=True)
    lo, d = f16_round(lo), f16_round((hi - lo) / 15.0)
    idd = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round((g - lo) * idd).clamp(0, 15)
    return (q * d + lo).reshape(B, H, T + pad, D)[:, :, :T]


SPEC = re.compile(r"^(f32|q4|q8|e4m3)(r?)(?:([sS])(\d+))?(?:f(\d+))?(?:c(\d+))?(?:R(\d+))?(?:W(\d+))?(?:B(\d+))?$")


class Scheme:
    def __init__(self, s: str):
        m = SPEC.match(s)
        if not m:
            raise SystemExit(f"bad scheme '{s}'")
        self.name = s
        self.codec, self.rot = m.group(1), bool(m.group(2))
        self.smooth = int(m.group(4) or 0)
        # s: the first rows in f32; S: in the codec, m their decoded mean
        self.raw_first = m.group(3) == "S"
        self.keep = int(m.group(5) or 0) if self.raw_first else max(self.smooth, int(m.group(5) or 0))
        self.chan = int(m.group(6) or 0)
        self.recent = int(m.group(7) or 0)
        self.window = int(m.group(8) or 0)
        self.bsmooth = int(m.group(9) or 0)

    def apply(self, x: torch.Tensor):
        """x [B, H, T, D] -> (dequantized x, f32 override mask or None).
        The returned tensor holds what attention reads for each row."""
        if self.codec == "f32":
            return x, None
        D = x.shape[-1]
        H = hadamard(D) if self.rot else None
        def code(y):
            if H is not None:
                y = y @ H
            if self.chan:
                yq = q4_channel(y, self.chan)
            else:
                yq = {"q4": q4_0, "q8": q8, "e4m3": e4m3}[self.codec](y)
            return yq @ H if H is not None else yq  # H symmetric, its own inverse

        if self.bsmooth:  # causal: each block less the previous one's decoded mean
            G, T = self.bsmooth, x.shape[2]
            out, mb = [], None
            for b0 in range(0, T, G):
                xb = x[:, :, b0:b0 + G]
                yb = code(xb - mb) + mb if mb is not None else code(xb)
                out.append(yb)
                mb = yb.mean(2, keepdim=True) if yb.shape[2] == G else None
            yq = torch.cat(out, 2)
            if self.keep:
                yq = torch.cat([x[:, :, : self.keep], yq[:, :, self.keep:]], 2)
            return yq, None
        m = None
        if self.smooth and self.raw_first:
            raw = code(x[:, :, : self.smooth])
            m = raw.mean(2, keepdim=True)
        elif self.smooth:
            m = x[:, :, : self.smooth].mean(2, keepdim=True)
        yq = code(x - m) + m if m is not None else code(x)
        if self.smooth and self.raw_first:
            yq = torch.cat([raw, yq[:, :, self.smooth:]], 2)
        if self.keep:
            yq = torch.cat([x[:, :, : self.keep], yq[:, :, self.keep:]], 2)
        return yq, None


CUR = {"k": None, "v": None}


def attn(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    ks, vs = CUR["k"], CUR["v"]
    kq, _ = ks.apply(key)
    vq, _ = vs.apply(value)
    g = module.num_key_value_groups
    kq = modeling_llama.repeat_kv(kq, g)
    vq = modeling_llama.repeat_kv(vq, g)
    T = query.shape[2]
    s = torch.matmul(query, kq.transpose(2, 3)) * scaling
    blk_size = ks.chan or ks.recent
    if blk_size or ks.window:
        # KIVI: the block the query sits in is not full yet, read in f32
        kf = modeling_llama.repeat_kv(key, g)
        sf = torch.matmul(query, kf.transpose(2, 3)) * scaling
        same = torch.zeros(T, T, dtype=torch.bool)
        if blk_size:
            blk = torch.arange(T) // blk_size
            same |= blk[:, None] == blk[None, :]
        if ks.window:
            d = torch.arange(T)[:, None] - torch.arange(T)[None, :]
            same |= d < ks.window
        s = torch.where(same, sf, s)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~causal, float("-inf"))
    p = torch.softmax(s, -1)
    if vs.chan:
        raise SystemExit("per-channel V not simulated")
    o = torch.matmul(p, vq)
    return o.transpose(1, 2).contiguous(), None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--text", type=Path, default=TEXT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("schemes", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    mdir, mfile = str(MODEL.parent), MODEL.name
    tok = AutoTokenizer.from_pretrained(mdir, gguf_file=mfile)
    model = AutoModelForCausalLM.from_pretrained(mdir, gguf_file=mfile, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    modeling_llama.eager_attention_forward = attn
    # a prefix of the text (the tokenizer is slow on the whole 880 kB);
    # the windows come from its start, as in the engine's run
    text = a.text.read_text(encoding="utf-8")[: a.ctx * a.windows * 8]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    n_win = min(a.windows, len(ids) // a.ctx)
    first = a.ctx // 2
    base = None
    print(f"# ctx {a.ctx}, {n_win} windows, {n_win * (a.ctx - 1 - first)} scored", flush=True)
    for spec in a.schemes:
        kname, vname = spec.split("/")
        CUR["k"], CUR["v"] = Scheme(kname), Scheme(vname)
        nll, n = 0.0, 0
        with torch.no_grad():
            for w in range(n_win):
                x = torch.tensor([ids[w * a.ctx:(w + 1) * a.ctx]])
                lg = model(x).logits[0].float()
                lp = torch.log_softmax(lg[first:a.ctx - 1], -1)
                tgt = x[0, first + 1:a.ctx]
                nll -= lp.gather(1, tgt[:, None]).sum().item()
                n += tgt.numel()
        ppl = math.exp(nll / n)
        if base is None:
            base = ppl
        print(f"{spec:24s} PPL {ppl:.4f}  dPPL {100 * (ppl / base - 1):+.3f}%", flush=True)


if __name__ == "__main__":
    sys.exit(main())
