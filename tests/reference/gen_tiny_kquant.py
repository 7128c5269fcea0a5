#!/usr/bin/env python3
"""gen_tiny_kquant.py — a tiny random Llama in GGUF k-quants, and its reference logits.

gguf 0.19 can dequantize every k-quant but quantize none of them (nor
IQ4_NL), so the weights go through the small numpy quantizers of
kquant_np.py: simple per-sub-block min/max (or absmax) rules that produce
VALID blocks of ggml's layouts. Quality does not matter here — the references are computed
from the dequantized weights, so only the engine's arithmetic is tested.
The quantizer's bit packing is checked against gguf.quants' dequantizer
(exactly) before anything is written.

Model: hidden 256, FFN 512 (multiples of the 256-element super-block), 2
layers, 4 heads of 64, 2 KV heads, the 512-token BPE vocabulary of
gen_tiny_llama.py, seed 4321 (untied) and 8765 (tied). Writes into OUT
(default tests/data):

  tiny_kq_<t>.gguf        every 2-D weight in type t (norms f32), t in
                          q5_0 q5_1 iq4_nl q2_K q3_K q4_K q5_K q6_K iq4_xs
  tiny_kq_mixed.gguf      a llama-quantize-like mix: token_embd q4_K, output
                          q6_K, attn_v and ffn_down q6_K, layer 0 q4_K with
                          attn_k q2_K and attn_output q5_0, layer 1 attn_q
                          q3_K, attn_k q5_1, ffn_gate q5_K, ffn_up iq4_xs,
                          attn_output iq4_nl —
                          the row-parallel attn_output in 32-element types,
                          so that tensor:2 can cut its columns
  tiny_kq_tied.gguf       tied embeddings: token_embd q5_K, no output tensor,
                          layers q4_K with attn_v / ffn_down q6_K
  tiny_kq_<name>.expected.npz
      ids     int32 [P][N]  P prompts: 12 random ids, then HF's greedy
                            continuation of 8 tokens (chosen so that every
                            greedy step leads by >= MARGIN logits)
      logits  f32 [P][N][512] transformers (fp32, eager) on the weights
                            dequantized by gguf.quants, Q/K un-permuted
      meta    json: types, n_random / n_greedy, margins, the logits'
                            move under the weight quantization and under the
                            native path's 8-bit activations simulated in HF
                            (sim_act_max_rel / sim_act_rms_rel), versions
  tiny_kq_manifest.json   the list above

Usage: gen_tiny_kquant.py [--out DIR]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import gen_tiny_llama as tl  # noqa: E402  (tokenizer, names, RoPE permutation)
import tinygen  # noqa: E402  (GGUF keys and writing)
from kquant_np import quantize  # noqa: E402  (the numpy k-quant quantizers)

REPO = Path(__file__).resolve().parents[2]
VOCAB = tl.VOCAB
N_RANDOM, N_GREEDY, N_PROMPTS = 12, 8, 2
MARGIN = 0.3  # logits between HF's greedy top 1 and top 2 at every greedy step

TYPES = {  # name -> (type, llama_ftype for general.file_type)
    "q5_0": (QT.Q5_0, 8), "q5_1": (QT.Q5_1, 9), "iq4_nl": (QT.IQ4_NL, 25),
    "q2_K": (QT.Q2_K, 10), "q3_K": (QT.Q3_K, 12), "q4_K": (QT.Q4_K, 15),
    "q5_K": (QT.Q5_K, 17), "q6_K": (QT.Q6_K, 18), "iq4_xs": (QT.IQ4_XS, 30),
}


def log(*a):
    print("[gen_tiny_kquant]", *a, file=sys.stderr)


def check_quantizers():
    """Every quantizer's blocks decode (gguf.quants) close to their input —
    a wrong bit position would scramble elements far beyond the step size."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(8, 512)).astype(np.float32)
    x[0, :256] = 0  # an all-zero super-block
    x[1] *= 1e-3
    bound = {QT.Q2_K: 0.5, QT.Q3_K: 0.3, QT.IQ4_NL: 0.25, QT.IQ4_XS: 0.3}
    for name, (qt, _) in TYPES.items():
        q = quantize(x, qt)
        y = gguf.quants.dequantize(q, qt).reshape(x.shape)
        err = np.abs(y - x).max(-1) / np.maximum(np.abs(x).max(-1), 1e-30)
        lim = bound.get(qt, 0.15)
        if not np.all(np.isfinite(y)) or err.max() > lim or np.any(y[0, :256] != 0):
            raise SystemExit(f"{name}: quantizer round trip error {err.max():.3f} > {lim}")
        log(f"{name}: quantizer round trip max rel err {err.max():.3f}")


# --------------------------------------------------------------------- model
def kq_config(tied: bool) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=tied, hidden_act="silu", bos_token_id=1, eos_token_id=2)


def build_model(seed: int, tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(kq_config(tied))
    model.set_attn_implementation("eager")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + tl.NORM_JITTER * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(tl.EMBED_STD * torch.randn(p.shape, generator=g))
            else:  # std 1/sqrt(fan_in) * 1.6: logits of std ~1, as the tiny Llama
                p.copy_(1.6 / np.sqrt(p.shape[1]) * torch.randn(p.shape, generator=g))
    return model.float().eval()


def layer_types(plan: dict, n_layer: int) -> dict:
    """GGUF tensor name -> type, from a plan {suffix or 'blk.L.suffix': type, '*': default}."""
    out = {}
    for name in ["token_embd.weight", "output.weight"]:
        out[name] = plan.get(name, plan["*"])
    for i in range(n_layer):
        for suf in tl.LAYER_MAP.values():
            if suf.endswith("norm.weight"):
                continue
            out[f"blk.{i}.{suf}"] = plan.get(f"blk.{i}.{suf}", plan.get(suf, plan["*"]))
    return out


def write_gguf(path: Path, model, types: dict, ftype: int, tok_fields: dict, name: str):
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_type("model")
    tinygen.gguf_add_llama_keys(w, "llama", cfg)
    w.add_uint32("general.file_type", ftype)
    w.add_uint32("llama.vocab_size", cfg.vocab_size)
    w.add_uint32("llama.rope.dimension_count", cfg.hidden_size // n_head)
    tinygen.gguf_add_tokenizer(w, tok_fields)
    order = ["model.embed_tokens.weight"]
    for i in range(cfg.num_hidden_layers):
        order += [f"model.layers.{i}.{k}" for k in tl.LAYER_MAP]
    order += ["model.norm.weight"] + (["lm_head.weight"] if "lm_head.weight" in sd else [])
    assert sorted(order) == sorted(sd)
    for hf in order:
        t, gn = sd[hf], tl.gguf_name(hf)
        if hf.endswith("q_proj.weight"):
            t = tl.rope_permute(t, n_head)
        elif hf.endswith("k_proj.weight"):
            t = tl.rope_permute(t, n_kv)
        if t.ndim == 1:
            w.add_tensor(gn, np.ascontiguousarray(t, dtype=np.float32))
        else:
            qt = types[gn]
            q = quantize(t, qt)
            w.add_tensor(gn, q, raw_shape=q.shape, raw_dtype=qt)
    tinygen.gguf_finish(w)


def file_types(path: Path) -> dict:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


# ----------------------------------------------------------------- reference
K256 = {QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS}


def _round_act(x: torch.Tensor, blk: int) -> torch.Tensor:
    """8-bit activations per block of blk as the native kernels make them:
    Q8_K (blk 256: d = max|x|/127, q = nearest(x/d)) for the 256-element
    types, Q8_P (blk 32, the same rule) for q5_0/q5_1/iq4_nl."""
    b = x.reshape(-1, blk)
    d = b.abs().amax(dim=1, keepdim=True) / 127.0
    safe = torch.where(d > 0, d, torch.ones_like(d))
    return (torch.clamp(torch.round(b / safe), -127, 127) * d).reshape(x.shape)


@torch.no_grad()
def sim_act_stats(model, types: dict, ids: np.ndarray, ref: np.ndarray) -> dict:
    """How far the native path's activation rounding alone moves the logits:
    every Linear's input rounded per block of its weight type's activation
    format. Sizes the native tests' bounds; never stored as truth."""
    cfg = model.config
    blk = {"lm_head": 256 if types.get("output.weight", types["token_embd.weight"]) in K256 else 32}
    for i in range(cfg.num_hidden_layers):
        for hf, g in tl.LAYER_MAP.items():
            if hf.endswith("proj.weight"):
                blk[f"model.layers.{i}.{hf[:-len('.weight')]}"] = 256 if types[f"blk.{i}.{g}"] in K256 else 32
    hooks = [mod.register_forward_pre_hook(lambda mod, a, b=blk[n]: (_round_act(a[0], b),) + tuple(a[1:]))
             for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]
    try:
        sims = np.stack([tl.prefill_logits(model, row) for row in ids])
    finally:
        for h in hooks:
            h.remove()
    rms = max(float(np.sqrt(np.mean((s - r) ** 2) / np.mean(r ** 2))) for s, r in zip(sims, ref))
    return {"sim_act_max_rel": max(tl.rel_err(s, r) for s, r in zip(sims, ref)), "sim_act_rms_rel": rms}


@torch.no_grad()
def greedy_prompts(model, rng) -> tuple[np.ndarray, list]:
    """N_PROMPTS sequences: N_RANDOM random ids then HF's greedy continuation,
    keeping only prompts whose every greedy step leads by >= MARGIN."""
    out, margins = [], []
    for _ in range(400):
        ids = rng.integers(3, VOCAB, size=N_RANDOM).tolist()
        low = np.inf
        for _ in range(N_GREEDY):
            lg = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].numpy()
            top = np.sort(lg)[-2:]
            low = min(low, float(top[1] - top[0]))
            ids.append(int(np.argmax(lg)))
        if low >= MARGIN:
            out.append(ids)
            margins.append(low)
            if len(out) == N_PROMPTS:
                return np.array(out, dtype=np.int32), margins
    raise SystemExit(f"no {N_PROMPTS} prompts with greedy margins >= {MARGIN}")


def main():
    out = tinygen.cli_out(REPO, __doc__)
    tinygen.torch_setup(4)
    versions = tinygen.versions()
    check_quantizers()
    tok_fields = tl.tokenizer_gguf_fields(tl.build_tokenizer())

    base, tied = build_model(4321, tied=False), build_model(8765, tied=True)
    L = base.config.num_hidden_layers
    files = {name: (base, layer_types({"*": qt}, L), ftype) for name, (qt, ftype) in TYPES.items()}
    files["mixed"] = (base, layer_types({
        "*": QT.Q4_K, "token_embd.weight": QT.Q4_K, "output.weight": QT.Q6_K,
        "attn_v.weight": QT.Q6_K, "ffn_down.weight": QT.Q6_K,
        "blk.0.attn_output.weight": QT.Q5_0,
        "blk.0.attn_k.weight": QT.Q2_K, "blk.1.attn_q.weight": QT.Q3_K, "blk.1.attn_k.weight": QT.Q5_1,
        "blk.1.ffn_gate.weight": QT.Q5_K, "blk.1.ffn_up.weight": QT.IQ4_XS,
        "blk.1.attn_output.weight": QT.IQ4_NL,
    }, L), 15)
    files["tied"] = (tied, layer_types({"*": QT.Q4_K, "token_embd.weight": QT.Q5_K, "attn_v.weight": QT.Q6_K,
                                        "ffn_down.weight": QT.Q6_K}, L), 15)
    files["tied"][1].pop("output.weight")

    rng = np.random.default_rng(20261126)
    manifest = []
    for name, (model, types, ftype) in files.items():
        p = out / f"tiny_kq_{name}.gguf"
        write_gguf(p, model, types, ftype, tok_fields, name=f"tiny_kq_{name}")
        m = tl.model_from_gguf(p, model.config)
        ids, margins = greedy_prompts(m, rng)
        logits = np.stack([tl.reference(m, row, f"{p.name} prompt {i}") for i, row in enumerate(ids)])
        e = tl.rel_err(tl.transformers_gguf_logits(p, ids[0]), logits[0])
        if not e <= 1e-5:
            raise SystemExit(f"{p.name}: transformers' own GGUF loader disagrees ({e:.3e})")
        e_w = tl.rel_err(tl.prefill_logits(model, ids[0]), logits[0])
        ft = file_types(p)
        sim = sim_act_stats(m, types, ids, logits)
        log(f"{p.name}: {p.stat().st_size} bytes, weight quantization moves logits by rel {e_w:.2e}, "
            f"greedy margins {', '.join(f'{x:.2f}' for x in margins)}; simulated activation rounding: "
            f"max rel {sim['sim_act_max_rel']:.3e}, rms {sim['sim_act_rms_rel']:.3e}")
        exp = out / f"tiny_kq_{name}.expected.npz"
        meta = dict(types=ft, n_random=N_RANDOM, n_greedy=N_GREEDY, margins=margins,
                    weight_quant_rel_err=e_w, **sim, **versions)
        np.savez_compressed(exp, ids=ids, logits=logits.astype(np.float32),
                            meta=np.array(json.dumps(meta, sort_keys=True)))
        manifest.append({"name": p.name, "path": p.name, "expected": exp.name,
                         "tied": bool(model.config.tie_word_embeddings),
                         "types": sorted(set(ft.values()) - {"F32"})})
    (out / "tiny_kq_manifest.json").write_text(json.dumps(
        {"generator": "tests/reference/gen_tiny_kquant.py", "n_random": N_RANDOM, "n_greedy": N_GREEDY,
         "n_vocab": VOCAB, "versions": versions, "models": manifest}, indent=2, sort_keys=True) + "\n")
    log(f"wrote {len(manifest)} models into {out}")


if __name__ == "__main__":
    main()
