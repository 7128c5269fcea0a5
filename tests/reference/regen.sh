#!/usr/bin/env bash
# tests/reference/regen.sh — re-generate the reference fixtures from scratch,
# check they equal the committed ones, and run the e2e tests on the fresh set.
#
#   1. gen_tiny_llama.py, gen_tiny_llama3.py, gen_tiny_gemma.py, gen_smollm2_ref.py, gen_lora_smollm2.py
#      (real LoRA adapters on SmolLM2, tests/data/lora_smollm2), gen_pretok_refs.py and gen_kquant_ref.py (the
#      k-quant blocks and their gguf.quants values, tests/data/kquant) and
#      gen_embed_ref.py (final-norm hidden states, tests/data/embed) and
#      gen_chat_templates.py and gen_tool_templates.py (transformers' renders of the chat templates, with tools too,
#      tests/data/templates) write into a temp dir
#   2. every fixture there is compared with tests/data: token ids exactly,
#      logits within 1e-6 (relative to the row's max |logit|), model files
#      (GGUF, safetensors, config/tokenizer json) byte for byte
#   3. pytest tests/e2e with IE_FIXTURES_DIR pointing at the temp dir (other
#      fixtures in tests/data that these generators do not make are linked in)
#
# Usage: tests/reference/regen.sh [--keep] [pytest args...]
#   --keep   leave the temp dir in place (its path is printed)
# Exit status: non-zero if a generator fails, a fixture differs, or pytest fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here"
py="${PYTHON:-$here/.venv/bin/python}"
keep=0
if [ "${1:-}" = "--keep" ]; then keep=1; shift; fi

tmp="$(mktemp -d -t clocher-fixtures.XXXXXX)"
cleanup() { if [ "$keep" = 1 ]; then echo "[regen] fresh fixtures kept in $tmp" >&2; else rm -rf "$tmp"; fi; }
trap cleanup EXIT

echo "[regen] generating into $tmp" >&2
"$py" tests/reference/gen_tiny_llama.py --out "$tmp"
"$py" tests/reference/gen_smollm2_ref.py --out "$tmp"
"$py" tests/reference/gen_lora_smollm2.py --out "$tmp"
"$py" tests/reference/gen_kquant_ref.py --out "$tmp"
"$py" tests/reference/gen_tiny_kquant.py --out "$tmp"
"$py" tests/reference/gen_tiny_llama3.py --out "$tmp"
"$py" tests/reference/gen_tiny_phi3.py --out "$tmp"
"$py" tests/reference/gen_tiny_gemma.py --out "$tmp"
"$py" tests/reference/gen_tiny_qwen3.py --out "$tmp"
"$py" tests/reference/gen_tiny_mixtral.py --out "$tmp"
"$py" tests/reference/gen_embed_ref.py --out "$tmp"
"$py" tests/reference/gen_pretok_refs.py --out "$tmp/pretok"
"$py" tests/reference/gen_chat_templates.py "$tmp/templates"
"$py" tests/reference/gen_tool_templates.py "$tmp/templates"

echo "[regen] comparing with tests/data" >&2
"$py" - "$here/tests/data" "$tmp" <<'EOF'
import json, sys
from pathlib import Path
import numpy as np

old_root, new_root = Path(sys.argv[1]), Path(sys.argv[2])


def same(a, b):
    """Structural equality; floats within 1e-6 relative."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            abs(a - b) <= 1e-6 * max(1.0, abs(a))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def drop_versions(m):
    m.pop("versions", None)
    for v in ("torch", "transformers", "gguf", "numpy"):
        m.pop(v, None)
    return m

bad = []
n = 0
for new in sorted(p for p in new_root.rglob("*") if p.is_file()):
    rel = new.relative_to(new_root)
    old = old_root / rel
    n += 1
    if not old.is_file():
        bad.append(f"{rel}: not in tests/data (new fixture, not committed?)")
        continue
    if new.suffix == ".npz":
        a, b = np.load(old), np.load(new)
        if sorted(a.files) != sorted(b.files):
            bad.append(f"{rel}: arrays {sorted(a.files)} vs {sorted(b.files)}")
            continue
        for k in a.files:
            x, y = a[k], b[k]
            if k == "meta":
                ma, mb = drop_versions(json.loads(str(x))), drop_versions(json.loads(str(y)))
                for key in sorted(set(ma) | set(mb)):
                    if not same(ma.get(key), mb.get(key)):
                        bad.append(f"{rel}:meta.{key}: {ma.get(key)!r:.80} vs {mb.get(key)!r:.80}")
            elif x.shape != y.shape or x.dtype != y.dtype:
                bad.append(f"{rel}:{k}: shape/dtype {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}")
            elif x.dtype.kind in "iub":
                if not np.array_equal(x, y):
                    bad.append(f"{rel}:{k}: ids differ")
            elif x.dtype.kind == "f":
                scale = np.maximum(np.max(np.abs(x), axis=-1, keepdims=True), 1.0) if x.ndim else max(abs(float(x)), 1.0)
                d = float(np.max(np.abs(x - y) / scale)) if x.size else 0.0
                if d > 1e-6:
                    bad.append(f"{rel}:{k}: values differ by {d:.3e} (> 1e-6)")
    elif new.suffix == ".json" and new.name in ("tiny_manifest.json", "tiny_kq_manifest.json", "smollm2_ref.json"):
        ja, jb = drop_versions(json.loads(old.read_text())), drop_versions(json.loads(new.read_text()))
        if not same(ja, jb):
            bad.append(f"{rel}: content differs")
    else:
        if old.read_bytes() != new.read_bytes():
            bad.append(f"{rel}: bytes differ")
print(f"[regen] compared {n} files", file=sys.stderr)
if bad:
    print("[regen] fresh fixtures differ from tests/data:", file=sys.stderr)
    for b in bad:
        print("   ", b, file=sys.stderr)
    sys.exit(1)
print("[regen] fixtures reproduce", file=sys.stderr)
EOF

# Fixtures these generators do not make (tokenizer vectors, perplexity
# references, ...) are linked in unchanged so every e2e test finds its data.
for f in "$here"/tests/data/*; do
  name="$(basename "$f")"
  [ -e "$tmp/$name" ] || ln -s "$f" "$tmp/$name"
done

echo "[regen] running e2e tests on the fresh fixtures" >&2
IE_FIXTURES_DIR="$tmp" "$py" -m pytest tests/e2e -q "$@"
