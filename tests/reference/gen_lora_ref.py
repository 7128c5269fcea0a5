#!/usr/bin/env python3
"""Generate the LoRA fixtures in tests/data/lora/ (issue 20).

Small adapters on the tiny Llama fixture (tests/data/tiny_llama, f32 HF
weights), trained with peft on a recognizable toy task — after any token t
the next is (t * 7 + 3) % 512, so a trained adapter's greedy continuation
of a prompt is that recurrence, which the base never produces — then saved
with save_pretrained:

  qv8/       r 8,  alpha 16, q_proj v_proj              (F32)
  all16/     r 16, alpha 32, use_rslora, all seven      (F32)
  mlp8bf16/  r 8,  alpha 8,  gate/up/down_proj, weights rewritten as BF16
             (the reference logits use the rounded weights)
  o4f16/     r 4,  alpha 4,  o_proj k_proj, weights rewritten as F16
  qv8.gguf   qv8 written the way llama.cpp's convert_lora_to_gguf.py writes
             it: general.type adapter, adapter.type lora, adapter.lora.alpha,
             blk.N.attn_q.weight.lora_a ([r][n_in]) / .lora_b ([n_out][r]),
             q/k lora_b rows permuted like the base's q/k (LlamaModel.permute)
  ref.npz    ids int32 [24]; logits_base / logits_<name> float32 [24][512]
             (row i = logits after ids[0..i]) computed by peft in f32;
             greedy_<name> int32 [8]: peft's greedy continuation of ids[:6];
             logits_set_<key> float32 [24][512]: the weighted sums in SETS
             (adapter sets, ie_lora_concat), the base with W + sum_i w_i *
             delta_i where delta_i is peft's merge_and_unload() minus the
             base, all in f32

Run from the repository root with the reference stack (torch, peft, gguf):
    .venv/bin/python tests/reference/gen_lora_ref.py
Deterministic (fixed seeds); a few seconds on one core.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import gguf  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "tests/data/tiny_llama"
OUT = ROOT / "tests/data/lora"
VOCAB = 512

ADAPTERS = {
    "qv8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "all16": dict(r=16, lora_alpha=32, use_rslora=True,
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "mlp8bf16": dict(r=8, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"]),
    "o4f16": dict(r=4, lora_alpha=4, target_modules=["o_proj", "k_proj"]),
}
STORE = {"mlp8bf16": torch.bfloat16, "o4f16": torch.float16}
# adapter sets (name: weight), as a request's `lora` list or the CLI's
# --adapter NAME:W,NAME:W runs them
SETS = {
    "qv8_all16": {"qv8": 0.5, "all16": 0.75},
    "mlp_o4_neg": {"mlp8bf16": 1.0, "o4f16": -0.5, "qv8": 0.25},
}


def task_batch(g: torch.Generator, n: int = 16, length: int = 12) -> torch.Tensor:
    x = torch.empty(n, length, dtype=torch.long)
    x[:, 0] = torch.randint(3, VOCAB, (n,), generator=g)
    for i in range(1, length):
        x[:, i] = (x[:, i - 1] * 7 + 3) % VOCAB
    return x


def train(name: str, cfg: dict, steps: int) -> None:
    torch.manual_seed(1000 + len(name))
    base = LlamaForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(lora_dropout=0.0, bias="none", **cfg))
    # peft zero-inits B; start from small random B as well so even the
    # earliest steps move every module
    for n_, p in model.named_parameters():
        if "lora_B" in n_:
            torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(7)
    for _ in range(steps):
        x = task_batch(g)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"{name}: loss {loss.item():.3f} after {steps} steps")
    d = OUT / name
    model.save_pretrained(d)
    if name in STORE:  # rewrite the weights in a narrower type
        sd = load_file(d / "adapter_model.safetensors")
        save_file({k: v.to(STORE[name]).contiguous() for k, v in sd.items()}, d / "adapter_model.safetensors")
    for junk in ("README.md",):
        if (d / junk).exists():
            (d / junk).unlink()


@torch.no_grad()
def logits_of(model, ids: np.ndarray) -> np.ndarray:
    return model(input_ids=torch.tensor(ids[None], dtype=torch.long)).logits[0].float().numpy()


@torch.no_grad()
def greedy(model, prompt: np.ndarray, n: int) -> np.ndarray:
    x = torch.tensor(prompt[None], dtype=torch.long)
    out = []
    for _ in range(n):
        t = int(model(input_ids=x).logits[0, -1].argmax())
        out.append(t)
        x = torch.cat([x, torch.tensor([[t]])], dim=1)
    return np.array(out, dtype=np.int32)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (rows of q / k)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(name: str, cfg: dict, src: Path | None = None, dst: Path | None = None,
               heads: tuple[int, int] | None = None) -> None:
    """The PEFT adapter in src (default OUT/name) as a GGUF LoRA at dst
    (default OUT/name.gguf); heads = (n_head, n_kv_head) of the base for
    the q/k row permutation (default: the tiny Llama's config.json).
    Also used by gen_lora_smollm2.py."""
    if heads is None:
        hp = json.loads((BASE / "config.json").read_text())
        heads = (hp["num_attention_heads"], hp["num_key_value_heads"])
    sd = load_file((src or OUT / name) / "adapter_model.safetensors")
    w = gguf.GGUFWriter(str(dst or OUT / f"{name}.gguf"), "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(cfg["lora_alpha"]))
    gg = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for k in sorted(sd):
        if ".lora_A." not in k:
            continue
        layer = int(k.split("layers.")[1].split(".")[0])
        mod = k.split(".lora_A.")[0].split(".")[-1]
        a = sd[k].float().numpy()
        b = sd[k.replace("lora_A", "lora_B")].float().numpy()
        if mod == "q_proj":
            b = permute(b, heads[0])
        elif mod == "k_proj":
            b = permute(b, heads[1])
        base = f"blk.{layer}.{gg[mod]}.weight"
        w.add_tensor(base + ".lora_a", np.ascontiguousarray(a, dtype=np.float32))
        w.add_tensor(base + ".lora_b", np.ascontiguousarray(b, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, cfg in ADAPTERS.items():
        train(name, cfg, steps=200)
    write_gguf("qv8", ADAPTERS["qv8"])
    ids = task_batch(torch.Generator().manual_seed(99), n=1, length=24)[0].numpy().astype(np.int32)
    ids[12:] = np.array([5, 17, 200, 31, 64, 99, 300, 2, 45, 410, 7, 123], dtype=np.int32)  # off-task tail
    ref = {"ids": ids}
    base = LlamaForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()
    ref["logits_base"] = logits_of(base, ids)
    ref["greedy_base"] = greedy(base, ids[:6], 8)
    for name in ADAPTERS:
        base = LlamaForCausalLM.from_pretrained(BASE, dtype=torch.float32)
        m = PeftModel.from_pretrained(base, OUT / name).float().eval()  # narrow weights widened exactly
        ref[f"logits_{name}"] = logits_of(m, ids)
        ref[f"greedy_{name}"] = greedy(m, ids[:6], 8)
        print(name, "greedy", ref[f"greedy_{name}"].tolist())
    base_sd = LlamaForCausalLM.from_pretrained(BASE, dtype=torch.float32).state_dict()
    deltas = {}
    for name in {n for ws in SETS.values() for n in ws}:
        base = LlamaForCausalLM.from_pretrained(BASE, dtype=torch.float32)
        merged = PeftModel.from_pretrained(base, OUT / name).float().merge_and_unload().state_dict()
        deltas[name] = {k: merged[k] - v for k, v in base_sd.items() if not torch.equal(merged[k], v)}
    for key, ws in SETS.items():
        sd = {k: v.clone() for k, v in base_sd.items()}
        for name, w in ws.items():
            for k, d in deltas[name].items():
                sd[k] += w * d
        m = LlamaForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()
        m.load_state_dict(sd)
        ref[f"logits_set_{key}"] = logits_of(m, ids)
    np.savez_compressed(OUT / "ref.npz", **ref)


if __name__ == "__main__":
    main()
