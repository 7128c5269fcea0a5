#!/usr/bin/env python3
"""gen_tiny_llama3.py — tiny random Llama 3.x, Mistral and Qwen2 models and
their reference logits (issue 19).

Writes into OUT (default tests/data), each model fp32:

  tiny_llama3/       LlamaForCausalLM, tied head (like Llama 3.2 1B/3B),
                     rope_parameters {"rope_type": "llama3", factor 8,
                     low_freq_factor 1, high_freq_factor 4,
                     original_max_position_embeddings 64} at rope_theta 1e4,
                     head_dim 16: pair 0 keeps its frequency, pairs 1-2 are
                     blended, pairs 3-7 are divided by 8, so within the
                     32-token test the scaling changes the logits.
  tiny_llama3.gguf   the same as llama.cpp's convert_hf_to_gguf.py writes it:
                     llama.* keys (no rope.scaling.type), Q/K permuted,
                     rope_freqs.weight F32 [8] computed as LlamaModel.
                     generate_extra_tensors does, no output.weight (tied).
  tiny_mistral/      MistralForCausalLM, sliding_window 8, untied.
  tiny_mistral.gguf  llama.cpp converts Mistral as "llama" and keeps no
                     window; its expected logits (tiny_mistral.gguf.expected.
                     npz) are the same weights with sliding_window None, i.e.
                     what llama.cpp computes.
  tiny_qwen2/        Qwen2ForCausalLM, q/k/v biases, tied head, rope_theta 1e6.
  tiny_qwen2.gguf    "qwen2" keys and names, Q/K not permuted (NEOX RoPE),
                     attn_{q,k,v}.bias F32, no output.weight.
  tiny_qwen2_yarn.expected.npz, tiny_qwen2_yarn_params.expected.npz,
  tiny_llama_linear.expected.npz
                     tiny_qwen2's / tiny_llama3's weights with the RoPE
                     scalings of SCALED (YaRN as Qwen configures it, YaRN
                     with every optional parameter, linear 2); the meta
                     holds the RoPE object and config fields (the e2e test
                     edits a copy of the HF config).
  tiny_qwen2_yarn.gguf, tiny_llama_linear.gguf
                     those weights with the rope.scaling.* keys llama.cpp's
                     converter writes (Q/K permuted for llama).
  <dir>/expected.npz, <name>.gguf.expected.npz
                     ids int32 [32], logits float32 [32][512] from
                     transformers in fp32 (prefill; checked against
                     step-by-step decode).

Checks done here: prefill == decode (1e-5 rel); the GGUFs read back (Q/K
un-permuted where permuted; rope_freqs checked against transformers'
inv_freq) reproduce the HF logits; the llama3 / sliding-window / linear /
YaRN settings change the logits (so the tests can fail).

Usage: gen_tiny_llama3.py [--out DIR]
"""
from __future__ import annotations

import copy
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import gguf  # noqa: E402
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig,  # noqa: E402
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

import tinygen  # noqa: E402
from gen_tiny_llama import (VOCAB, N_PROMPT, build_tokenizer, rope_permute,  # noqa: E402
                            rope_unpermute, tokenizer_gguf_fields)
from tinygen import prefill_logits, rel_err, save_expected  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WEIGHT_STD, EMBED_STD, NORM_JITTER, BIAS_STD = 0.1, 0.5, 0.2, 0.5
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
DIMS = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, hidden_act="silu", bos_token_id=1, eos_token_id=2)
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_MAP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}


# (name, weights, class, RoPE object, other config fields, Q/K permuted in
# GGUF): scaled RoPE on tiny_qwen2's / tiny_llama3's weights. YaRN as Qwen's
# docs configure it (factor 4, original 1024 at theta 1e6, head_dim 16: the
# ramp rounds to pairs 0..3, pair 0 kept, 3.. interpolated, cos/sin times
# 0.1 ln 4 + 1); then every optional parameter set (no rounding of the ramp:
# 0.94..2.95 at beta 32 / 1, here 1.26..3.6). Linear: positions / 2.
SCALED = [
    ("tiny_qwen2_yarn", "tiny_qwen2", Qwen2ForCausalLM,
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
     {"max_position_embeddings": 4096}, False),
    ("tiny_qwen2_yarn_params", "tiny_qwen2", Qwen2ForCausalLM,
     {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024, "beta_fast": 16.0,
      "beta_slow": 2.0, "attention_factor": 1.25, "truncate": False},
     {"max_position_embeddings": 8192}, False),
    ("tiny_llama_linear", "tiny_llama3", LlamaForCausalLM, {"rope_type": "linear", "factor": 2.0}, {}, True),
]
SCALED_GGUF = ("tiny_qwen2_yarn", "tiny_llama_linear")


def log(*a):
    print("[gen_tiny_llama3]", *a, file=sys.stderr)


def gguf_name(hf: str) -> str:
    if hf in GLOBAL_MAP:
        return GLOBAL_MAP[hf]
    p = hf.split(".")
    return f"blk.{p[2]}." + LAYER_MAP[".".join(p[3:])]


def randomize(model, seed: int):
    tinygen.randomize(model, seed, WEIGHT_STD, EMBED_STD, NORM_JITTER, BIAS_STD)
    model.set_attn_implementation("eager")
    return model.float().eval()


def reference(model, ids, what: str) -> np.ndarray:
    return tinygen.reference(model, ids, what, log)


def save_hf(model, path: Path, tok):
    tinygen.save_hf(model, path, tok, model_max_length=256)


def llama3_rope_factors(rp: dict, dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: one divisor
    per frequency (1 high, factor low, a blend between)."""
    freqs = 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    low_wl, high_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def write_gguf(path: Path, model, arch: str, permute: bool, tok_fields: dict, rope_freqs=None, rope_scaling=None):
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = cfg.hidden_size // n_head
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    w.add_type("model")
    tinygen.gguf_add_llama_keys(w, arch, cfg)
    w.add_uint32("general.file_type", 0)
    if rope_scaling is not None:  # TextModel.set_gguf_parameters: type, factor, then YaRN's keys
        w.add_string(f"{arch}.rope.scaling.type", rope_scaling["rope_type"])
        w.add_float32(f"{arch}.rope.scaling.factor", float(rope_scaling["factor"]))
        if rope_scaling["rope_type"] == "yarn":
            w.add_uint32(f"{arch}.rope.scaling.original_context_length",
                         rope_scaling["original_max_position_embeddings"])
            for hf, key in (("attention_factor", "yarn_attn_factor"), ("beta_fast", "yarn_beta_fast"),
                            ("beta_slow", "yarn_beta_slow")):
                if hf in rope_scaling:
                    w.add_float32(f"{arch}.rope.scaling.{key}", float(rope_scaling[hf]))
    if arch == "llama":  # LlamaModel.set_gguf_parameters; Qwen2Model writes neither
        w.add_uint32("llama.vocab_size", cfg.vocab_size)
        w.add_uint32("llama.rope.dimension_count", head_dim)
    tinygen.gguf_add_tokenizer(w, tok_fields)
    if rope_freqs is not None:  # the converter yields it before the model's tensors
        w.add_tensor("rope_freqs.weight", np.ascontiguousarray(rope_freqs, dtype=np.float32))
    order = ["model.embed_tokens.weight"]
    for i in range(cfg.num_hidden_layers):
        order += [f"model.layers.{i}.{k}" for k in LAYER_MAP if f"model.layers.{i}.{k}" in sd]
    order += ["model.norm.weight"] + (["lm_head.weight"] if "lm_head.weight" in sd else [])
    assert sorted(order) == sorted(sd), (sorted(order), sorted(sd))
    for hf in order:
        t = sd[hf]
        if permute and hf.endswith("q_proj.weight"):
            t = rope_permute(t, n_head)
        elif permute and hf.endswith("k_proj.weight"):
            t = rope_permute(t, n_kv)
        w.add_tensor(gguf_name(hf), np.ascontiguousarray(t, dtype=np.float32))
    tinygen.gguf_finish(w)


def model_from_gguf(path: Path, cls, cfg, permuted: bool):
    """The GGUF's tensors back in an HF model (Q/K un-permuted)."""
    inv = {gguf_name(k): k for k in GLOBAL_MAP}
    for i in range(cfg.num_hidden_layers):
        for k in LAYER_MAP:
            inv[gguf_name(f"model.layers.{i}.{k}")] = f"model.layers.{i}.{k}"
    sd, extra = {}, {}
    for t in gguf.GGUFReader(str(path)).tensors:
        a = np.array(t.data, dtype=np.float32).reshape(tuple(int(x) for x in reversed(t.shape.tolist())))
        if t.name not in inv:
            extra[t.name] = a
            continue
        hf = inv[t.name]
        if permuted and hf.endswith("q_proj.weight"):
            a = rope_unpermute(a, cfg.num_attention_heads)
        elif permuted and hf.endswith("k_proj.weight"):
            a = rope_unpermute(a, cfg.num_key_value_heads)
        sd[hf] = torch.from_numpy(np.ascontiguousarray(a))
    return tinygen.model_from_state(cls, cfg, sd), extra


def main():
    out = tinygen.cli_out(REPO, __doc__)
    tinygen.torch_setup(4)
    versions = tinygen.versions(with_gguf=False, with_numpy=False)
    tok = build_tokenizer()
    tok_fields = tokenizer_gguf_fields(tok)
    rng = np.random.default_rng(20240601)
    ids = rng.integers(3, VOCAB, size=N_PROMPT).astype(np.int32)

    # ---- Llama 3.x: llama3 RoPE scaling, tied head
    cfg = LlamaConfig(**DIMS, rope_parameters=dict(LLAMA3_ROPE), tie_word_embeddings=True)
    torch.manual_seed(31)
    m = randomize(LlamaForCausalLM(cfg), 31)
    save_hf(m, out / "tiny_llama3", tok)
    m = LlamaForCausalLM.from_pretrained(out / "tiny_llama3", attn_implementation="eager").float().eval()
    ref = reference(m, ids, "tiny_llama3")
    plain = copy.deepcopy(m.config)
    plain.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    m_plain = LlamaForCausalLM(plain).float().eval()
    m_plain.set_attn_implementation("eager")
    m_plain.load_state_dict(m.state_dict())
    e = rel_err(prefill_logits(m_plain, ids), ref)
    log(f"tiny_llama3: llama3 scaling moves logits by rel {e:.2e} against plain RoPE")
    if not e > 1e-2:
        raise SystemExit("tiny_llama3: the llama3 scaling does not matter within the test")
    save_expected(out / "tiny_llama3" / "expected.npz", ids, ref, weights="f32", plain_rope_rel=e, **versions)
    rf = llama3_rope_factors(LLAMA3_ROPE, 16)
    inv_hf = m.model.rotary_emb.inv_freq.numpy()
    inv0 = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)).numpy()
    log(f"tiny_llama3: rope_freqs {rf.tolist()}; inv_freq/rf vs transformers: "
        f"{float(np.max(np.abs(inv0 / rf - inv_hf) / inv_hf)):.2e}")
    assert np.allclose(inv0 / rf, inv_hf, rtol=1e-6, atol=0)
    p = out / "tiny_llama3.gguf"
    write_gguf(p, m, "llama", True, tok_fields, rope_freqs=rf)
    mg, extra = model_from_gguf(p, LlamaForCausalLM, m.config, True)
    assert np.array_equal(extra["rope_freqs.weight"], rf)
    if not np.array_equal(reference(mg, ids, p.name), ref):
        raise SystemExit("tiny_llama3.gguf does not round-trip")

    # ---- Mistral: sliding window 8 on every layer
    cfg = MistralConfig(**DIMS, rope_theta=10000.0, sliding_window=8, tie_word_embeddings=False)
    torch.manual_seed(41)
    m = randomize(MistralForCausalLM(cfg), 41)
    save_hf(m, out / "tiny_mistral", tok)
    m = MistralForCausalLM.from_pretrained(out / "tiny_mistral", attn_implementation="eager").float().eval()
    ref = reference(m, ids, "tiny_mistral")
    full = copy.deepcopy(m.config)
    full.sliding_window = None
    m_full = MistralForCausalLM(full).float().eval()
    m_full.set_attn_implementation("eager")
    m_full.load_state_dict(m.state_dict())
    ref_full = reference(m_full, ids, "tiny_mistral (no window)")
    e = rel_err(ref_full, ref)
    log(f"tiny_mistral: the window moves logits by rel {e:.2e}; first 8 rows equal: "
        f"{np.array_equal(ref_full[:8], ref[:8])}")
    if not e > 1e-2:
        raise SystemExit("tiny_mistral: the window does not matter within the test")
    save_expected(out / "tiny_mistral" / "expected.npz", ids, ref, weights="f32", no_window_rel=e, **versions)
    p = out / "tiny_mistral.gguf"
    write_gguf(p, m, "llama", True, tok_fields)
    mg, _ = model_from_gguf(p, MistralForCausalLM, full, True)
    if not np.array_equal(reference(mg, ids, p.name), ref_full):
        raise SystemExit("tiny_mistral.gguf does not round-trip")
    save_expected(out / "tiny_mistral.gguf.expected.npz", ids, ref_full, weights="f32", window=None, **versions)

    # ---- Qwen2: q/k/v biases, tied head, rope_theta 1e6
    cfg = Qwen2Config(**DIMS, rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False)
    torch.manual_seed(51)
    m = randomize(Qwen2ForCausalLM(cfg), 51)
    save_hf(m, out / "tiny_qwen2", tok)
    m = Qwen2ForCausalLM.from_pretrained(out / "tiny_qwen2", attn_implementation="eager").float().eval()
    assert m.model.layers[0].self_attn.o_proj.bias is None and m.model.layers[0].self_attn.q_proj.bias is not None
    ref = reference(m, ids, "tiny_qwen2")
    save_expected(out / "tiny_qwen2" / "expected.npz", ids, ref, weights="f32", **versions)
    p = out / "tiny_qwen2.gguf"
    write_gguf(p, m, "qwen2", False, tok_fields)
    mg, _ = model_from_gguf(p, Qwen2ForCausalLM, m.config, False)
    if not np.array_equal(reference(mg, ids, p.name), ref):
        raise SystemExit("tiny_qwen2.gguf does not round-trip")
    qwen2 = m

    # ---- RoPE scaling on these weights: YaRN on tiny_qwen2 (the e2e test
    # edits a copy of its config.json), linear on tiny_llama3's weights
    for name, base, cls, rope, extra, permute in SCALED:
        src = qwen2 if base == "tiny_qwen2" else LlamaForCausalLM.from_pretrained(
            out / base, attn_implementation="eager").float().eval()
        cfg = copy.deepcopy(src.config)
        theta = float(cfg.rope_parameters["rope_theta"])
        cfg.rope_parameters = dict(rope, rope_theta=theta)
        for k, v in extra.items():
            setattr(cfg, k, v)
        ms = cls(cfg).float().eval()
        ms.set_attn_implementation("eager")
        ms.load_state_dict(src.state_dict())
        ref_s = reference(ms, ids, name)
        plain = copy.deepcopy(cfg)
        plain.rope_parameters = {"rope_type": "default", "rope_theta": theta}
        mp = cls(plain).float().eval()
        mp.set_attn_implementation("eager")
        mp.load_state_dict(src.state_dict())
        e = rel_err(prefill_logits(mp, ids), ref_s)
        log(f"{name}: {rope} moves logits by rel {e:.2e} against plain RoPE")
        if not e > 1e-2:
            raise SystemExit(f"{name}: the scaling does not matter within the test")
        save_expected(out / f"{name}.expected.npz", ids, ref_s, weights="f32", plain_rope_rel=e,
                      rope=json.dumps(rope, sort_keys=True), config=json.dumps(extra, sort_keys=True), **versions)
        if name in SCALED_GGUF:
            p = out / f"{name}.gguf"
            write_gguf(p, ms, "llama" if permute else "qwen2", permute, tok_fields, rope_scaling=rope)
            mg, _ = model_from_gguf(p, cls, cfg, permute)
            if not np.array_equal(reference(mg, ids, p.name), ref_s):
                raise SystemExit(f"{p.name} does not round-trip")
    # the YaRN variants differ from each other too (each parameter is read)
    yr = [np.load(out / f"{n}.expected.npz")["logits"] for n in ("tiny_qwen2_yarn", "tiny_qwen2_yarn_params")]
    e = rel_err(yr[1], yr[0])
    log(f"tiny_qwen2_yarn_params vs tiny_qwen2_yarn: rel {e:.2e}")
    if not e > 1e-2:
        raise SystemExit("the explicit YaRN parameters do not matter within the test")
    log(f"wrote tiny_llama3, tiny_mistral, tiny_qwen2 (+ .gguf), {', '.join(s[0] for s in SCALED)} into {out}")


if __name__ == "__main__":
    main()
