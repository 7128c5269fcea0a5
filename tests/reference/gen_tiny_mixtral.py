#!/usr/bin/env python3
"""gen_tiny_mixtral.py — a tiny random Mixtral (sparse MoE Llama) and its
reference logits.

Writes into OUT (default tests/data):

  tiny_mixtral/        HF dir (MixtralForCausalLM), bf16, untied, 2 layers,
                       hidden 64, 4 heads / 2 KV heads (head_dim 16),
                       rope_theta 1e6, sliding_window null, 8 experts top-2
                       of width 32 (intermediate_size); transformers saves
                       the router as block_sparse_moe.gate.weight and the
                       experts one by one, block_sparse_moe.experts.N.w1
                       (gate) / w3 (up) / w2 (down), as the released
                       checkpoints hold them
  tiny_mixtral_q8_0.gguf  its GGUF as llama.cpp's convert_hf_to_gguf.py
                       writes a Mixtral: general.architecture "llama",
                       llama.* keys with llama.expert_count 8 /
                       expert_used_count 2 (feed_forward_length = the expert
                       width), Q/K permuted, ffn_gate_inp f32, the experts
                       stacked ffn_{gate,up,down}_exps (expert outermost),
                       every other 2-D weight and stack Q8_0 (--outtype q8_0)
                       -> tiny_mixtral_q8_0.expected.npz (transformers on the
                       dequantized weights)
  tiny_mixtral/expected.npz  ids int32 [32], logits float32 [32][512] from
                       transformers in fp32
  tiny_mixtral_top3.expected.npz  the same weights with num_experts_per_tok 3
                       (no files of its own: the e2e test copies the config
                       with the field changed)

Mixtral routes with a softmax over all 8 router logits, the top-2
probabilities, renormalized to sum 1 (MixtralTopKRouter); that equals a
softmax over the two selected logits.

Weights are drawn in fp32, then rounded to bf16 with magnitudes below 2^-14
flushed to 0, so bf16 (HF) and f16 (GGUF) hold exactly the same values.

Checks done here (the script fails if any does not hold):
  * prefill logits == step-by-step decode (1e-5 rel), logits not degenerate
  * transformers saved the per-expert block_sparse_moe names read above
  * an f16 GGUF (written to a temp dir, not kept) read back with gguf's
    reader (Q/K un-permuted, experts un-stacked) reproduces the HF logits
    exactly
  * the routers' top-k are not near ties (smallest gap between the k-th
    and (k+1)-th probability over all tokens and layers >= 1e-4)
  * routing matters: dropping the renormalization, top-1 and top-3 each
    move the logits by more than 1e-2 relative (the tests' tolerance is
    1e-4)

Usage: gen_tiny_mixtral.py [--out DIR]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import MixtralConfig, MixtralForCausalLM  # noqa: E402

import tinygen  # noqa: E402
from gen_tiny_llama import (N_PROMPT, VOCAB, build_tokenizer, rope_permute, rope_unpermute,  # noqa: E402
                            save_hf, tokenizer_gguf_fields)
from tinygen import prefill_logits, rel_err, save_expected  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WEIGHT_STD = 0.1
EMBED_STD = 0.5
NORM_JITTER = 0.2
MIN_ROUTE_GAP = 1e-4
MIN_ROUTING_EFFECT = 1e-2


def log(*a):
    print("[gen_tiny_mixtral]", *a, file=sys.stderr)


def config(top_k: int = 2) -> MixtralConfig:
    return MixtralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, sliding_window=None,
        tie_word_embeddings=False, hidden_act="silu", num_local_experts=8, num_experts_per_tok=top_k,
        router_jitter_noise=0.0, bos_token_id=1, eos_token_id=2)


def representable(t: torch.Tensor) -> torch.Tensor:
    """Round to bf16 and flush what f16 would make subnormal: the values are
    then exact in bf16, f16 and f32."""
    t = t.to(torch.bfloat16).float()
    return torch.where(t.abs() < 2.0 ** -14, torch.zeros_like(t), t)


def build(cfg, seed: int):
    torch.manual_seed(seed)
    model = MixtralForCausalLM(cfg)
    model.set_attn_implementation("eager")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                v = 1.0 + NORM_JITTER * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = EMBED_STD * torch.randn(p.shape, generator=g)
            elif name.endswith("mlp.gate.weight"):
                v = 3 * WEIGHT_STD * torch.randn(p.shape, generator=g)  # decisive routing
            else:
                v = WEIGHT_STD * torch.randn(p.shape, generator=g)
            p.copy_(representable(v))
    return model.float().eval()


def load_fp32(path: Path, **kw):
    return MixtralForCausalLM.from_pretrained(path, attn_implementation="eager", **kw).float().eval()


def reference(model, ids, what: str) -> np.ndarray:
    return tinygen.reference(model, ids, what, log)


def routers(model):
    return [m for m in model.modules() if type(m).__name__ == "MixtralTopKRouter"]


@torch.no_grad()
def min_route_gap(model, ids) -> float:
    """Smallest p_k - p_(k+1) of any router over the prompt (prefill)."""
    gaps = []

    def hook(mod, args, out):
        p = torch.softmax(out[0].float(), dim=-1)
        top = torch.topk(p, mod.top_k + 1, dim=-1).values
        gaps.append(float((top[:, -2] - top[:, -1]).min()))

    hs = [m.register_forward_hook(hook) for m in routers(model)]
    try:
        prefill_logits(model, ids)
    finally:
        for h in hs:
            h.remove()
    assert gaps, "no router found"
    return min(gaps)


@torch.no_grad()
def logits_without_renormalization(model, ids) -> np.ndarray:
    """Prefill logits with the top-k probabilities used as they come out of
    the softmax over all experts (no division by their sum)."""
    def hook(mod, args, out):
        logits, _, idx = out
        p = torch.softmax(logits.float(), dim=-1)
        return logits, torch.gather(p, -1, idx), idx

    hs = [m.register_forward_hook(hook) for m in routers(model)]
    try:
        return prefill_logits(model, ids)
    finally:
        for h in hs:
            h.remove()


# ---------------------------------------------------------------------- GGUF
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}
STACKS = ("ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight")  # w1, w2, w3


def gguf_tensors(model) -> list:
    """(gguf name, numpy array in torch order) in the converter's order:
    embedding, each layer (Q/K permuted; experts stacked [E, out, in] in
    its w1, w2, w3 order), norm, head. In memory transformers 5 holds the
    experts fused: gate_up_proj [E, 2I, H] (gate rows first), down_proj
    [E, H, I]."""
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        for k, g in LAYER.items():
            t = sd[pre + k]
            if k == "self_attn.q_proj.weight":
                t = rope_permute(t, cfg.num_attention_heads)
            elif k == "self_attn.k_proj.weight":
                t = rope_permute(t, cfg.num_key_value_heads)
            out.append((f"blk.{i}.{g}", t))
        gu = sd[pre + "mlp.experts.gate_up_proj"]
        half = gu.shape[1] // 2
        assert gu.shape[0] == cfg.num_local_experts
        stacks = {"ffn_gate_exps.weight": gu[:, :half], "ffn_up_exps.weight": gu[:, half:],
                  "ffn_down_exps.weight": sd[pre + "mlp.experts.down_proj"]}
        out += [(f"blk.{i}.{s}", stacks[s]) for s in STACKS]
    out.append(("output_norm.weight", sd["model.norm.weight"]))
    out.append(("output.weight", sd["lm_head.weight"]))
    return out


def write_gguf(path: Path, model, tok_fields: dict, name: str, qtype: QT):
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_type("model")
    tinygen.gguf_add_llama_keys(w, "llama", cfg)
    w.add_uint32("llama.expert_count", cfg.num_local_experts)
    w.add_uint32("llama.expert_used_count", cfg.num_experts_per_tok)
    w.add_uint32("general.file_type", {QT.F16: 1, QT.Q8_0: 7}[qtype])  # MOSTLY_F16 / MOSTLY_Q8_0
    w.add_uint32("llama.vocab_size", cfg.vocab_size)
    w.add_uint32("llama.rope.dimension_count", cfg.hidden_size // cfg.num_attention_heads)
    tinygen.gguf_add_tokenizer(w, tok_fields)
    for gname, t in gguf_tensors(model):
        # the converter keeps 1-D tensors and the router in f32; expert
        # stacks quantize slice by slice: rows never cross experts
        tinygen.gguf_add_tensor(w, gname, t, QT.F32 if gname.endswith("ffn_gate_inp.weight") else qtype)
    tinygen.gguf_finish(w)


def model_from_gguf(path: Path, cfg):
    """HF model whose weights are the GGUF's tensors dequantized by gguf's
    own dequantizer: Q/K un-permuted, experts un-stacked into transformers
    5's fused layout."""
    inv = {v: k for k, v in GLOBAL.items()}
    sd, stacks = {}, {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if t.name in inv:
            sd[inv[t.name]] = torch.from_numpy(np.ascontiguousarray(a))
            continue
        _, layer, rest = t.name.split(".", 2)
        if rest in STACKS:
            stacks[(int(layer), rest)] = torch.from_numpy(np.ascontiguousarray(a))
            continue
        hf = [k for k, g in LAYER.items() if g == rest][0]
        if hf == "self_attn.q_proj.weight":
            a = rope_unpermute(a, cfg.num_attention_heads)
        elif hf == "self_attn.k_proj.weight":
            a = rope_unpermute(a, cfg.num_key_value_heads)
        sd[f"model.layers.{layer}.{hf}"] = torch.from_numpy(np.ascontiguousarray(a))
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}.mlp.experts."
        sd[pre + "gate_up_proj"] = torch.cat([stacks[(i, "ffn_gate_exps.weight")],
                                              stacks[(i, "ffn_up_exps.weight")]], dim=1)
        sd[pre + "down_proj"] = stacks[(i, "ffn_down_exps.weight")]
    return tinygen.model_from_state(MixtralForCausalLM, cfg, sd)


def check_saved_names(path: Path, cfg):
    """transformers writes Mixtral's per-expert checkpoint names (the
    engine's HF reader is written against them)."""
    with safe_open(str(path / "model.safetensors"), "np") as f:
        keys = set(f.keys())
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}.block_sparse_moe."
        want = {pre + "gate.weight"} | {f"{pre}experts.{e}.{w}.weight" for e in range(cfg.num_local_experts)
                                        for w in ("w1", "w2", "w3")}
        if not want <= keys:
            raise SystemExit(f"tiny_mixtral: saved names differ from Mixtral's checkpoints: "
                             f"missing {sorted(want - keys)[:3]}")


def main():
    out = tinygen.cli_out(REPO, __doc__)
    tinygen.torch_setup(4)
    versions = tinygen.versions()
    tok = build_tokenizer()
    tok_fields = tokenizer_gguf_fields(tok)
    rng = np.random.default_rng(20240619)
    ids = rng.integers(3, VOCAB, size=N_PROMPT).astype(np.int32)

    moe = build(config(), seed=5005)
    d = out / "tiny_mixtral"
    save_hf(moe, d, torch.bfloat16, tok)
    check_saved_names(d, moe.config)
    m = load_fp32(d)
    assert m.config.num_local_experts == 8 and m.config.num_experts_per_tok == 2
    assert m.config.sliding_window is None
    ref = reference(m, ids, "tiny_mixtral")
    gap = min_route_gap(m, ids)
    log(f"tiny_mixtral: smallest top-k routing gap {gap:.3e}")
    if gap < MIN_ROUTE_GAP:
        raise SystemExit(f"tiny_mixtral: routing near tie ({gap:.3e})")
    if not np.array_equal(ref, reference(moe, ids, "tiny_mixtral (in memory)")):
        raise SystemExit("tiny_mixtral: bf16 save changed the weights")
    save_expected(d / "expected.npz", ids, ref, weights="bf16", min_route_gap=gap, **versions)

    # routing matters: the renormalization and the top-k each move the logits
    e = rel_err(logits_without_renormalization(m, ids), ref)
    log(f"tiny_mixtral: dropping the top-k renormalization moves logits by rel {e:.2e}")
    if not e > MIN_ROUTING_EFFECT:
        raise SystemExit("the renormalization makes no difference: the fixture would not test it")
    for k in (1, 3):
        mk = load_fp32(d, num_experts_per_tok=k)
        assert mk.config.num_experts_per_tok == k
        ref_k = reference(mk, ids, f"tiny_mixtral, top-{k}")
        e = rel_err(ref_k, ref)
        log(f"tiny_mixtral: top-{k} instead of top-2 moves logits by rel {e:.2e}")
        if not e > MIN_ROUTING_EFFECT:
            raise SystemExit(f"top-{k} makes no difference: the fixture would not test the top-k")
        if k == 3:
            gap_k = min_route_gap(mk, ids)
            if gap_k < MIN_ROUTE_GAP:
                raise SystemExit(f"tiny_mixtral top-3: routing near tie ({gap_k:.3e})")
            save_expected(out / "tiny_mixtral_top3.expected.npz", ids, ref_k, weights="bf16",
                          min_route_gap=gap_k, **versions)

    # an f16 GGUF (not kept: the fixtures stay small) must reproduce the HF
    # logits exactly: the Q/K permutation and the expert stacking are
    # checked here, before Q8_0
    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "tiny_mixtral.gguf"
        write_gguf(p, moe, tok_fields, "tiny_mixtral", QT.F16)
        if not np.array_equal(ref, reference(model_from_gguf(p, moe.config), ids,
                                             "tiny_mixtral.gguf (f16, not kept)")):
            raise SystemExit("the f16 Mixtral GGUF does not reproduce tiny_mixtral's logits")

    # Q8_0 GGUF (2-D weights and expert stacks Q8_0, router f32): its own
    # reference, on the dequantized weights
    p = out / "tiny_mixtral_q8_0.gguf"
    write_gguf(p, moe, tok_fields, "tiny_mixtral_q8_0", QT.Q8_0)
    m = model_from_gguf(p, moe.config)
    ref_q = reference(m, ids, p.name)
    gap_q = min_route_gap(m, ids)
    log(f"{p.name}: Q8_0 moves logits by rel {rel_err(ref_q, ref):.2e}; smallest routing gap {gap_q:.3e}")
    if gap_q < MIN_ROUTE_GAP:
        raise SystemExit(f"{p.name}: routing near tie ({gap_q:.3e})")
    save_expected(out / "tiny_mixtral_q8_0.expected.npz", ids, ref_q, weights="q8_0", min_route_gap=gap_q,
                  **versions)
    log(f"wrote tiny_mixtral, tiny_mixtral_q8_0.gguf (+ top-3 reference) into {out}: "
        + json.dumps({"gap": gap, "gap_q8_0": gap_q}))


if __name__ == "__main__":
    main()
