#!/usr/bin/env python3
"""gen_tiny_phi3.py — tiny random Phi-3 models and their reference logits.

Writes into OUT (default tests/data):

  tiny_phi3/               HF dir, bf16: Phi3ForCausalLM, plain RoPE,
                           sliding_window 12 (so a 32-token prompt exercises
                           the window on every layer), GQA 4/2 heads, fused
                           qkv_proj / gate_up_proj as transformers saves them
  tiny_phi3_f16.gguf       the same weights laid out the way llama.cpp's
  tiny_phi3_q8_0.gguf      convert_hf_to_gguf.py (Phi3MiniModel) writes a
                           Phi-3: phi3.* keys, fused blk.N.attn_qkv.weight and
                           blk.N.ffn_up.weight (2*ff rows, gate first), Q/K
                           not permuted (NEOX), norms F32, 2-D weights f16 /
                           q8_0, phi3.attention.sliding_window
  tiny_phi3_longrope/      HF dir, bf16: rope_parameters type "longrope"
                           with short/long factors far from 1,
                           partial_rotary_factor 0.75 (12 of 16 dims rotate,
                           6 factors), original_max_position_embeddings 16,
                           max_position_embeddings 64, no sliding window. A
                           32-token prompt is longer than 16, so transformers
                           uses the long factors; the engine's context (64)
                           is too, so it picks them as well. Attention
                           factor sqrt(1 + ln 4 / ln 16).
  tiny_phi3_longrope_f16.gguf  its GGUF: rope_factors_long/short.weight,
                           phi3.rope.scaling.attn_factor and
                           .original_context_length, rope.dimension_count 12
  tiny_phi3_longrope_short/  the same weights (model.safetensors is a
                           symlink) with a transformers-4.x config
                           ("rope_scaling" type "su", top-level rope_theta and
                           original_max_position_embeddings = 64 =
                           max_position_embeddings): the short factors apply,
                           attention factor 1
  <model>/expected.npz, <gguf>.expected.npz
                           ids int32 [32], logits float32 [32][512] from
                           transformers in fp32 on exactly the stored weights
                           (bf16 upcast; GGUF tensors dequantized by gguf and
                           split back into qkv_proj / gate_up_proj)
  tiny_phi3_manifest.json  the models above

Checks here: prefill == step-by-step decode (plain models only: transformers
switches longrope factor sets mid-sequence when decoding past the original
context, a behaviour the engine deliberately does not copy), the f16 GGUF
round trip stays within 1e-4 of the HF reference (f16 rounds only the few
weights it holds as subnormals), the long and short references differ.

Usage: gen_tiny_phi3.py [--out DIR]
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from transformers import Phi3Config, Phi3ForCausalLM  # noqa: E402

import tinygen  # noqa: E402
from gen_tiny_llama import N_PROMPT, VOCAB, build_tokenizer, tokenizer_gguf_fields  # noqa: E402
from tinygen import rel_err, save_expected  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WEIGHT_STD, EMBED_STD, NORM_JITTER = 0.1, 0.5, 0.2
HIDDEN, FF, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS


def log(*a):
    print("[gen_tiny_phi3]", *a, file=sys.stderr)


def long_factors(n: int):
    # distinct, far from 1: a loader that drops or swaps them fails
    short = [round(1.0 + 0.35 * i, 4) for i in range(n)]
    long = [round(1.5 + 1.7 * i * i, 4) for i in range(n)]
    return short, long


def phi3_config(longrope: bool) -> Phi3Config:
    kw = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rms_norm_eps=1e-5,
              tie_word_embeddings=False, hidden_act="silu", bos_token_id=1, eos_token_id=2,
              pad_token_id=0, attention_bias=False)
    if not longrope:
        return Phi3Config(max_position_embeddings=128, original_max_position_embeddings=128,
                          sliding_window=12,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **kw)
    n = int(HEAD_DIM * 0.75) // 2
    short, long = long_factors(n)
    return Phi3Config(max_position_embeddings=64, original_max_position_embeddings=16, sliding_window=None,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 5000.0,
                                       "partial_rotary_factor": 0.75, "short_factor": short,
                                       "long_factor": long, "original_max_position_embeddings": 16},
                      **kw)


def build_model(seed: int, longrope: bool) -> Phi3ForCausalLM:
    torch.manual_seed(seed)
    model = Phi3ForCausalLM(phi3_config(longrope))
    model.set_attn_implementation("eager")
    tinygen.randomize(model, seed, WEIGHT_STD, EMBED_STD, NORM_JITTER)
    # round to bf16 now: the HF dir (bf16) and the GGUFs (f16 holds every
    # bf16 value in this range exactly) then store the same weights
    # (parameters only: the RoPE buffers stay f32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model.float().eval()


def load_fp32(path: Path) -> Phi3ForCausalLM:
    return Phi3ForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()


def save_hf(model, path: Path, tok):
    tinygen.save_hf(model, path, tok, torch.bfloat16)


# ---------------------------------------------------------------------- GGUF
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_MAP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}


def gguf_name(hf: str) -> str:
    if hf in GLOBAL_MAP:
        return GLOBAL_MAP[hf]
    p = hf.split(".")
    return f"blk.{p[2]}." + LAYER_MAP[".".join(p[3:])]


def write_gguf(path: Path, model, qtype: QT, ftype: int, tok_fields: dict, name: str):
    """Phi3MiniModel's keys and tensors (convert_hf_to_gguf.py)."""
    cfg = model.config
    rp = cfg.rope_parameters
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    prf = rp.get("partial_rotary_factor", 1.0)
    rope_dims = int(prf * cfg.hidden_size) // cfg.num_attention_heads
    orig = rp.get("original_max_position_embeddings", cfg.original_max_position_embeddings)
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_name(name)
    w.add_type("model")
    w.add_uint32("phi3.context_length", cfg.max_position_embeddings)
    w.add_uint32("phi3.rope.scaling.original_context_length", orig)
    w.add_uint32("phi3.embedding_length", cfg.hidden_size)
    w.add_uint32("phi3.feed_forward_length", cfg.intermediate_size)
    w.add_uint32("phi3.block_count", cfg.num_hidden_layers)
    w.add_uint32("phi3.attention.head_count", cfg.num_attention_heads)
    w.add_uint32("phi3.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_float32("phi3.attention.layer_norm_rms_epsilon", float(cfg.rms_norm_eps))
    w.add_uint32("phi3.rope.dimension_count", rope_dims)
    w.add_float32("phi3.rope.freq_base", float(rp["rope_theta"]))
    w.add_uint32("general.file_type", ftype)
    w.add_uint32("phi3.attention.sliding_window", cfg.sliding_window or 0)
    long_f = rp.get("long_factor")
    if long_f:
        scale = cfg.max_position_embeddings / orig
        attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        w.add_float32("phi3.rope.scaling.attn_factor", attn)
    tinygen.gguf_add_tokenizer(w, tok_fields)
    if long_f:  # the converter's generate_extra_tensors come first
        w.add_tensor("rope_factors_long.weight", np.asarray(long_f, dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rp["short_factor"], dtype=np.float32))
    order = ["model.embed_tokens.weight"]
    for i in range(cfg.num_hidden_layers):
        order += [f"model.layers.{i}.{k}" for k in LAYER_MAP]
    order += ["model.norm.weight", "lm_head.weight"]
    assert sorted(order) == sorted(sd), (sorted(order), sorted(sd))
    for hf in order:
        t = sd[hf]
        tinygen.gguf_add_tensor(w, gguf_name(hf), t, qtype)
    tinygen.gguf_finish(w)


def model_from_gguf(path: Path, cfg: Phi3Config) -> Phi3ForCausalLM:
    """HF model with the GGUF's tensors dequantized by gguf (fused as HF fuses them)."""
    inv = {gguf_name(k): k for k in GLOBAL_MAP}
    for i in range(cfg.num_hidden_layers):
        for k in LAYER_MAP:
            inv[gguf_name(f"model.layers.{i}.{k}")] = f"model.layers.{i}.{k}"
    sd = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name.startswith("rope_factors_"):
            continue
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        sd[inv[t.name]] = torch.from_numpy(np.ascontiguousarray(a))
    return tinygen.model_from_state(Phi3ForCausalLM, cfg, sd)


def reference(model, ids, what: str, check_decode: bool) -> np.ndarray:
    return tinygen.reference(model, ids, what, log, check_decode)


def legacy_short_config(src: Path, dst: Path):
    """transformers 4.x dialect, original context = the full context (64):
    rope_scaling type "su", rope_theta / original_max_position_embeddings at
    top level, torch_dtype."""
    cj = json.loads((src / "config.json").read_text())
    rp = cj.pop("rope_parameters")
    cj["rope_theta"] = rp["rope_theta"]
    cj["partial_rotary_factor"] = rp["partial_rotary_factor"]
    cj["original_max_position_embeddings"] = cj["max_position_embeddings"]
    # transformers 5 wants the original context inside the rope object too
    # (published Phi-3 128k configs have it at top level only)
    cj["rope_scaling"] = {"type": "su", "short_factor": rp["short_factor"], "long_factor": rp["long_factor"],
                          "original_max_position_embeddings": cj["max_position_embeddings"]}
    cj["torch_dtype"] = cj.pop("dtype")
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        link = dst / f
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path("..") / src.name / f)


def main():
    out = tinygen.cli_out(REPO, __doc__)
    tinygen.torch_setup(2)
    versions = tinygen.versions(with_numpy=False)
    tok = build_tokenizer()
    tok_fields = tokenizer_gguf_fields(tok)
    rng = np.random.default_rng(20240607)
    ids = rng.integers(3, VOCAB, size=N_PROMPT).astype(np.int32)
    manifest = []

    def add(name, path, exp, ref, **meta):
        save_expected(exp, ids, ref, **meta, **versions)
        manifest.append({"name": name, "path": path, "expected": str(exp.relative_to(out)), **meta})

    for longrope, seed in ((False, 31), (True, 47)):
        base = build_model(seed, longrope)
        stem = "tiny_phi3_longrope" if longrope else "tiny_phi3"
        save_hf(base, out / stem, tok)
        m = load_fp32(out / stem)
        ref = reference(m, ids, stem, check_decode=not longrope)
        if not np.array_equal(ref, reference(base, ids, stem + " (in memory)", False)):
            raise SystemExit(f"{stem}: saved bf16 weights do not reproduce the in-memory logits")
        add(stem, stem, out / stem / "expected.npz", ref, weights="bf16",
            rope="longrope-long" if longrope else "default")
        types = (("f16", QT.F16, 1), ("q8_0", QT.Q8_0, 7)) if not longrope else (("f16", QT.F16, 1),)
        for tname, qt, ft in types:
            p = out / f"{stem}_{tname}.gguf"
            write_gguf(p, base, qt, ft, tok_fields, name=p.stem)
            r = reference(model_from_gguf(p, base.config), ids, p.name, check_decode=False)
            e = rel_err(r, ref)
            log(f"{p.name}: vs HF reference rel {e:.2e}")
            # f16 keeps bf16 values except the few tiny ones f16 holds as
            # subnormals; a wrong split or fused order would be O(1)
            if tname == "f16" and not e < 1e-4:
                raise SystemExit(f"{p.name}: GGUF round trip moves {stem}'s logits by {e:.3e}")
            add(p.name, p.name, out / f"{stem}_{tname}.expected.npz", r, weights=tname,
                rope="longrope-long" if longrope else "default")
        if longrope:
            sdir = out / "tiny_phi3_longrope_short"
            legacy_short_config(out / stem, sdir)
            ms = load_fp32(sdir)
            assert ms.config.rope_parameters["rope_type"] == "longrope", ms.config.rope_parameters
            ref_s = reference(ms, ids, sdir.name, check_decode=True)
            e = rel_err(ref_s, ref)
            log(f"{sdir.name}: short vs long factor logits differ by rel {e:.2e}")
            if not e > 0.05:
                raise SystemExit("short and long factor sets give nearly the same logits: test is weak")
            add(sdir.name, sdir.name, sdir / "expected.npz", ref_s, weights="bf16", rope="longrope-short")

    (out / "tiny_phi3_manifest.json").write_text(json.dumps(
        {"generator": "tests/reference/gen_tiny_phi3.py", "n_prompt": N_PROMPT, "n_vocab": VOCAB,
         "versions": versions, "models": manifest}, indent=2, sort_keys=True) + "\n")
    log(f"wrote {len(manifest)} models into {out}")


if __name__ == "__main__":
    main()
