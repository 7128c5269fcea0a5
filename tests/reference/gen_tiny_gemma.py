#!/usr/bin/env python3
"""gen_tiny_gemma.py — tiny random Gemma 2 and Gemma 3 (text) models and
their reference logits.

Writes into OUT (default tests/data):

  tiny_gemma2/       HF dir, fp32, Gemma2ForCausalLM: 3 layers (sliding,
                     full, sliding; sliding_window 8, so the 32-token prompt
                     exercises it), hidden 32, 4 heads / 2 KV heads of
                     head_dim 16, GeGLU MLP 64, sandwich norms, tied head,
                     attention soft-cap 5 and final soft-cap 3 (low enough to
                     bite: the script checks that dropping either moves the
                     logits), query_pre_attn_scalar = head_dim
  tiny_gemma2.gguf   llama.cpp's gemma2 GGUF of the same weights
                     (convert_hf_to_gguf Gemma2Model: gemma2.* keys, norms
                     stored + 1, no lm_head, Q/K not permuted), f32
  tiny_gemma3/       HF dir, fp32, Gemma3ForCausalLM (model_type
                     gemma3_text): 6 layers (five sliding, one full:
                     sliding_window_pattern 6; window 8), hidden 32, 2 heads /
                     2 KV heads of head_dim 16, per-head q/k norms, sliding
                     layers' RoPE base 10000 (llama.cpp hard-codes it) and
                     global layers' base 100 with linear scaling 4 (a small
                     base so 32 positions rotate visibly),
                     query_pre_attn_scalar 24 (not head_dim: the attention
                     scale is tested), no soft-caps (as released)
  tiny_gemma3.gguf   llama.cpp's gemma3 GGUF of the same weights (gemma3.*
                     keys, rope.scaling.type linear / factor 4, norms + 1, q/k
                     norms included). The file has no query_pre_attn_scalar:
                     llama.cpp scales by head_dim^-1/2 (except the 27B), so
                     its reference is the same weights with
                     query_pre_attn_scalar = head_dim ->
                     tiny_gemma3.gguf.expected.npz
  <dir>/expected.npz ids int32 [32], logits float32 [32][512]; transformers
                     fp32, attn_implementation "eager" (sdpa ignores the
                     attention soft-cap)

Checks done here (the script fails if any does not hold):
  * prefill logits == step-by-step decode with a cache (1e-5 rel)
  * each GGUF read back (norms - 1) reproduces its reference bit for bit
  * Gemma 2: disabling the attention / final soft-cap changes the logits by
    more than 5% (rel), so a forward pass without them fails the tests;
    Gemma 3: a single RoPE base, or head_dim^-1/2, changes them likewise.

The embedding scale: transformers multiplies by sqrt(hidden) as a tensor of
the model's dtype (bf16 for a bf16 checkpoint: sqrt(3584) = 59.87 -> 60.0);
llama.cpp by sqrtf(n_embd) in f32. The fixtures are fp32 (hidden 32:
5.656854 either way); the engine follows the HF config's dtype.

Usage: gen_tiny_gemma.py [--out DIR]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import gguf  # noqa: E402
import transformers  # noqa: E402
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM,  # noqa: E402
                          Gemma3TextConfig)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinygen  # noqa: E402
from gen_tiny_llama import VOCAB, build_tokenizer, tokenizer_gguf_fields  # noqa: E402
from tinygen import prefill_logits, rel_err, save_expected  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
N_PROMPT = 32
PROMPT_SEED = 1234
WEIGHT_STD = 0.1
QK_STD = 0.35       # Gemma 2's q/k: scores large enough for the soft-cap to bite
EMBED_STD = 0.5
NORM_STD = 0.2      # Gemma norms are stored as w (the model uses 1 + w)

LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def log(*a):
    print("[gen_tiny_gemma]", *a, file=sys.stderr)


def gemma2_config(**over) -> Gemma2Config:
    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
              rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=16,
              sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
              tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw.update(over)
    return Gemma2Config(**kw)


def gemma3_config(**over) -> Gemma3TextConfig:
    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
              num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
              rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
              sliding_window=8, final_logit_softcapping=None, attn_logit_softcapping=None,
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100.0}},
              tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw.update(over)
    return Gemma3TextConfig(**kw)


def init_weights(model, seed: int, qk_std: float):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(NORM_STD * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(EMBED_STD * torch.randn(p.shape, generator=g))
            elif "q_proj" in name or "k_proj" in name:
                p.copy_(qk_std * torch.randn(p.shape, generator=g))
            else:
                p.copy_(WEIGHT_STD * torch.randn(p.shape, generator=g))
    return model.float().eval()


def make(cls, cfg, state=None, seed=0, qk_std=WEIGHT_STD):
    torch.manual_seed(seed)
    m = cls(cfg)
    m.set_attn_implementation("eager")
    if state is None:
        return init_weights(m, seed, qk_std)
    m.load_state_dict(state)
    return m.float().eval()


def reference(model, ids, what: str) -> np.ndarray:
    return tinygen.reference(model, ids, what, log)


def must_differ(what: str, ref: np.ndarray, other: np.ndarray):
    e = rel_err(other, ref)
    log(f"{what}: rel change {e:.3f}")
    if not e > 0.05:
        raise SystemExit(f"{what}: changes the logits by only {e:.3g}: the fixture would not test it")


def save_hf(model, path: Path, tok):
    tinygen.save_hf(model, path, tok, clear=True)


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    parts = hf.split(".")
    assert parts[:2] == ["model", "layers"], hf
    return f"blk.{parts[2]}." + LAYER_MAP[".".join(parts[3:])]


def write_gguf(path: Path, model, arch: str, tok_fields: dict, name: str):
    """convert_hf_to_gguf's Gemma2Model / Gemma3Model, f32."""
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    sd.pop("lm_head.weight", None)  # the converter skips it: the head is tied
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_type("model")
    a = arch
    w.add_uint32(f"{a}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{a}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{a}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{a}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{a}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{a}.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", float(cfg.rms_norm_eps))
    w.add_uint32(f"{a}.attention.key_length", cfg.head_dim)
    w.add_uint32(f"{a}.attention.value_length", cfg.head_dim)
    w.add_uint32("general.file_type", 0)
    if arch == "gemma2":
        # Gemma2Model writes no rope.freq_base: llama.cpp's default 10000
        assert cfg.rope_parameters["rope_theta"] == 10000.0
        w.add_float32(f"{a}.attn_logit_softcapping", float(cfg.attn_logit_softcapping))
        w.add_float32(f"{a}.final_logit_softcapping", float(cfg.final_logit_softcapping))
        w.add_uint32(f"{a}.attention.sliding_window", cfg.sliding_window)
    else:
        full = cfg.rope_parameters["full_attention"]
        # the sliding layers' base is not written: llama.cpp hard-codes
        # 10000, the tiny model's too
        assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
        w.add_float32(f"{a}.rope.freq_base", float(full["rope_theta"]))
        w.add_string(f"{a}.rope.scaling.type", "linear")
        w.add_float32(f"{a}.rope.scaling.factor", float(full["factor"]))
        w.add_uint32(f"{a}.attention.sliding_window", cfg.sliding_window)
    tinygen.gguf_add_tokenizer(w, tok_fields)
    order = ["model.embed_tokens.weight"]
    for i in range(cfg.num_hidden_layers):
        order += [f"model.layers.{i}.{k}" for k in LAYER_MAP if f"model.layers.{i}.{k}" in sd]
    order += ["model.norm.weight"]
    assert sorted(order) == sorted(sd), (sorted(order), sorted(sd))
    for hf in order:
        t = sd[hf]
        if hf.endswith("norm.weight"):
            t = t + np.float32(1.0)  # Gemma RMSNorm's (1 + w), as the converter stores it
        w.add_tensor(gguf_name(hf), np.ascontiguousarray(t, dtype=np.float32))
    tinygen.gguf_finish(w)


def check_gguf(path: Path, model, ids, ref: np.ndarray):
    """The GGUF's tensors, norms - 1, back in an HF model: the same logits, bit for bit."""
    r = gguf.GGUFReader(str(path))
    back = {t.name: np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
            for t in r.tensors}
    sd = {}
    for hf, v in model.state_dict().items():
        if hf == "lm_head.weight":
            continue
        t = back.pop(gguf_name(hf))
        if hf.endswith("norm.weight"):
            t = t - np.float32(1.0)
        sd[hf] = torch.from_numpy(t.copy())
    assert not back, f"unexpected tensors in {path.name}: {sorted(back)}"
    m = make(type(model), model.config, state={**sd, "lm_head.weight": sd["model.embed_tokens.weight"]})
    got = prefill_logits(m, ids)
    if not np.array_equal(got, ref):
        raise SystemExit(f"{path.name}: read back differs from its reference by {rel_err(got, ref):.3g}")
    log(f"{path.name}: read back (norms - 1) reproduces its reference bit for bit")


def main():
    out = tinygen.cli_out(REPO)
    tinygen.torch_setup(8, deterministic=False)
    log(f"transformers {transformers.__version__}, torch {torch.__version__}")
    tok = build_tokenizer()
    tok_fields = tokenizer_gguf_fields(tok)
    ids = np.random.default_rng(PROMPT_SEED).integers(3, VOCAB, size=N_PROMPT).astype(np.int32)
    common = {"transformers": transformers.__version__, "torch": torch.__version__}

    # ---- Gemma 2
    m2 = make(Gemma2ForCausalLM, gemma2_config(), seed=31, qk_std=QK_STD)
    d = out / "tiny_gemma2"
    save_hf(m2, d, tok)
    m2r = make(Gemma2ForCausalLM, Gemma2Config.from_pretrained(d),
               state=Gemma2ForCausalLM.from_pretrained(d).state_dict())
    ref2 = reference(m2r, ids, "tiny_gemma2")
    sd2 = m2.state_dict()
    must_differ("gemma2 without the attention soft-cap", ref2,
                prefill_logits(make(Gemma2ForCausalLM, gemma2_config(attn_logit_softcapping=None), sd2), ids))
    must_differ("gemma2 without the final soft-cap", ref2,
                prefill_logits(make(Gemma2ForCausalLM, gemma2_config(final_logit_softcapping=None), sd2), ids))
    must_differ("gemma2 without the sliding window", ref2,
                prefill_logits(make(Gemma2ForCausalLM, gemma2_config(sliding_window=64), sd2), ids))
    save_expected(d / "expected.npz", ids, ref2, source="tiny_gemma2 fp32 eager", **common)
    gp = out / "tiny_gemma2.gguf"
    write_gguf(gp, m2, "gemma2", tok_fields, "tiny_gemma2")
    check_gguf(gp, m2, ids, ref2)  # same weights and settings: tiny_gemma2/expected.npz

    # ---- Gemma 3
    m3 = make(Gemma3ForCausalLM, gemma3_config(), seed=47)
    d = out / "tiny_gemma3"
    save_hf(m3, d, tok)
    cj = json.loads((d / "config.json").read_text())
    assert cj["model_type"] == "gemma3_text" and cj["architectures"] == ["Gemma3ForCausalLM"], cj
    m3r = make(Gemma3ForCausalLM, Gemma3TextConfig.from_pretrained(d),
               state=Gemma3ForCausalLM.from_pretrained(d).state_dict())
    ref3 = reference(m3r, ids, "tiny_gemma3")
    sd3 = m3.state_dict()
    one_base = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100.0}}
    must_differ("gemma3 with one RoPE base", ref3,
                prefill_logits(make(Gemma3ForCausalLM, gemma3_config(rope_parameters=one_base), sd3), ids))
    unscaled = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 100.0}}
    must_differ("gemma3 without linear scaling", ref3,
                prefill_logits(make(Gemma3ForCausalLM, gemma3_config(rope_parameters=unscaled), sd3), ids))
    m3g = make(Gemma3ForCausalLM, gemma3_config(query_pre_attn_scalar=16), sd3)
    ref3g = reference(m3g, ids, "tiny_gemma3 (query_pre_attn_scalar = head_dim, as llama.cpp)")
    must_differ("gemma3 with head_dim^-1/2", ref3, ref3g)
    save_expected(d / "expected.npz", ids, ref3, source="tiny_gemma3 fp32 eager", **common)
    gp = out / "tiny_gemma3.gguf"
    write_gguf(gp, m3, "gemma3", tok_fields, "tiny_gemma3")
    check_gguf(gp, m3g, ids, ref3g)
    save_expected(out / "tiny_gemma3.gguf.expected.npz", ids, ref3g,
                  source="tiny_gemma3 weights, query_pre_attn_scalar = head_dim, fp32 eager", **common)

    tot = sum(f.stat().st_size for p in ["tiny_gemma2", "tiny_gemma3"] for f in (out / p).iterdir())
    tot += sum((out / f).stat().st_size for f in ["tiny_gemma2.gguf", "tiny_gemma3.gguf",
                                                    "tiny_gemma3.gguf.expected.npz"])
    log(f"total fixture bytes {tot}")


if __name__ == "__main__":
    main()
