#!/usr/bin/env python3
"""Dump the logits of every fixture model under every precision and plan, or
compare two such dumps byte for byte.

A refactoring that must not change behaviour is checked by dumping with the
binary from before the change and with the one after, then comparing:

    scripts/logits_dump.py dump --bin OLD/inference-engine --out /tmp/before
    scripts/logits_dump.py dump --bin build/inference-engine --out /tmp/after
    scripts/logits_dump.py compare /tmp/before /tmp/after

Each case runs `inference-engine logits` (prefill and decode modes) and keeps
the raw float32 rows plus the exit status and the error line, so a case that
is refused must be refused the same way after the change. Only the standard
library is used.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"

# (name, path, precisions) — the precisions each model is run under; None is
# the model's stored types (no --precision flag).
LLAMA_PREC = [None, "f32", "bf16", "f16", "int8w", "int4w"]
MODELS = [
    ("tiny_llama_hf", DATA / "tiny_llama", LLAMA_PREC),
    ("tiny_llama_tied", DATA / "tiny_llama_tied", [None, "int8w"]),
    ("tiny_llama_f16_hf", DATA / "tiny_llama_f16", [None, "bf16"]),
    ("tiny_llama_f32", DATA / "tiny_llama_f32.gguf", LLAMA_PREC),
    ("tiny_llama_f16", DATA / "tiny_llama_f16.gguf", [None]),
    ("tiny_llama_q8_0", DATA / "tiny_llama_q8_0.gguf", [None, "int4w"]),
    ("tiny_llama_q4_0", DATA / "tiny_llama_q4_0.gguf", [None]),
    ("tiny_llama_q4_1", DATA / "tiny_llama_q4_1.gguf", [None]),
    ("tiny_gptoss_hf", DATA / "tiny_gptoss", [None, "f32", "bf16", "int8w", "int4w"]),
    ("tiny_gptoss_mxfp4", DATA / "tiny_gptoss_mxfp4", [None, "int8w"]),
    ("tiny_gptoss_e4_bf16", DATA / "tiny_gptoss_e4_bf16", [None]),
    ("tiny_gptoss_gguf", DATA / "tiny_gptoss.gguf", [None, "int4w"]),
    ("smollm2", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf", [None, "f32", "int8w"]),
]
PLANS = ["none", "pipeline:2", "tensor:2"]
MODES = ["prefill", "decode"]
IDS = "1,17,42,99,7,250,3,64,128,5,11,200"


def cases():
    for name, path, precs in MODELS:
        if not path.exists():
            print(f"[logits] missing {path}: skipped", file=sys.stderr)
            continue
        for prec in precs:
            for plan in PLANS:
                for mode in MODES:
                    tag = f"{name}.{prec or 'stored'}.{plan.replace(':', '')}.{mode}"
                    yield tag, path, prec, plan, mode


def dump(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    env = dict(os.environ, IE_REPACK_CACHE="")
    env.pop("IE_PLAN", None)
    for tag, path, prec, plan, mode in cases():
        if args.only and args.only not in tag:
            continue
        cmd = [args.bin, "logits", "--model", str(path), "--ids", IDS, "--mode", mode,
               "--plan", plan, "--threads", str(args.threads), "--out", str(out / f"{tag}.f32")]
        if prec:
            cmd += ["--precision", prec]
        f = out / f"{tag}.f32"
        f.unlink(missing_ok=True)  # a stale file from an earlier dump must not be hashed
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        except subprocess.TimeoutExpired:
            r = subprocess.CompletedProcess(cmd, -9, "", "timed out after 600 s")
        digest = hashlib.sha256(f.read_bytes()).hexdigest() if r.returncode == 0 and f.exists() else None
        err = r.stderr.strip().splitlines()[-1] if r.returncode != 0 and r.stderr.strip() else ""
        index[tag] = {"rc": r.returncode, "sha256": digest, "error": err}
        print(f"[logits] {tag}: rc={r.returncode} {digest[:12] if digest else err}", file=sys.stderr)
    (out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    return 0


def compare(args) -> int:
    a = json.loads((Path(args.a) / "index.json").read_text())
    b = json.loads((Path(args.b) / "index.json").read_text())
    bad = []
    for tag in sorted(set(a) | set(b)):
        if tag not in a or tag not in b:
            bad.append(f"{tag}: only in {'first' if tag in a else 'second'}")
        elif a[tag] != b[tag]:
            bad.append(f"{tag}: {a[tag]} vs {b[tag]}")
    ok = sum(1 for t in a if t in b and a[t] == b[t] and a[t]["rc"] == 0)
    refused = sum(1 for t in a if t in b and a[t] == b[t] and a[t]["rc"] != 0)
    for line in bad:
        print("DIFF", line)
    print(f"{ok} identical, {refused} refused alike, {len(bad)} different")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--bin", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--only", default="", help="run only cases whose tag contains this")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    return dump(args) if args.cmd == "dump" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
