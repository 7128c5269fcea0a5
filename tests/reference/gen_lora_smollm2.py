#!/usr/bin/env python3
"""Generate tests/data/lora_smollm2/: real LoRA adapters on SmolLM2 (issue 20).

transformers loads models/SmolLM2-135M-Instruct.Q4_1.gguf itself
(from_pretrained(..., gguf_file=...): every tensor dequantized to f32, q/k
un-permuted to HF layout) — the same weights the engine runs at
--precision f32 — and peft trains two small adapters on it, on CPU, on two
recognizable tasks over plain "Q: w1 w2 w3\\nA:" prompts (three words from a
fixed list):

  rev8/    r 8,  alpha 16, q_proj v_proj, top REV_LAYERS layers, F32.
           Task: answer the three words in reverse order.
  caps16/  r 16, alpha 16, use_rslora, all seven projections, on the top
           LAYERS layers only (layers_to_transform) so that the file stays
           small (and training fast: backward stops at the lowest adapted
           layer), weights rewritten as BF16 (the reference uses the rounded
           weights). Task: answer the three words in capitals.
  rev8.gguf  rev8 written the way llama.cpp's convert_lora_to_gguf.py writes
           it (gen_lora_ref.write_gguf: q/k lora_b rows permuted like the
           GGUF base's q/k).
  ref.npz  for each model M in base, rev8, caps16 and prompt p:
             M_p<p>_ids       int32 [T]   prompt ids + M's greedy continuation
             M_p<p>_topk_ids  int32 [T][K], M_p<p>_topk_vals float32 [T][K]:
                              the K largest f32 logits of M after each
                              position of M_p<p>_ids (row t = after ids[0..t])
             M_p<p>_last      float32 [V]: the full row at the last prompt
                              position (p = 0 only)
           meta (json): prompts, prompt lengths, continuations and their text
  ref.json the same metadata, human-readable

The continuation is peft's greedy one (argmax of the f32 logits, N_NEW
tokens; no stop). Training: batch BATCH, sequences of ~16 tokens, loss on
the answer only, Adam (lr LR, gradient norm clipped at 1); deterministic
(fixed seeds, one torch thread: on the shared 2-core VM two threads ran
~10x slower). About 6 minutes in all there.

Usage: gen_lora_smollm2.py [--out DIR] [--model PATH] [--steps N]
(run from the repository root with the reference stack: torch, peft, gguf)
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_lora_ref  # noqa: E402  (its GGUF LoRA writer)

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
N_LAYER = 30
LAYERS = 6          # caps16 adapts the top LAYERS layers
REV_LAYERS = 12     # rev8 the top REV_LAYERS
BATCH = 4
K = 64
N_NEW = 10
WORDS = ("apple river green stone cloud music paper house light table water happy tiger mountain yellow "
         "garden silver window summer orange bread horse winter forest purple candle rocket bottle pencil "
         "castle dragon flower island jacket kitten lemon mirror ocean planet rabbit sugar violin wizard").split()
PROMPT_WORDS = [("river", "tiger", "candle"), ("music", "island", "bread"), ("planet", "garden", "silver")]

ADAPTERS = {
    "rev8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                 layers_to_transform=list(range(N_LAYER - REV_LAYERS, N_LAYER))),
    "caps16": dict(r=16, lora_alpha=16, use_rslora=True,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                   layers_to_transform=list(range(N_LAYER - LAYERS, N_LAYER))),
}
STORE = {"caps16": torch.bfloat16}
LR = {"rev8": 5e-3, "caps16": 1e-3}  # rsLoRA's larger scale diverges at 5e-3


def answer(name: str, words) -> str:
    return " ".join(reversed(words)) if name == "rev8" else " ".join(w.upper() for w in words)


def prompt_text(words) -> str:
    return "Q: " + " ".join(words) + "\nA:"


def batch(tok, name: str, rng: np.random.Generator):
    """BATCH examples "Q: ...\\nA: <answer>\\n", right-padded; labels only on the answer."""
    seqs, labs = [], []
    for _ in range(BATCH):
        w = tuple(rng.choice(WORDS, 3, replace=False))
        p = tok.encode(prompt_text(w), add_special_tokens=False)
        a = tok.encode(" " + answer(name, w) + "\n", add_special_tokens=False)
        seqs.append(p + a)
        labs.append([-100] * len(p) + a)
    n = max(map(len, seqs))
    ids = torch.zeros(BATCH, n, dtype=torch.long)
    lab = torch.full((BATCH, n), -100, dtype=torch.long)
    att = torch.zeros(BATCH, n, dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labs)):
        ids[i, :len(s)] = torch.tensor(s)
        lab[i, :len(l)] = torch.tensor(l)
        att[i, :len(s)] = 1
    return ids, lab, att


def train(base, tok, name: str, cfg: dict, steps: int, out: Path) -> None:
    torch.manual_seed(1234 + len(name))
    model = get_peft_model(copy.deepcopy(base), LoraConfig(lora_dropout=0.0, bias="none", **cfg))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=LR[name])
    rng = np.random.default_rng(7)
    t0 = time.time()
    for step in range(steps):
        ids, lab, att = batch(tok, name, rng)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        if step % 5 == 0 or step == steps - 1:
            print(f"{name}: step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)
    d = out / name
    model.save_pretrained(d)
    if name in STORE:  # rewrite the weights in a narrower type
        sd = load_file(d / "adapter_model.safetensors")
        save_file({k: v.to(STORE[name]).contiguous() for k, v in sd.items()}, d / "adapter_model.safetensors")
    if (d / "README.md").exists():
        (d / "README.md").unlink()
    sort_config(d)
    print(f"{name}: {steps} steps in {time.time() - t0:.0f}s, "
          f"{(d / 'adapter_model.safetensors').stat().st_size} bytes", flush=True)


def sort_config(d: Path) -> None:
    """peft writes target_modules from a set (order varies run to run): sorted, the file reproduces."""
    p = d / "adapter_config.json"
    cfg = json.loads(p.read_text())
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def greedy(model, prompt: list[int], n: int) -> list[int]:
    x = torch.tensor([prompt], dtype=torch.long)
    out = []
    for _ in range(n):
        t = int(model(input_ids=x).logits[0, -1].argmax())
        out.append(t)
        x = torch.cat([x, torch.tensor([[t]])], dim=1)
    return out


@torch.no_grad()
def logits_of(model, ids: list[int]) -> np.ndarray:
    return model(input_ids=torch.tensor([ids], dtype=torch.long)).logits[0].float().numpy()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "data")
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the reference machine is shared: one thread spins least
    out = args.out / "lora_smollm2"
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(args.model.parent, gguf_file=args.model.name)
    base = AutoModelForCausalLM.from_pretrained(args.model.parent, gguf_file=args.model.name,
                                                dtype=torch.float32).eval()
    hp = base.config
    assert hp.num_hidden_layers == N_LAYER, hp.num_hidden_layers
    for name, cfg in ADAPTERS.items():
        train(base, tok, name, cfg, args.steps, out)
    gen_lora_ref.write_gguf("rev8", ADAPTERS["rev8"], src=out / "rev8", dst=out / "rev8.gguf",
                            heads=(hp.num_attention_heads, hp.num_key_value_heads))

    prompts = [prompt_text(w) for w in PROMPT_WORDS]
    pids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    ref, meta = {}, {"prompts": prompts, "prompt_ids": pids, "k": K, "n_new": N_NEW, "cont": {}, "text": {},
                     "expected": {}, "versions": {"torch": torch.__version__}}
    models = {"base": base}
    for name in ADAPTERS:  # narrow stored weights widened exactly by .float()
        models[name] = PeftModel.from_pretrained(copy.deepcopy(base), out / name).float().eval()
    for mname, m in models.items():
        meta["cont"][mname], meta["text"][mname] = [], []
        for i, p in enumerate(pids):
            cont = greedy(m, p, N_NEW)
            ids = p + cont
            lg = logits_of(m, ids)
            top = np.argsort(-lg, axis=-1, kind="stable")[:, :K].astype(np.int32)
            ref[f"{mname}_p{i}_ids"] = np.array(ids, dtype=np.int32)
            ref[f"{mname}_p{i}_topk_ids"] = top
            ref[f"{mname}_p{i}_topk_vals"] = np.take_along_axis(lg, top, axis=-1).astype(np.float32)
            if i == 0:
                ref[f"{mname}_p{i}_last"] = lg[len(p) - 1].astype(np.float32)
            meta["cont"][mname].append(cont)
            meta["text"][mname].append(tok.decode(cont))
            print(f"{mname} p{i}: {tok.decode(cont)!r}", flush=True)
        if mname in ADAPTERS:
            meta["expected"][mname] = [" " + answer(mname, w) for w in PROMPT_WORDS]
    ref["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(out / "ref.npz", **ref)
    meta.pop("versions")  # ref.json is compared byte for byte by regen.sh
    (out / "ref.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
