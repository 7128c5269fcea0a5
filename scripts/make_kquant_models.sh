#!/usr/bin/env bash
# scripts/make_kquant_models.sh — GGUF k-quant (and other llama.cpp type) test
# models, made with llama.cpp's llama-quantize, idempotently.
#
# Why: the k-quant kernels (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, Q5_0, Q5_1, IQ4_NL,
# IQ4_XS) and the i-quant ones (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
# IQ3_S) need real files written by the reference quantizer to load, check
# and benchmark against; bench/ppl_table.py compares their perplexity with
# llama-perplexity's.
#
#   models/kquant/SmolLM2-135M-Instruct.<TYPE>.gguf
#       requantized (--allow-requantize) from models/SmolLM2-135M-Instruct.Q4_1.gguf,
#       so their quality is bounded by that Q4_1 source. SmolLM2's hidden size
#       576 is not a multiple of 256, so llama-quantize stores every tensor
#       whose rows are 576 long (all but ffn_down, whose rows are 1536) in a
#       fallback type: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
#       Q2_K/Q3_K -> Q4_0, IQ4_XS -> IQ4_NL; the tied token_embd (also the
#       output) becomes Q8_0. Only ffn_down holds the k-quant itself, and the
#       Q2_K mix puts no tensor in Q2_K at all (its ffn_down is Q3_K), hence
#       the extra Q2_K_pure file (--pure: every ffn_down in Q2_K). The table
#       printed at the end shows what each file holds.
#   models/kquant/SmolLM2-135M-Instruct.<IQ TYPE>.gguf
#       the i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and
#       the IQ2_M/IQ3_M mixes), requantized from the same Q4_1 source with an
#       importance matrix (--imatrix): llama-quantize refuses IQ1_*/IQ2_XXS/
#       IQ2_XS without one, and it is given to every i-quant so they are made
#       alike. As above only ffn_down holds the i-quant (and not all of it:
#       its first 3 of 30 layers get Q2_K in the IQ1_*/IQ2_XXS/IQ2_XS mixes,
#       IQ3_S in IQ2_S/IQ2_M, Q4_K in IQ3_M); the 576-long rows fall back to
#       IQ4_NL, or Q4_0/Q5_0 where the mix asks for Q2_K/Q4_K (attn_v,
#       attn_output), and token_embd is Q8_0. Mind the names: llama.cpp's
#       IQ2_S mix stores ffn_down in IQ2_XS, the IQ2_M mix in IQ2_S.
#   models/kquant/SmolLM2-135M-Instruct.imatrix
#       that importance matrix (llama-imatrix, GGUF format), computed on the
#       Q4_1 source from tests/data/corpus/austen_2.txt: not austen_1.txt, the
#       text bench/ppl_table.py scores, so the i-quants are not tuned to it.
#       IMATRIX_CHUNKS windows of 512 tokens (default 100: ~4 min on 2 idle
#       cores, 10 on 2 busy ones).
#   models/kquant/tinyllama-<TYPE>.gguf
#       from models/bench/tinyllama-f16.gguf (random weights, TinyLlama-1.1B
#       shapes; made by bench/make_tinyllama_gguf.py when missing): every
#       dimension is a multiple of 256, so these hold the k-quants proper.
#       For speed only; their text is meaningless.
#
# Builds llama-quantize first (scripts/llama_cpp.sh). An existing output is
# kept (delete it to rebuild); outputs are written to NAME.partial and renamed.
# Prints, on stdout, a markdown table: file -> number of tensors per type.
# Environment: SMOL_TYPES, SMOL_PURE_TYPES, SMOL_IQ_TYPES, TINY_TYPES
# (space-separated llama-quantize type names) override the lists below, an
# empty one skips that set (SMOL_TYPES= SMOL_PURE_TYPES= TINY_TYPES= makes the
# i-quants only); IMATRIX_CHUNKS (default 100); THREADS (default nproc).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

log() { printf '[kquant] %s\n' "$*" >&2; }

case "${1:-}" in
  -h|--help) sed -n '2,51p' "$0"; exit 0 ;;
  "") ;;
  *) log "unknown argument: $1 (usage: make_kquant_models.sh)"; exit 2 ;;
esac

py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
threads="${THREADS:-$(nproc)}"
out=models/kquant
smol_src=models/SmolLM2-135M-Instruct.Q4_1.gguf
tiny_src=models/bench/tinyllama-f16.gguf
imatrix=$out/SmolLM2-135M-Instruct.imatrix
imatrix_text=tests/data/corpus/austen_2.txt
imatrix_chunks="${IMATRIX_CHUNKS:-100}"
read -r -a smol_types <<<"${SMOL_TYPES-Q4_K_M Q4_K_S Q5_K_M Q6_K Q3_K_M Q2_K Q5_0 Q5_1 IQ4_XS IQ4_NL Q8_0 Q4_0}"
read -r -a smol_pure_types <<<"${SMOL_PURE_TYPES-Q2_K}"
read -r -a smol_iq_types <<<"${SMOL_IQ_TYPES-IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_S IQ3_M IQ1_S IQ1_M}"
read -r -a tiny_types <<<"${TINY_TYPES-Q4_K_M Q6_K Q4_0}"

eval "$(scripts/llama_cpp.sh)"
mkdir -p "$out"

# quantize SRC DST TYPE [extra llama-quantize flags...]
quantize() {
  local src="$1" dst="$2" type="$3"
  shift 3
  if [ -s "$dst" ]; then
    log "have $dst"
    return
  fi
  log "$src -> $dst ($type)"
  local t0=$SECONDS
  if ! "$LLAMA_QUANTIZE" "$@" "$src" "$dst.partial" "$type" "$threads" >"$dst.log" 2>&1; then
    tail -20 "$dst.log" >&2
    rm -f "$dst.partial"
    log "llama-quantize failed for $dst (log: $dst.log)"
    exit 1
  fi
  mv "$dst.partial" "$dst"
  log "  done in $((SECONDS - t0)) s"
}

[ -s "$smol_src" ] || { log "missing $smol_src (run scripts/setup.sh)"; exit 1; }
for t in "${smol_types[@]}"; do
  quantize "$smol_src" "$out/SmolLM2-135M-Instruct.$t.gguf" "$t" --allow-requantize
done
for t in "${smol_pure_types[@]}"; do
  quantize "$smol_src" "$out/SmolLM2-135M-Instruct.${t}_pure.gguf" "$t" --allow-requantize --pure
done

if [ "${#smol_iq_types[@]}" -gt 0 ]; then
  if [ -s "$imatrix" ]; then
    log "have $imatrix"
  else
    log "$smol_src -> $imatrix (llama-imatrix, $imatrix_chunks x 512 tokens of $imatrix_text)"
    t0=$SECONDS
    if ! "$LLAMA_IMATRIX" -m "$smol_src" -f "$imatrix_text" -o "$imatrix.partial" \
        --output-format gguf -c 512 --chunks "$imatrix_chunks" -t "$threads" \
        >"$imatrix.log" 2>&1; then
      tail -20 "$imatrix.log" >&2
      rm -f "$imatrix.partial"
      log "llama-imatrix failed (log: $imatrix.log)"
      exit 1
    fi
    mv "$imatrix.partial" "$imatrix"
    log "  done in $((SECONDS - t0)) s"
  fi
  for t in "${smol_iq_types[@]}"; do
    quantize "$smol_src" "$out/SmolLM2-135M-Instruct.$t.gguf" "$t" --allow-requantize --imatrix "$imatrix"
  done
fi

if [ "${#tiny_types[@]}" -gt 0 ]; then
  if [ ! -s "$tiny_src" ]; then
    log "making $tiny_src (bench/make_tinyllama_gguf.py)"
    "$py" bench/make_tinyllama_gguf.py --types f16
  fi
  for t in "${tiny_types[@]}"; do
    quantize "$tiny_src" "$out/tinyllama-$t.gguf" "$t"
  done
fi

# what each file really holds (llama-quantize substitutes types per tensor)
"$py" - "$out" <<'EOF'
import collections, pathlib, sys
import gguf
files = sorted(pathlib.Path(sys.argv[1]).glob("*.gguf"))
rows, seen = [], collections.Counter()
for f in files:
    r = gguf.GGUFReader(f)
    c = collections.Counter(t.tensor_type.name for t in r.tensors)
    rows.append((f.name, c))
    seen.update(c)
types = sorted(seen, key=lambda t: (-seen[t], t))
print("| file | " + " | ".join(types) + " |")
print("|---|" + "---:|" * len(types))
for name, c in rows:
    print(f"| {name} | " + " | ".join(str(c[t]) if c[t] else "" for t in types) + " |")
EOF
