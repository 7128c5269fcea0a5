#!/usr/bin/env python3
"""gen_tiny_gptoss.py — tiny random GPT-OSS models and their reference logits.

Writes into OUT (default tests/data):

  tiny_gptoss/          HF dir (save_pretrained), fp32, 8 experts top-2.
  tiny_gptoss_e4_bf16/  HF dir, every tensor BF16 ("plain BF16 experts"), 4
                        experts top-2, other seed. Reference = fp32 run of the
                        stored bf16 weights upcast.
  tiny_gptoss_mxfp4/    the tiny_gptoss weights with the experts quantized to
                        MXFP4 and stored the way the original openai/gpt-oss
                        release stores them: mlp.experts.{gate_up,down}_proj_
                        {blocks,scales} (uint8) + *_bias, and config.json
                        carrying "quantization_config": {"quant_method":
                        "mxfp4", ...}. Everything else BF16 (as in the
                        release), config "dtype": "bfloat16". Reference =
                        transformers' own loader with Mxfp4Config(dequantize=
                        True) (checked equal to our numpy dequantizer).
  tiny_gptoss.gguf      tiny_gptoss_mxfp4's weights as llama.cpp's
                        convert_hf_to_gguf.py (GptOssModel) writes gpt-oss:
                        arch "gpt-oss", blk.N.* names, gate/up de-interleaved
                        into ffn_gate_exps / ffn_up_exps, experts MXFP4 in
                        ggml's block_mxfp4 layout (e, qs[16]; qs[j] = elem j |
                        elem j+16 << 4), every other tensor F32 (exact
                        upcasts of the bf16 values). Its expected logits are
                        tiny_gptoss_mxfp4/expected.npz (same values).
  <dir>/expected.npz
                        ids int32 [32], logits float32 [32][512] (row i =
                        logits after ids[0..i]), meta (json string).

Config (all variants): 3 layers, layer_types sliding/full/sliding, hidden 32,
4 query heads / 2 KV heads of head_dim 16 (so q width 64 != hidden 32, as in
the real model: 64*64 != 2880), intermediate 64, vocab 512,
sliding_window 8 (< the 32-token prompt), attention biases on, YaRN exactly
as the released config (factor 32, original 4096, beta_fast 32, beta_slow 1,
truncate false, theta 150000), swiglu limit 7, alpha 1.702.

Random init is chosen so that every GPT-OSS-specific path matters: sinks
~N(0, 1.5) (some heads mostly sink, some not), router with bias, expert
gate_up pre-activations std ~3.5 so a few % of gate/up values lie beyond
+/-7 and are clamped (counted and asserted by the script), non-zero expert
biases, norm weights 1 + N(0, 0.2).

Checks (the script fails if any does not hold):
  * prefill logits == token-by-token decode with a DynamicCache (<= 1e-5 rel)
    for every variant (the decode path uses transformers' sliding-window
    cache layers, the prefill path the explicit mask)
  * clamps exercised: gate > 7 and |up| > 7 both occur in every variant
  * sliding window matters: re-running with sliding_window=10**6 changes
    the logits of positions >= window
  * MXFP4: transformers' dequantized load == our numpy dequantization ==
    weights put into the fp32 model; the GGUF read back with the gguf
    package and dequantized by gguf.quants gives bit-identical expert
    weights (re-interleaved), and every other tensor identical.

Usage: gen_tiny_gptoss.py [--out DIR]
"""
from __future__ import annotations

import copy
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
from gguf import GGMLQuantizationType as QT  # noqa: E402
from safetensors.torch import save_file as st_save_torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinygen  # noqa: E402
from gen_tiny_llama import build_tokenizer, tokenizer_gguf_fields, VOCAB  # noqa: E402
from tinygen import decode_logits, prefill_logits, rel_err, save_expected, write_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
N_PROMPT = 32
PROMPT_SEED = 1234
LIMIT = 7.0

# The quantization_config block of openai/gpt-oss-{20b,120b}/config.json.
ORIG_QUANT_CONFIG = {
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
    "quant_method": "mxfp4",
}

# E2M1 code -> value (OCP MX spec; index = 4-bit code, bit 3 = sign).
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def log(*a):
    print("[gen_tiny_gptoss]", *a, file=sys.stderr, flush=True)


def tiny_config(n_experts: int) -> GptOssConfig:
    return GptOssConfig(
        num_hidden_layers=3, num_local_experts=n_experts, num_experts_per_tok=2,
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=True,
        tie_word_embeddings=False, swiglu_limit=LIMIT,
        bos_token_id=1, eos_token_id=2, pad_token_id=None,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096},
    )


@torch.no_grad()
def build_model(seed: int, n_experts: int) -> GptOssForCausalLM:
    cfg = tiny_config(n_experts)
    torch.manual_seed(seed)
    m = GptOssForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(seed)

    def rn(shape, std, mean=0.0):
        return torch.randn(shape, generator=g) * std + mean

    for name, p in m.named_parameters():
        s = tuple(p.shape)
        if name.endswith("embed_tokens.weight"):
            v = rn(s, 0.5)
        elif name.endswith("norm.weight") or "layernorm" in name:
            v = rn(s, 0.2, 1.0)
        elif name.endswith("sinks"):
            v = rn(s, 1.5)
        elif ".router.weight" in name:
            v = rn(s, 0.3)
        elif ".router.bias" in name:
            v = rn(s, 0.3)
        elif name.endswith("experts.gate_up_proj"):
            v = rn(s, 0.6)           # [E, H, 2I]: pre-activation std ~3.4
        elif name.endswith("experts.gate_up_proj_bias"):
            v = rn(s, 0.7)
        elif name.endswith("experts.down_proj"):
            v = rn(s, 0.03)
        elif name.endswith("experts.down_proj_bias"):
            v = rn(s, 0.1)
        elif name.endswith("bias"):
            v = rn(s, 0.1)
        elif name == "lm_head.weight":
            v = rn(s, 0.15)
        else:                          # q/k/v/o weights
            v = rn(s, 0.15)
        p.copy_(v)
    return m


# ------------------------------------------------------------------ running
@torch.no_grad()
def clamp_stats(model, ids) -> dict:
    """Count gate/up pre-activations beyond the clamp over the routed experts."""
    st = {"gate_gt": 0, "up_gt": 0, "up_lt": 0, "n": 0}
    hooks = []
    for layer in model.model.layers:
        ex = layer.mlp.experts
        orig = ex._apply_gate

        def wrapped(gu, _orig=orig):
            gate, up = gu[..., ::2], gu[..., 1::2]
            st["gate_gt"] += int((gate > LIMIT).sum())
            st["up_gt"] += int((up > LIMIT).sum())
            st["up_lt"] += int((up < -LIMIT).sum())
            st["n"] += gate.numel()
            return _orig(gu)
        ex._apply_gate = wrapped
        hooks.append((ex, orig))
    try:
        model(input_ids=torch.tensor(ids, dtype=torch.long)[None], use_cache=False)
    finally:
        for ex, orig in hooks:
            ex._apply_gate = orig
    return st


def reference(model, ids, what: str) -> tuple[np.ndarray, dict]:
    pre = prefill_logits(model, ids)
    dec = decode_logits(model, ids)
    e = rel_err(dec, pre)
    cs = clamp_stats(model, ids)
    # sliding window must matter: widen it and the tail positions change
    wide = copy.deepcopy(model)
    wide.config.sliding_window = 10 ** 6
    for layer in wide.model.layers:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window = 10 ** 6
    pw = prefill_logits(wide, ids)
    W = model.config.sliding_window
    head_same = rel_err(pw[:W], pre[:W])
    tail_diff = rel_err(pw[W:], pre[W:])
    info = {"prefill_vs_decode_rel": e, "logits_std": float(pre.std()),
            "distinct_argmax": len(set(pre.argmax(-1).tolist())), "clamp": cs,
            "window_head_rel": head_same, "window_tail_rel": tail_diff}
    log(f"{what}: {json.dumps(info)}")
    if not e <= 1e-5:
        raise SystemExit(f"{what}: prefill/decode disagree ({e:.3e})")
    if not (0.3 < pre.std() < 10):
        raise SystemExit(f"{what}: degenerate logits (std {pre.std()})")
    if not (cs["gate_gt"] > 0 and cs["up_gt"] + cs["up_lt"] > 0):
        raise SystemExit(f"{what}: clamps not exercised {cs}")
    if not (head_same <= 1e-6 and tail_diff > 1e-3):
        raise SystemExit(f"{what}: sliding window not exercised ({head_same}, {tail_diff})")
    return pre.astype(np.float32), info


# ------------------------------------------------------------------ HF dirs
def save_hf(model, path: Path, dtype, tok):
    tinygen.save_hf(model, path, tok, dtype, clear=True)


def load_fp32(path: Path, **kw) -> GptOssForCausalLM:
    m = GptOssForCausalLM.from_pretrained(path, attn_implementation="eager", **kw)
    return m.float().eval()


# -------------------------------------------------------------------- MXFP4
def mxfp4_quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [..., K] float (K % 32 == 0) -> (blocks uint8 [..., K/32, 16],
    scales uint8 [..., K/32]) in the original gpt-oss layout: element 2j of a
    block in the low nibble of byte j, element 2j+1 in the high nibble;
    scale byte = E8M0 exponent + 127, value = E2M1[code] * 2**(scale-127).
    Scale chosen so the block max maps to <= 6 (no saturation); codes by
    round-to-nearest over the E2M1 table (ties to the lower code index)."""
    *lead, K = w.shape
    assert K % 32 == 0
    b = w.reshape(*lead, K // 32, 32).astype(np.float32)
    amax = np.abs(b).max(-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.ceil(np.log2(amax / 6.0)), -127).astype(np.int32)
    e = np.clip(e, -127, 127)
    scale = np.ldexp(np.float32(1), e).astype(np.float32)
    x = b / scale[..., None]
    codes = np.abs(np.abs(x)[..., None] - E2M1[:8]).argmin(-1).astype(np.uint8)   # magnitude 0..7
    codes |= np.where((x < 0) & (codes != 0), 8, 0).astype(np.uint8)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (e + 127).astype(np.uint8)


def mxfp4_dequant(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    lo, hi = blocks & 0x0F, blocks >> 4
    vals = np.empty(blocks.shape[:-1] + (32,), np.float32)
    vals[..., 0::2] = E2M1[lo]
    vals[..., 1::2] = E2M1[hi]
    vals *= np.ldexp(np.float32(1), scales.astype(np.int32) - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1)


def to_ggml_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Original-layout blocks/scales [..., G, 16]/[..., G] -> ggml block_mxfp4
    bytes [..., G*17]: per block {e, qs[16]}, qs[j] = code(j) | code(j+16)<<4
    (the reordering convert_hf_to_gguf.py GptOssModel.transform_nibble_layout
    performs). e is the same E8M0 byte."""
    codes = np.empty(blocks.shape[:-1] + (32,), np.uint8)
    codes[..., 0::2] = blocks & 0x0F
    codes[..., 1::2] = blocks >> 4
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    out = np.concatenate([scales[..., None], qs], axis=-1)
    return out.reshape(*blocks.shape[:-2], -1)


def write_mxfp4_dir(model: GptOssForCausalLM, path: Path, tok) -> GptOssForCausalLM:
    """Save model the way the original release is stored: experts MXFP4
    (*_blocks / *_scales uint8), every other tensor (expert biases included)
    BF16. Return an fp32 model holding exactly the stored values
    (bf16 upcast, experts dequantized)."""
    path.mkdir(parents=True, exist_ok=True)
    for f in path.glob("*"):
        f.unlink()
    deq = copy.deepcopy(model)
    out = {}
    for k, v in model.state_dict().items():
        if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
            # HF param is [E, in, out]; the release stores rows = out features,
            # blocks along the input dimension.
            a = v.detach().float().numpy()
            blocks, scales = mxfp4_quantize(np.ascontiguousarray(a.transpose(0, 2, 1)))
            out[k + "_blocks"] = torch.from_numpy(blocks)
            out[k + "_scales"] = torch.from_numpy(scales)
            dq = mxfp4_dequant(blocks, scales).transpose(0, 2, 1)
            deq.get_parameter(k).data.copy_(torch.from_numpy(np.ascontiguousarray(dq)))
        else:
            b = v.detach().to(torch.bfloat16).contiguous()
            out[k] = b
            deq.get_parameter(k).data.copy_(b.float())
    st_save_torch(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    cj = json.loads(model.config.to_json_string())
    cj["architectures"] = ["GptOssForCausalLM"]
    cj["quantization_config"] = ORIG_QUANT_CONFIG
    cj["dtype"] = "bfloat16"
    (path / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")
    write_tokenizer(path, tok)
    return deq.eval()


# --------------------------------------------------------------------- GGUF
def write_gguf(path: Path, mx_dir: Path, cfg: GptOssConfig, tok_fields: dict):
    """tiny_gptoss_mxfp4/ -> GGUF as convert_hf_to_gguf.py GptOssModel does
    (default, non-fused gate/up)."""
    from safetensors.torch import load_file as st_load_torch
    st = {k: (v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy())
          for k, v in st_load_torch(str(mx_dir / "model.safetensors")).items()}
    L = cfg.num_hidden_layers
    A = "gpt-oss"
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, L)

    def gname(hf: str) -> str:
        n = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert n is not None, hf
        return n

    w = gguf.GGUFWriter(str(path), A)
    w.add_name("tiny_gptoss")
    w.add_type("model")
    w.add_uint32(f"{A}.block_count", L)
    w.add_uint32(f"{A}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{A}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{A}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{A}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{A}.attention.head_count_kv", cfg.num_key_value_heads)
    rp = cfg.rope_parameters
    w.add_float32(f"{A}.rope.freq_base", float(rp["rope_theta"]))
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", float(cfg.rms_norm_eps))
    w.add_uint32(f"{A}.expert_count", cfg.num_local_experts)
    w.add_uint32(f"{A}.expert_used_count", cfg.num_experts_per_tok)
    w.add_uint32(f"{A}.attention.key_length", cfg.head_dim)
    w.add_uint32(f"{A}.attention.value_length", cfg.head_dim)
    w.add_string(f"{A}.rope.scaling.type", "yarn")
    w.add_float32(f"{A}.rope.scaling.factor", float(rp["factor"]))
    w.add_uint32(f"{A}.rope.scaling.original_context_length", int(rp["original_max_position_embeddings"]))
    w.add_float32(f"{A}.rope.scaling.yarn_beta_fast", float(rp["beta_fast"]))
    w.add_float32(f"{A}.rope.scaling.yarn_beta_slow", float(rp["beta_slow"]))
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE))
    w.add_uint32(f"{A}.attention.sliding_window", cfg.sliding_window)
    w.add_uint32(f"{A}.expert_feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{A}.vocab_size", cfg.vocab_size)
    tinygen.gguf_add_tokenizer(w, tok_fields)

    def f32(name, t):
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))

    def mx(name, blocks, scales):
        q = np.ascontiguousarray(to_ggml_mxfp4(blocks, scales))
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=QT.MXFP4)

    f32("token_embd.weight", st["model.embed_tokens.weight"])
    for i in range(L):
        p = f"model.layers.{i}."
        for k in ["input_layernorm.weight", "post_attention_layernorm.weight",
                  "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                  "self_attn.k_proj.weight", "self_attn.k_proj.bias",
                  "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                  "self_attn.o_proj.weight", "self_attn.o_proj.bias",
                  "mlp.router.weight", "mlp.router.bias"]:
            f32(gname(p + k), st[p + k])
        f32(gname(p + "self_attn.sinks.weight"), st[p + "self_attn.sinks"])
        e = p + "mlp.experts."
        gub, gus = st[e + "gate_up_proj_blocks"], st[e + "gate_up_proj_scales"]
        gbias = st[e + "gate_up_proj_bias"]
        mx(gname(e + "gate_proj.weight"), gub[:, 0::2], gus[:, 0::2])
        mx(gname(e + "up_proj.weight"), gub[:, 1::2], gus[:, 1::2])
        mx(gname(e + "down_proj.weight"), st[e + "down_proj_blocks"], st[e + "down_proj_scales"])
        f32(gname(e + "gate_proj.bias"), gbias[:, 0::2])
        f32(gname(e + "up_proj.bias"), gbias[:, 1::2])
        f32(gname(e + "down_proj.bias"), st[e + "down_proj_bias"])
    f32("output_norm.weight", st["model.norm.weight"])
    f32("output.weight", st["lm_head.weight"])
    tinygen.gguf_finish(w)


def check_gguf(path: Path, deq_model: GptOssForCausalLM):
    """Read the GGUF back, dequantize with gguf.quants, rebuild HF tensors and
    compare with the dequantized model bit for bit."""
    r = gguf.GGUFReader(str(path))
    t = {x.name: x for x in r.tensors}
    sd = {k: v.detach().numpy() for k, v in deq_model.state_dict().items()}

    def get(name):
        x = t[name]
        shape = tuple(int(d) for d in reversed(x.shape.tolist()))
        if x.tensor_type == QT.MXFP4:
            return gguf.quants.dequantize(x.data, QT.MXFP4).reshape(shape)
        assert x.tensor_type == QT.F32, (name, x.tensor_type)
        return np.asarray(x.data).reshape(shape)

    n = 0
    assert get("token_embd.weight").tobytes() == sd["model.embed_tokens.weight"].tobytes()
    for i in range(deq_model.config.num_hidden_layers):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        gate, up = get(b + "ffn_gate_exps.weight"), get(b + "ffn_up_exps.weight")   # [E, I, H]
        E, I, H = gate.shape
        gu = np.empty((E, 2 * I, H), np.float32)
        gu[:, 0::2], gu[:, 1::2] = gate, up
        assert np.array_equal(gu.transpose(0, 2, 1), sd[p + "mlp.experts.gate_up_proj"]), i
        assert np.array_equal(get(b + "ffn_down_exps.weight").transpose(0, 2, 1),
                              sd[p + "mlp.experts.down_proj"]), i
        gb = np.empty((E, 2 * I), np.float32)
        gb[:, 0::2], gb[:, 1::2] = get(b + "ffn_gate_exps.bias"), get(b + "ffn_up_exps.bias")
        assert np.array_equal(gb, sd[p + "mlp.experts.gate_up_proj_bias"])
        assert np.array_equal(get(b + "ffn_down_exps.bias"), sd[p + "mlp.experts.down_proj_bias"])
        pairs = {"attn_norm.weight": "input_layernorm.weight",
                 "post_attention_norm.weight": "post_attention_layernorm.weight",
                 "attn_sinks.weight": "self_attn.sinks",
                 "ffn_gate_inp.weight": "mlp.router.weight", "ffn_gate_inp.bias": "mlp.router.bias"}
        for q in "qkv":
            pairs[f"attn_{q}.weight"] = f"self_attn.{q}_proj.weight"
            pairs[f"attn_{q}.bias"] = f"self_attn.{q}_proj.bias"
        pairs["attn_output.weight"] = "self_attn.o_proj.weight"
        pairs["attn_output.bias"] = "self_attn.o_proj.bias"
        for g, h in pairs.items():
            assert np.array_equal(get(b + g), sd[p + h]), (g, h)
            n += 1
    assert np.array_equal(get("output_norm.weight"), sd["model.norm.weight"])
    assert np.array_equal(get("output.weight"), sd["lm_head.weight"])
    assert len(t) == 3 + deq_model.config.num_hidden_layers * (len(pairs) + 6), len(t)
    log(f"{path.name}: {len(t)} tensors read back, all equal to the dequantized model")


# --------------------------------------------------------------------- main
def main():
    out = tinygen.cli_out(REPO)
    tinygen.torch_setup(8, deterministic=False)
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, gguf {gguf.__version__ if hasattr(gguf, '__version__') else '?'}")

    tok = build_tokenizer()
    tok_fields = tokenizer_gguf_fields(tok)
    rng = np.random.default_rng(PROMPT_SEED)
    ids = rng.integers(3, VOCAB, size=N_PROMPT).astype(np.int32)
    common = {"transformers": transformers.__version__, "torch": torch.__version__}

    # ---- fp32, 8 experts
    m8 = build_model(seed=11, n_experts=8)
    d = out / "tiny_gptoss"
    save_hf(m8, d, torch.float32, tok)
    m8r = load_fp32(d)
    for (k, v), (k2, v2) in zip(m8.state_dict().items(), m8r.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    ref8, info = reference(m8r, ids, "tiny_gptoss")
    save_expected(d / "expected.npz", ids, ref8, source="tiny_gptoss fp32", **common, **info)

    # ---- bf16, 4 experts
    m4 = build_model(seed=22, n_experts=4)
    d = out / "tiny_gptoss_e4_bf16"
    save_hf(m4, d, torch.bfloat16, tok)
    m4r = load_fp32(d, dtype=torch.bfloat16)
    ref4, info = reference(m4r, ids, "tiny_gptoss_e4_bf16")
    save_expected(d / "expected.npz", ids, ref4, source="tiny_gptoss_e4_bf16 upcast to fp32",
                  **common, **info)

    # ---- MXFP4 experts, original release layout
    d = out / "tiny_gptoss_mxfp4"
    deq = write_mxfp4_dir(m8, d, tok)
    from transformers import Mxfp4Config
    mq = load_fp32(d, quantization_config=Mxfp4Config(dequantize=True))
    for (k, v), (k2, v2) in zip(deq.state_dict().items(), mq.state_dict().items()):
        assert k == k2 and torch.equal(v.float(), v2.float()), k
    log("tiny_gptoss_mxfp4: transformers' dequantized load == our numpy dequantization (bitwise)")
    refq, info = reference(mq, ids, "tiny_gptoss_mxfp4")
    e = rel_err(refq, ref8)
    log(f"tiny_gptoss_mxfp4 vs fp32 tiny_gptoss rel err {e:.3e} (quantization effect)")
    save_expected(d / "expected.npz", ids, refq, source="tiny_gptoss_mxfp4 via Mxfp4Config(dequantize=True)",
                  mxfp4_vs_fp32_rel=e, **common, **info)

    # ---- GGUF
    gp = out / "tiny_gptoss.gguf"
    write_gguf(gp, d, m8.config, tok_fields)
    check_gguf(gp, mq)
    # tiny_gptoss.gguf holds exactly tiny_gptoss_mxfp4's values: its expected
    # logits are tiny_gptoss_mxfp4/expected.npz (not duplicated, to stay small).

    tot = sum(f.stat().st_size for p in ["tiny_gptoss", "tiny_gptoss_e4_bf16", "tiny_gptoss_mxfp4"]
              for f in (out / p).iterdir()) + gp.stat().st_size
    log(f"total fixture bytes {tot}")


if __name__ == "__main__":
    main()
