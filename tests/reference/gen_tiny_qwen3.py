#!/usr/bin/env python3
"""gen_tiny_qwen3.py — tiny random Qwen3 and Qwen3-MoE models and their
reference logits.

Writes into OUT (default tests/data):

  tiny_qwen3/          HF dir (Qwen3ForCausalLM), bf16, tied embeddings,
                       2 layers, hidden 64, 4 heads / 2 KV heads, head_dim 32
                       (explicit, != hidden / heads), q/k norms, rope_theta 1e6
  tiny_qwen3.gguf      the same weights as llama.cpp's convert_hf_to_gguf.py
                       writes a qwen3: qwen3.* keys (attention.key_length /
                       value_length = head_dim), blk.N.attn_q_norm / attn_k_norm,
                       Q/K NOT permuted (llama.cpp runs qwen3 with NEOX RoPE),
                       no output.weight (tied), 2-D weights f16, 1-D f32
  tiny_qwen3moe/       HF dir (Qwen3MoeForCausalLM), bf16, untied, 2 layers,
                       8 experts top-2 (moe_intermediate_size 32),
                       norm_topk_prob true; experts stored per expert
                       (mlp.experts.N.{gate,up,down}_proj.weight) as the
                       released checkpoints and transformers' save do
  tiny_qwen3moe_q8_0.gguf  its qwen3moe GGUF: ffn_gate_inp (f32), the experts
                       stacked ffn_{gate,up,down}_exps, qwen3moe.expert_count /
                       expert_used_count / expert_feed_forward_length; every
                       2-D weight and expert stack Q8_0 (as --outtype q8_0)
                       -> tiny_qwen3moe_q8_0.expected.npz (transformers on
                       the dequantized weights)
  <dir>/expected.npz  ids int32 [32], logits float32 [32][512] from
                       transformers in fp32
  tiny_qwen3moe_nonorm.expected.npz  the same for tiny_qwen3moe's weights
                       with norm_topk_prob false (no files of its own: the
                       e2e test copies the config with the flag flipped)
  tiny_qwen3_yarn.expected.npz  tiny_qwen3's weights with rope_parameters
                       YaRN factor 4, original_max_position_embeddings 1024
                       (max_position_embeddings 4096); no files of its own
                       either: the e2e test edits a config copy and adds the
                       qwen3.rope.scaling.* keys to a GGUF copy

Weights are drawn in fp32, then rounded to bf16 with magnitudes below 2^-14
flushed to 0, so bf16 (HF) and f16 (GGUF) hold exactly the same values and
one reference serves both files.

Checks done here (the script fails if any does not hold):
  * prefill logits == step-by-step decode (1e-5 rel), logits not degenerate
  * every f16 GGUF read back (gguf's reader, experts un-stacked) reproduces
    its HF model's logits exactly (the MoE's f16 GGUF is written to a temp
    dir for this check only)
  * the MoE routers' top-k are not near ties: the smallest gap between the
    k-th and (k+1)-th probability over all tokens and layers is reported
    and must be >= 1e-4 (so f32 arithmetic cannot flip a routing decision)

Usage: gen_tiny_qwen3.py [--out DIR]
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
from transformers import (Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,  # noqa: E402
                          Qwen3MoeForCausalLM)

import tinygen  # noqa: E402
from gen_tiny_llama import N_PROMPT, VOCAB, build_tokenizer, save_hf, tokenizer_gguf_fields  # noqa: E402
from tinygen import prefill_logits, rel_err, save_expected  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WEIGHT_STD = 0.1
EMBED_STD = 0.5
NORM_JITTER = 0.2
MIN_ROUTE_GAP = 1e-4
# YaRN on tiny_qwen3 (head_dim 32, theta 1e6): the ramp rounds to pairs 1..6
QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}


def log(*a):
    print("[gen_tiny_qwen3]", *a, file=sys.stderr)


def dense_config() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=128,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False,
        bos_token_id=1, eos_token_id=2)


def moe_config(norm_topk: bool) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=128, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=norm_topk,
        decoder_sparse_step=1, mlp_only_layers=[], bos_token_id=1, eos_token_id=2)


def representable(t: torch.Tensor) -> torch.Tensor:
    """Round to bf16 and flush what f16 would make subnormal: the values are
    then exact in bf16, f16 and f32."""
    t = t.to(torch.bfloat16).float()
    return torch.where(t.abs() < 2.0 ** -14, torch.zeros_like(t), t)


def build(cls, cfg, seed: int):
    torch.manual_seed(seed)
    model = cls(cfg)
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


def load_fp32(cls, path: Path):
    return cls.from_pretrained(path, attn_implementation="eager").float().eval()


def reference(model, ids, what: str) -> np.ndarray:
    return tinygen.reference(model, ids, what, log)


@torch.no_grad()
def min_route_gap(model, ids) -> float:
    """Smallest p_k - p_(k+1) of any router over the prompt (prefill)."""
    gaps = []

    def hook(mod, args, out):
        logits = out[0] if isinstance(out, tuple) else out
        p = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(p, mod.top_k + 1, dim=-1).values
        gaps.append(float((top[:, -2] - top[:, -1]).min()))

    hs = [m.register_forward_hook(hook) for m in model.modules()
          if type(m).__name__ == "Qwen3MoeTopKRouter"]
    try:
        prefill_logits(model, ids)
    finally:
        for h in hs:
            h.remove()
    assert gaps, "no router found"
    return min(gaps)


# ---------------------------------------------------------------------- GGUF
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}
EXPERTS = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight",
           "down_proj": "ffn_down_exps.weight"}


def gguf_tensors(sd: dict, n_layer: int, n_expert: int) -> list:
    """(gguf name, numpy array in torch order) in the converter's order:
    embedding, each layer (experts stacked [n_expert, out, in]), norm, head."""
    out = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(n_layer):
        pre = f"model.layers.{i}."
        for k, g in LAYER.items():
            if pre + k in sd:
                out.append((f"blk.{i}.{g}", sd[pre + k]))
        # in memory transformers 5 holds the experts fused (the checkpoint
        # is per expert): gate_up_proj [E, 2I, H] (gate rows first),
        # down_proj [E, H, I] — the stacks the converter writes
        if pre + "mlp.experts.gate_up_proj" in sd:
            gu = sd[pre + "mlp.experts.gate_up_proj"]
            half = gu.shape[1] // 2
            assert gu.shape[0] == n_expert
            out.append((f"blk.{i}.ffn_gate_exps.weight", gu[:, :half]))
            out.append((f"blk.{i}.ffn_up_exps.weight", gu[:, half:]))
            out.append((f"blk.{i}.ffn_down_exps.weight", sd[pre + "mlp.experts.down_proj"]))
    out.append(("output_norm.weight", sd["model.norm.weight"]))
    if "lm_head.weight" in sd:
        out.append(("output.weight", sd["lm_head.weight"]))
    return out


def write_gguf(path: Path, arch: str, model, tok_fields: dict, name: str, qtype: QT = QT.F16):
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    n_expert = getattr(cfg, "num_experts", 0) if arch == "qwen3moe" else 0
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_type("model")
    tinygen.gguf_add_llama_keys(w, arch, cfg)
    w.add_uint32(f"{arch}.attention.key_length", cfg.head_dim)
    w.add_uint32(f"{arch}.attention.value_length", cfg.head_dim)
    if n_expert:
        w.add_uint32(f"{arch}.expert_count", n_expert)
        w.add_uint32(f"{arch}.expert_used_count", cfg.num_experts_per_tok)
        w.add_uint32(f"{arch}.expert_feed_forward_length", cfg.moe_intermediate_size)
    w.add_uint32("general.file_type", {QT.F16: 1, QT.Q8_0: 7}[qtype])  # MOSTLY_F16 / MOSTLY_Q8_0
    tinygen.gguf_add_tokenizer(w, tok_fields, unknown_id=False)
    for gname, t in gguf_tensors(sd, cfg.num_hidden_layers, n_expert):
        # the converter keeps 1-D tensors and the router (ffn_gate_inp) in
        # f32; expert stacks quantize slice by slice: rows never cross experts
        tinygen.gguf_add_tensor(w, gname, t, QT.F32 if gname.endswith("ffn_gate_inp.weight") else qtype)
    tinygen.gguf_finish(w)


def model_from_gguf(path: Path, cls, cfg):
    """HF model whose weights are the GGUF's tensors (experts un-stacked)."""
    r = gguf.GGUFReader(str(path))
    inv = {v: k for k, v in GLOBAL.items()}
    sd = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if t.name in inv:
            sd[inv[t.name]] = torch.from_numpy(np.ascontiguousarray(a))
            continue
        _, layer, rest = t.name.split(".", 2)
        hit = [k for k, g in LAYER.items() if g == rest]
        if hit:
            sd[f"model.layers.{layer}.{hit[0]}"] = torch.from_numpy(np.ascontiguousarray(a))
            continue
        proj = [k for k, g in EXPERTS.items() if g == rest][0]
        fused = sd.setdefault(f"model.layers.{layer}.mlp.experts.{proj}", {})
        fused["w"] = torch.from_numpy(np.ascontiguousarray(a))
    # transformers 5 holds experts fused: gate_up_proj [E, 2I, H], down_proj [E, H, I]
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}.mlp.experts."
        if pre + "gate_proj" in sd:
            sd[pre + "gate_up_proj"] = torch.cat([sd.pop(pre + "gate_proj")["w"],
                                                  sd.pop(pre + "up_proj")["w"]], dim=1)
            sd[pre + "down_proj"] = sd.pop(pre + "down_proj")["w"]
    return tinygen.model_from_state(cls, cfg, sd)


def main():
    out = tinygen.cli_out(REPO, __doc__)
    tinygen.torch_setup(4)
    versions = tinygen.versions()
    tok = build_tokenizer()
    tok_fields = tokenizer_gguf_fields(tok)
    rng = np.random.default_rng(20240619)
    ids = rng.integers(3, VOCAB, size=N_PROMPT).astype(np.int32)

    # dense, tied, bf16 HF + f16 GGUF
    dense = build(Qwen3ForCausalLM, dense_config(), seed=3003)
    save_hf(dense, out / "tiny_qwen3", torch.bfloat16, tok)
    m = load_fp32(Qwen3ForCausalLM, out / "tiny_qwen3")
    assert m.config.tie_word_embeddings and m.config.head_dim == 32
    ref = reference(m, ids, "tiny_qwen3")
    if not np.array_equal(ref, reference(dense, ids, "tiny_qwen3 (in memory)")):
        raise SystemExit("tiny_qwen3: bf16 save changed the weights (not representable?)")
    save_expected(out / "tiny_qwen3" / "expected.npz", ids, ref, weights="bf16", **versions)
    write_gguf(out / "tiny_qwen3.gguf", "qwen3", dense, tok_fields, "tiny_qwen3")
    if not np.array_equal(ref, reference(model_from_gguf(out / "tiny_qwen3.gguf", Qwen3ForCausalLM,
                                                         dense.config), ids, "tiny_qwen3.gguf")):
        raise SystemExit("tiny_qwen3.gguf does not reproduce tiny_qwen3's logits")

    # MoE, norm_topk_prob true: HF + GGUF; false: GGUF (same weights)
    moe = build(Qwen3MoeForCausalLM, moe_config(True), seed=4004)
    save_hf(moe, out / "tiny_qwen3moe", torch.bfloat16, tok)
    m = load_fp32(Qwen3MoeForCausalLM, out / "tiny_qwen3moe")
    assert m.config.norm_topk_prob and m.config.num_experts == 8
    ref = reference(m, ids, "tiny_qwen3moe")
    gap = min_route_gap(m, ids)
    log(f"tiny_qwen3moe: smallest top-k routing gap {gap:.3e}")
    if gap < MIN_ROUTE_GAP:
        raise SystemExit(f"tiny_qwen3moe: routing near tie ({gap:.3e})")
    if not np.array_equal(ref, reference(moe, ids, "tiny_qwen3moe (in memory)")):
        raise SystemExit("tiny_qwen3moe: bf16 save changed the weights")
    save_expected(out / "tiny_qwen3moe" / "expected.npz", ids, ref, weights="bf16",
                  min_route_gap=gap, **versions)
    # an f16 GGUF (not kept: the fixtures stay small) must reproduce the HF
    # logits exactly: the expert stacking is checked here, before Q8_0
    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "tiny_qwen3moe.gguf"
        write_gguf(p, "qwen3moe", moe, tok_fields, "tiny_qwen3moe")
        if not np.array_equal(ref, reference(model_from_gguf(p, Qwen3MoeForCausalLM, moe.config), ids,
                                             "tiny_qwen3moe.gguf (f16, not kept)")):
            raise SystemExit("the f16 qwen3moe GGUF does not reproduce tiny_qwen3moe's logits")

    # Q8_0 GGUF of the same model (2-D and expert stacks Q8_0, as
    # convert_hf_to_gguf --outtype q8_0 writes): its own reference, on the
    # dequantized weights
    p = out / "tiny_qwen3moe_q8_0.gguf"
    write_gguf(p, "qwen3moe", moe, tok_fields, "tiny_qwen3moe_q8_0", QT.Q8_0)
    m = model_from_gguf(p, Qwen3MoeForCausalLM, moe.config)
    ref_q = reference(m, ids, p.name)
    gap_q = min_route_gap(m, ids)
    log(f"{p.name}: Q8_0 moves logits by rel {rel_err(ref_q, ref):.2e}; smallest routing gap {gap_q:.3e}")
    if gap_q < MIN_ROUTE_GAP:
        raise SystemExit(f"{p.name}: routing near tie ({gap_q:.3e})")
    save_expected(out / "tiny_qwen3moe_q8_0.expected.npz", ids, ref_q, weights="q8_0",
                  min_route_gap=gap_q, **versions)

    # the same weights with norm_topk_prob false (the e2e test points a
    # copy of tiny_qwen3moe's config.json at them)
    m = Qwen3MoeForCausalLM.from_pretrained(out / "tiny_qwen3moe", attn_implementation="eager",
                                            norm_topk_prob=False).float().eval()
    assert not m.config.norm_topk_prob
    ref_n = reference(m, ids, "tiny_qwen3moe, norm_topk_prob false")
    e = rel_err(ref_n, ref)
    log(f"norm_topk_prob false moves logits by rel {e:.2e}")
    if not e > 1e-2:
        raise SystemExit("norm_topk_prob makes no difference: the fixture would not test it")
    save_expected(out / "tiny_qwen3moe_nonorm.expected.npz", ids, ref_n, weights="bf16",
                  min_route_gap=gap, **versions)
    # tiny_qwen3's weights with YaRN as Qwen3's docs configure it (the e2e
    # test edits a copy of the config and adds the GGUF keys)
    m = load_fp32(Qwen3ForCausalLM, out / "tiny_qwen3")
    cfg = m.config
    cfg.rope_parameters = dict(QWEN3_YARN, rope_theta=1000000.0)
    cfg.max_position_embeddings = 4096
    my = tinygen.model_from_state(Qwen3ForCausalLM, cfg, m.state_dict())
    ref_y = reference(my, ids, "tiny_qwen3, YaRN")
    e = rel_err(np.load(out / "tiny_qwen3" / "expected.npz")["logits"], ref_y)
    log(f"YaRN {QWEN3_YARN} moves tiny_qwen3's logits by rel {e:.2e}")
    if not e > 1e-2:
        raise SystemExit("YaRN makes no difference: the fixture would not test it")
    save_expected(out / "tiny_qwen3_yarn.expected.npz", ids, ref_y, weights="bf16", plain_rope_rel=e,
                  rope=json.dumps(QWEN3_YARN, sort_keys=True), config=json.dumps({"max_position_embeddings": 4096}),
                  **versions)
    log(f"wrote tiny_qwen3 and tiny_qwen3moe (+ nonorm, yarn references) into {out}")


if __name__ == "__main__":
    main()
