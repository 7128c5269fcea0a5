#!/usr/bin/env python3
"""gen_tiny_llama.py — tiny random Llama models and their reference logits.

Writes into OUT (default tests/data):

  tiny_llama/        HF dir, fp32, untied; config.json as transformers 5.x
                     writes it ("rope_parameters", "dtype")
  tiny_llama_tied/   HF dir, bf16, tied embeddings (no lm_head in the
                     safetensors); config.json rewritten in the legacy 4.x
                     style ("rope_theta", "torch_dtype") so the loader is
                     exercised on both config dialects
  tiny_llama_f16/    HF dir, fp16, untied
  tiny_llama_<t>.gguf  GGUF versions of tiny_llama's weights, t in
                     f32, f16, q8_0, q4_0, q4_1, laid out the way llama.cpp's
                     convert_hf_to_gguf.py lays out a Llama: llama.* keys,
                     token_embd / blk.N.* / output_norm / output names, Q and K
                     rows permuted for GGUF's interleaved-pair ("NORMAL")
                     RoPE, 1-D norms F32, every 2-D weight of type t.
  <name>/expected.npz, tiny_llama_<t>.expected.npz
                     ids int32 [32], logits float32 [32][512] (row i = logits
                     after consuming ids[0..i]); computed by transformers in
                     fp32 from exactly the weights stored in the file (bf16 /
                     f16 upcast; GGUF tensors dequantized with gguf's own
                     dequantizer, Q/K un-permuted).
  tiny_manifest.json list of the models above with their weight type and
                     expected file.

Each HF dir also gets a small byte-level BPE tokenizer.json (512 tokens,
trained here on fixed text) and each GGUF the same vocab as
tokenizer.ggml.* keys, so a loader that insists on a tokenizer finds one.

Checks done here (the script fails if any does not hold):
  * prefill logits == step-by-step decode with past_key_values (1e-5 rel)
  * tiny_llama_f32.gguf read back + un-permuted reproduces tiny_llama's
    logits bit-for-bit (the permutation round-trips)
  * transformers' own GGUF loader (which un-permutes Q/K itself) gives the
    same logits as our dequantized reference for every GGUF (1e-5 rel) —
    an independent check of our permutation direction.

Usage: gen_tiny_llama.py [--out DIR]
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
from gguf import GGMLQuantizationType as QT  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import tinygen  # noqa: E402
# also reached as gen_tiny_llama.<name> (gen_tiny_kquant.py, gen_smollm2_ref.py)
from tinygen import prefill_logits, rel_err, save_expected  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

N_PROMPT = 32
VOCAB = 512
WEIGHT_STD = 0.1       # linear weights ~N(0, 0.1): logits std ~1, not degenerate
EMBED_STD = 0.5
NORM_JITTER = 0.2      # norm weights 1 + N(0, 0.2): a loader that drops them fails

GGUF_TYPES = {
    "f32": (QT.F32, 0),   # (tensor type, general.file_type = llama_ftype)
    "f16": (QT.F16, 1),
    "q4_0": (QT.Q4_0, 2),
    "q4_1": (QT.Q4_1, 3),
    "q8_0": (QT.Q8_0, 7),
}


def log(*a):
    print("[gen_tiny_llama]", *a, file=sys.stderr)


# --------------------------------------------------------------------- model
def tiny_config(tied: bool) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=tied, hidden_act="silu",
        bos_token_id=1, eos_token_id=2,
    )


def build_model(seed: int, tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = tiny_config(tied)
    model = LlamaForCausalLM(cfg)
    model.set_attn_implementation("eager")
    tinygen.randomize(model, seed, WEIGHT_STD, EMBED_STD, NORM_JITTER)
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.float().eval()


def load_fp32(path: Path) -> LlamaForCausalLM:
    """Load a saved HF dir and upcast to fp32 (reference = stored weights)."""
    m = LlamaForCausalLM.from_pretrained(path, attn_implementation="eager")
    return m.float().eval()


def reference(model, ids, what: str) -> np.ndarray:
    return tinygen.reference(model, ids, what, log)


# ----------------------------------------------------------------- tokenizer
TOKENIZER_TEXT = """\
The quick brown fox jumps over the lazy dog. A tiny model has a tiny vocabulary,
and this text exists only to give a byte-level BPE tokenizer something to learn
its merges from. It is not meant to be meaningful: numbers like 0123456789 and
42 appear, as do punctuation marks (commas, periods; colons: and dashes - too),
some code such as def f(x): return x * 2 and for i in range(10): print(i),
and repeated common words: the, and, of, to, in, is, that, it, for, on, with.
Inference engines read weights, run matrix multiplications, apply rotary
position embeddings, normalize with RMS norm, and sample the next token.
"""


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, min_frequency=1, show_progress=False,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TOKENIZER_TEXT] * 4, trainer=trainer)
    # Pad with unused filler tokens if the text yields fewer merges than needed.
    n = tok.get_vocab_size()
    if n < VOCAB:
        tok.add_tokens([f"<unused{i}>" for i in range(VOCAB - n)])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def tokenizer_gguf_fields(tok) -> dict:
    js = json.loads(tok.to_str())
    vocab = js["model"]["vocab"]
    tokens = [None] * VOCAB
    for s, i in vocab.items():
        tokens[i] = s
    ttype = [1] * VOCAB
    for a in js.get("added_tokens", []):
        tokens[a["id"]] = a["content"]
        ttype[a["id"]] = 3 if a["special"] else 4   # CONTROL / USER_DEFINED
    assert all(t is not None for t in tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in js["model"]["merges"]]
    return {"tokens": tokens, "token_type": ttype, "merges": merges}


# ---------------------------------------------------------------------- GGUF
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    if hf in HF_TO_GGUF:
        return HF_TO_GGUF[hf]
    parts = hf.split(".")
    assert parts[0] == "model" and parts[1] == "layers", hf
    return f"blk.{parts[2]}." + LAYER_MAP[".".join(parts[3:])]


def rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF (rotate_half / NEOX pairs (j, j+d/2)) -> GGUF (adjacent pairs (2j, 2j+1)).

    Within each head's d output rows, HF row j (first half) and row j + d/2
    (second half) form a rotation pair; GGUF wants them at rows 2j and 2j+1.
    Viewing a head's rows as [2][d/2] (half, j) and transposing to [d/2][2]
    interleaves the halves. Its inverse is unpermute below.
    """
    rows = w.shape[0]
    d = rows // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    d = rows // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model: LlamaForCausalLM, qtype: QT, ftype: int, tok_fields: dict,
               name: str):
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = cfg.hidden_size // n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_type("model")
    tinygen.gguf_add_llama_keys(w, "llama", cfg)
    w.add_uint32("general.file_type", ftype)
    w.add_uint32("llama.vocab_size", cfg.vocab_size)
    w.add_uint32("llama.rope.dimension_count", head_dim)
    tinygen.gguf_add_tokenizer(w, tok_fields)

    # llama.cpp's converter emits token_embd first, then layer by layer, then
    # output_norm and output; keep that order.
    order = ["model.embed_tokens.weight"]
    for i in range(cfg.num_hidden_layers):
        order += [f"model.layers.{i}.{k}" for k in LAYER_MAP]
    order += ["model.norm.weight"] + (["lm_head.weight"] if "lm_head.weight" in sd else [])
    assert sorted(order) == sorted(sd), (sorted(order), sorted(sd))
    for hf in order:
        t = sd[hf]
        if hf.endswith("q_proj.weight"):
            t = rope_permute(t, n_head)
        elif hf.endswith("k_proj.weight"):
            t = rope_permute(t, n_kv)
        tinygen.gguf_add_tensor(w, gguf_name(hf), t, qtype)
    tinygen.gguf_finish(w)


def model_from_gguf(path: Path, cfg: LlamaConfig) -> LlamaForCausalLM:
    """HF model whose weights are the GGUF's tensors dequantized by gguf's own
    dequantizer, with Q/K un-permuted back to HF layout."""
    inv = {}
    for hf in ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]:
        inv[gguf_name(hf)] = hf
    for i in range(cfg.num_hidden_layers):
        for k in LAYER_MAP:
            hf = f"model.layers.{i}.{k}"
            inv[gguf_name(hf)] = hf
    r = gguf.GGUFReader(str(path))
    sd = {}
    for t in r.tensors:
        hf = inv[t.name]
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # numpy order
        a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if hf.endswith("q_proj.weight"):
            a = rope_unpermute(a, cfg.num_attention_heads)
        elif hf.endswith("k_proj.weight"):
            a = rope_unpermute(a, cfg.num_key_value_heads)
        sd[hf] = torch.from_numpy(np.ascontiguousarray(a))
    return tinygen.model_from_state(LlamaForCausalLM, cfg, sd)


def transformers_gguf_logits(path: Path, ids: np.ndarray) -> np.ndarray:
    """Independent path: transformers' GGUF loader (dequantizes with gguf and
    un-permutes Q/K itself; needs the accelerate package)."""
    m = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                         dtype=torch.float32,
                                         attn_implementation="eager").eval()
    return prefill_logits(m, ids)


# ------------------------------------------------------ activation-quant sim
def _round_act(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "f16":
        return x.to(torch.float16).to(x.dtype)
    if kind == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    assert kind == "q8"
    b = x.reshape(-1, 32)
    d = b.abs().amax(dim=1, keepdim=True) / 127.0
    safe = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.where(d > 0, torch.round(b / safe), torch.zeros_like(b))
    return (q * d).reshape(x.shape)


@torch.no_grad()
def act_quant_sim_logits(model, ids, kind: str = "q8") -> np.ndarray:
    """Forward with every Linear input rounded the way a native kernel may
    round activations: "q8" = llama.cpp's Q8_0/Q8_1 activation quantization
    (per 32-block, d = amax/127, q = round(x/d)); "f16"/"bf16" = activations
    converted to that type (llama.cpp's F16/BF16 dot products do this). Used
    only to size the tolerances of the native-precision tests; never stored
    as truth."""
    hooks = []

    def pre_hook(mod, args):
        return (_round_act(args[0], kind),) + tuple(args[1:])

    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            hooks.append(mod.register_forward_pre_hook(pre_hook))
    try:
        return prefill_logits(model, np.asarray(ids))
    finally:
        for h in hooks:
            h.remove()


def sim_stats(model, ids, ref: np.ndarray) -> dict:
    """Error the native path's activation rounding is expected to add."""
    out = {}
    for kind in ("q8", "f16", "bf16"):
        sim = act_quant_sim_logits(model, ids, kind)
        out[f"sim_{kind}_max_rel"] = rel_err(sim, ref)
        out[f"sim_{kind}_rms_rel"] = float(np.sqrt(np.mean((sim - ref) ** 2) / np.mean(ref ** 2)))
        out[f"sim_{kind}_argmax_agree"] = float(np.mean(sim.argmax(-1) == ref.argmax(-1)))
    return out


# ---------------------------------------------------------------------- main
def rewrite_config_legacy(path: Path):
    """transformers 4.x dialect: rope_theta / torch_dtype at top level."""
    cj = json.loads((path / "config.json").read_text())
    rp = cj.pop("rope_parameters")
    assert rp.get("rope_type", "default") == "default"
    cj["rope_theta"] = rp["rope_theta"]
    cj["torch_dtype"] = cj.pop("dtype")
    (path / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")


def save_hf(model, path: Path, dtype, tok, legacy_config=False):
    tinygen.save_hf(model, path, tok, dtype, edit_config=rewrite_config_legacy if legacy_config else None)


def main():
    out = tinygen.cli_out(REPO, __doc__)
    tinygen.torch_setup(4)
    versions = tinygen.versions()
    tok = build_tokenizer()
    tok_fields = tokenizer_gguf_fields(tok)
    rng = np.random.default_rng(20240601)
    ids = rng.integers(3, VOCAB, size=N_PROMPT).astype(np.int32)  # avoid specials
    manifest = []

    # (a) fp32 untied
    base = build_model(seed=1234, tied=False)
    save_hf(base, out / "tiny_llama", torch.float32, tok)
    ref_a = reference(load_fp32(out / "tiny_llama"), ids, "tiny_llama")
    # Saved fp32 weights are the in-memory ones: logits must match exactly.
    assert np.array_equal(ref_a, reference(base, ids, "tiny_llama (in memory)"))
    save_expected(out / "tiny_llama" / "expected.npz", ids, ref_a, weights="f32",
                  **sim_stats(base, ids, ref_a), **versions)
    manifest.append({"name": "tiny_llama", "path": "tiny_llama", "weights": "f32",
                     "expected": "tiny_llama/expected.npz"})

    # (b) bf16, tied, legacy config dialect
    tied = build_model(seed=5678, tied=True)
    save_hf(tied, out / "tiny_llama_tied", torch.bfloat16, tok, legacy_config=True)
    m_b = load_fp32(out / "tiny_llama_tied")
    assert m_b.config.tie_word_embeddings
    assert float(m_b.config.rope_parameters["rope_theta"]) == 10000.0, m_b.config.rope_parameters
    ref_b = reference(m_b, ids, "tiny_llama_tied (bf16)")
    e = rel_err(ref_b, reference(tied, ids, "tiny_llama_tied (fp32 before bf16)"))
    log(f"tiny_llama_tied: bf16 rounding moves logits by rel {e:.2e} (reference uses bf16 weights)")
    save_expected(out / "tiny_llama_tied" / "expected.npz", ids, ref_b, weights="bf16",
                  **sim_stats(m_b, ids, ref_b), **versions)
    manifest.append({"name": "tiny_llama_tied", "path": "tiny_llama_tied", "weights": "bf16",
                     "expected": "tiny_llama_tied/expected.npz"})

    # (c) f16, untied (same weights as (a), rounded to f16)
    save_hf(base, out / "tiny_llama_f16", torch.float16, tok)
    m_c = load_fp32(out / "tiny_llama_f16")
    ref_c = reference(m_c, ids, "tiny_llama_f16")
    save_expected(out / "tiny_llama_f16" / "expected.npz", ids, ref_c, weights="f16",
                  **sim_stats(m_c, ids, ref_c), **versions)
    manifest.append({"name": "tiny_llama_f16", "path": "tiny_llama_f16", "weights": "f16",
                     "expected": "tiny_llama_f16/expected.npz"})

    # GGUF versions of (a)
    for tname, (qtype, ftype) in GGUF_TYPES.items():
        p = out / f"tiny_llama_{tname}.gguf"
        write_gguf(p, base, qtype, ftype, tok_fields, name=f"tiny_llama_{tname}")
        m = model_from_gguf(p, base.config)
        ref = reference(m, ids, p.name)
        if tname == "f32":
            if not np.array_equal(ref, ref_a):
                raise SystemExit("f32 GGUF round trip does not reproduce tiny_llama's logits")
        e = rel_err(transformers_gguf_logits(p, ids), ref)
        log(f"{p.name}: transformers' own GGUF loader vs our dequant reference: rel {e:.2e}")
        if not e <= 1e-5:
            raise SystemExit(f"{p.name}: transformers' GGUF loader disagrees ({e:.3e}) — "
                             "Q/K permutation or dequantization mismatch")
        e_w = rel_err(ref, ref_a)
        st = sim_stats(m, ids, ref)
        log(f"{p.name}: weight quantization moves logits by rel {e_w:.2e}; simulated activation "
            f"rounding: q8 max rel {st['sim_q8_max_rel']:.2e} rms {st['sim_q8_rms_rel']:.2e} "
            f"argmax {st['sim_q8_argmax_agree']:.2f}; f16 {st['sim_f16_max_rel']:.2e}; "
            f"bf16 {st['sim_bf16_max_rel']:.2e}")
        exp = out / f"tiny_llama_{tname}.expected.npz"
        save_expected(exp, ids, ref, weights=tname, weight_quant_rel_err=e_w, **st, **versions)
        manifest.append({"name": f"tiny_llama_{tname}.gguf", "path": p.name, "weights": tname,
                         "expected": exp.name})

    (out / "tiny_manifest.json").write_text(json.dumps(
        {"generator": "tests/reference/gen_tiny_llama.py", "n_prompt": N_PROMPT, "n_vocab": VOCAB,
         "versions": versions, "models": manifest}, indent=2, sort_keys=True) + "\n")
    log(f"wrote {len(manifest)} models into {out}")


if __name__ == "__main__":
    main()
