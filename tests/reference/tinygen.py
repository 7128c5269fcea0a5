"""tinygen.py — what the tiny-model fixture generators (gen_tiny_*.py) share.

Running a model (prefill logits, step-by-step decode, the relative error the
e2e tests use, the prefill-vs-decode reference check), saving expected
logits and HF directories with the tiny tokenizer, and writing GGUF files
(the tokenizer keys, one tensor in a given type, the file itself). Each
generator keeps what is particular to its architecture: configs, weight
initialisation, key and tensor names, and tensor order.

Importing this module loads torch and gguf but no model code.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path

import numpy as np
import torch

import gguf
from gguf import GGMLQuantizationType as QT


# -------------------------------------------------------------------- setup
def cli_out(repo: Path, doc: str | None = None) -> Path:
    """The generators' command line: --out DIR (default tests/data under
    repo), created if absent. doc: the script's docstring, whose first line
    describes it in --help."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0] if doc else None)
    ap.add_argument("--out", type=Path, default=repo / "tests" / "data")
    out: Path = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    return out


def torch_setup(max_threads: int, deterministic: bool = True):
    """At most max_threads torch threads (the machine's count if smaller);
    deterministic kernels unless told otherwise."""
    torch.set_num_threads(max(1, min(max_threads, os.cpu_count() or 1)))
    if deterministic:
        torch.use_deterministic_algorithms(True)


def versions(with_gguf: bool = True, with_numpy: bool = True) -> dict:
    """The library versions a generator records in its fixtures' metadata."""
    v = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
    if with_gguf:
        v["gguf"] = __import__("importlib.metadata").metadata.version("gguf")
    if with_numpy:
        v["numpy"] = np.__version__
    return v


# -------------------------------------------------------------------- model
def randomize(model, seed: int, weight_std: float = 0.1, embed_std: float = 0.5, norm_jitter: float = 0.2,
              bias_std: float | None = None):
    """Fresh weights from a generator seeded with seed, drawn in parameter
    order (the fixtures depend on it): biases N(0, bias_std) when bias_std
    is given, other 1-D parameters (norms) 1 + N(0, norm_jitter), the
    embedding N(0, embed_std), every other matrix N(0, weight_std). Returns
    model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if bias_std is not None and name.endswith(".bias"):
                p.copy_(bias_std * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(1.0 + norm_jitter * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(embed_std * torch.randn(p.shape, generator=g))
            else:
                p.copy_(weight_std * torch.randn(p.shape, generator=g))
    return model


def model_from_state(cls, cfg, sd: dict):
    """A float32 eval-mode cls(cfg) (eager attention) holding the tensors of
    sd (HF names); every parameter must come from sd except a tied head."""
    m = cls(cfg).float().eval()
    m.set_attn_implementation("eager")
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    return m


# ------------------------------------------------------------------ running
@torch.no_grad()
def prefill_logits(model, ids: np.ndarray) -> np.ndarray:
    x = torch.tensor(ids, dtype=torch.long)[None]
    return model(input_ids=x, use_cache=False).logits[0].float().numpy()


@torch.no_grad()
def decode_logits(model, ids: np.ndarray) -> np.ndarray:
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    rows = []
    for i, t in enumerate(ids):
        out = model(input_ids=torch.tensor([[int(t)]]), past_key_values=cache,
                    use_cache=True, cache_position=torch.tensor([i]))
        cache = out.past_key_values
        rows.append(out.logits[0, -1].float().numpy())
    return np.stack(rows)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max over rows of max|a-b| / max|b| (the metric the e2e tests use)."""
    return float(np.max(np.max(np.abs(a - b), axis=-1) / np.max(np.abs(b), axis=-1)))


def reference(model, ids, what: str, log, check_decode: bool = True) -> np.ndarray:
    """The model's prefill logits (float32) after checking they are usable:
    step-by-step decode agrees within 1e-5 (unless check_decode is False)
    and they are neither flat nor huge; SystemExit otherwise. log: the
    generator's logger."""
    pre = prefill_logits(model, ids)
    spread = (f"logits std {pre.std():.3f}, "
              f"distinct argmax {len(set(pre.argmax(-1).tolist()))}/{len(ids)}")
    if check_decode:
        e = rel_err(decode_logits(model, ids), pre)
        log(f"{what}: prefill vs decode rel err {e:.2e}; {spread}")
        if not e <= 1e-5:
            raise SystemExit(f"{what}: prefill/decode disagree ({e:.3e})")
    else:
        log(f"{what}: {spread}")
    if not (0.3 < pre.std() < 10):
        raise SystemExit(f"{what}: degenerate logits (std {pre.std()})")
    return pre.astype(np.float32)


def save_expected(path: Path, ids: np.ndarray, logits: np.ndarray, **meta):
    np.savez_compressed(path, ids=ids.astype(np.int32), logits=logits.astype(np.float32),
                        meta=np.array(json.dumps(meta, sort_keys=True)))


# ------------------------------------------------------------------ HF dirs
def write_tokenizer(path: Path, tok, model_max_length: int = 128):
    """tokenizer.json and a tokenizer_config.json naming the tiny vocab's
    special tokens."""
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>", "add_bos_token": False, "model_max_length": model_max_length},
        indent=2, sort_keys=True) + "\n")


def save_hf(model, path: Path, tok, dtype=None, clear: bool = False, model_max_length: int = 128,
            edit_config=None):
    """An HF directory: the model's safetensors (cast to dtype unless None;
    the model itself is left alone) and config.json, no
    generation_config.json, the tokenizer. clear: empty the directory
    first; edit_config(path): rewrite config.json before the tokenizer is
    written."""
    path.mkdir(parents=True, exist_ok=True)
    if clear:
        for f in path.glob("*"):
            f.unlink()
    m = copy.deepcopy(model)
    if dtype is not None:
        m = m.to(dtype)
    m.save_pretrained(path, safe_serialization=True)
    gc = path / "generation_config.json"
    if gc.exists():
        gc.unlink()
    if edit_config is not None:
        edit_config(path)
    write_tokenizer(path, tok, model_max_length)


# --------------------------------------------------------------------- GGUF
def gguf_add_tokenizer(w: gguf.GGUFWriter, tok_fields: dict, unknown_id: bool = True):
    """The tiny tokenizer as tokenizer.ggml.* keys (GPT-2 byte-level BPE,
    <unk> 0, <s> 1, </s> 2, no BOS added), then general.quantization_version,
    in the order the fixtures were first written (the bytes depend on it).
    unknown_id False: no unknown_token_id key."""
    w.add_string("tokenizer.ggml.model", "gpt2")
    # the tiny tokenizer splits with the GPT-2 regex (byte-level, use_regex)
    w.add_string("tokenizer.ggml.pre", "gpt-2")
    w.add_array("tokenizer.ggml.tokens", tok_fields["tokens"])
    w.add_array("tokenizer.ggml.token_type", tok_fields["token_type"])
    w.add_array("tokenizer.ggml.merges", tok_fields["merges"])
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    if unknown_id:
        w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_uint32("general.quantization_version", 2)


def gguf_add_tensor(w: gguf.GGUFWriter, name: str, t: np.ndarray, qtype: QT = QT.F32):
    """t as qtype (F32, F16 or a gguf.quants type); 1-D tensors stay F32
    as llama.cpp's converter keeps them."""
    if t.ndim == 1 or qtype == QT.F32:
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    elif qtype == QT.F16:
        w.add_tensor(name, np.ascontiguousarray(t.astype(np.float16)))
    else:
        q = gguf.quants.quantize(np.ascontiguousarray(t, dtype=np.float32), qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)


def gguf_finish(w: gguf.GGUFWriter):
    """Write the header, keys and tensors added so far, and close."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_add_llama_keys(w: gguf.GGUFWriter, a: str, cfg):
    """The hyper-parameter keys llama.cpp's converter writes first for the
    Llama-shaped families (prefix a: llama, qwen2, qwen3, ...), in its
    order: shape, context, heads, RoPE base, norm epsilon."""
    w.add_uint32(f"{a}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{a}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{a}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{a}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{a}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{a}.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_float32(f"{a}.rope.freq_base", float(cfg.rope_parameters["rope_theta"]))
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", float(cfg.rms_norm_eps))
