#!/usr/bin/env python3
"""bench_kquant.py — decode and prefill of the TinyLlama-1.1B shape per k-quant type, beside Q4_0.

Issue 18's targets: a Q4_K_M and a Q6_K model reach >= 0.9 of the paired read
in bench_decode (Q4_0 reaches 0.88-0.94), and pp512 within 10% of Q4_0's.

Models. From models/bench/tinyllama-f16.gguf (made by
bench/make_tinyllama_gguf.py when missing) our own converter, ie-convert,
writes one IEBIN per type with a manifest giving every matrix (token_embd and
output included) that type, "fallback": "auto" (docs/CONVERT.md), cached in
models/bench/kquant/tinyllama-<type>/ (git-ignored; delete one to rebuild
it). The Q4_0 baseline is made the same way (dtype q4_0: ROWS, repacked to
int4w at load as from a GGUF). llama.cpp-made files (tinyllama-Q4_K_M.gguf,
-Q6_K, -Q4_0 from the lcpp helper's scripts/make_kquant_models.sh) are added
when found in models/kquant/ (or --lcpp-dir). --iq iq2_xxs,iq3_s,... adds
the grid i-quants as GGUFs from bench/make_iquant_gguf.py (random codes in
every layer matrix, token_embd and output Q4_0; no quantizer writes them).

Measures. Per model and round:
  * decode: build/bench_decode --tokens N (every token paired with a read of
    the same bytes by the same threads): the medians over all tokens of the
    decode rate and of the fractions frac_jobs / frac_flat (read time / step
    time; 1.0 = the bandwidth of that moment), also over the high-phase tokens.
  * pp512: inference-engine with a ~512-token corpus prompt, --max-new 1,
    --warmup 1 (as bench/bench_models.py does), prefill_tps.
The machine's bandwidth flips between phases within seconds, so a round runs
the Q4_0 baseline between every two models (Q4_0, A, Q4_0, B, ..., Q4_0; the
order of the models flips each round; --base-every K puts K models between
two baseline runs) and each model's pp512 is divided by the mean of the two
baseline runs around it; the table gives the medians
over rounds. The decode fractions need no baseline (each token has its own
read); the baseline's own fractions are the medians over its runs.

Columns: bits/weight = 8 x the bytes one decode step streams
(ie_worker_bytes_per_token, as bench_decode prints them: the resident weight
matrices once, one embedding row) / the weights they hold (counted in the
f16 file). Prints a markdown table and writes every run as one JSON line to
bench/out/kquant-<stamp>.jsonl. Asserts nothing.

Usage: bench/bench_kquant.py [--build DIR] [--types q4_K,q6_K,...] [--iq iq2_xxs,...] [--no-lcpp]
                             [--tokens N] [--rounds N] [--base-every K] [--words N] [--threads N]
                             [--no-pp] [--convert-only]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gguf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_models import run_engine  # noqa: E402  (the engine invocation bench_models.py times pp512 with)
from harness import corpus_words, words_for_tokens  # noqa: E402  (its ~N-token corpus prompt)

F16 = REPO / "models" / "bench" / "tinyllama-f16.gguf"
CACHE = REPO / "models" / "bench" / "kquant"
TYPES = ["q4_K", "q5_K", "q6_K", "q3_K", "q2_K", "q5_0", "q5_1", "iq4_nl", "iq4_xs"]
LCPP = ["tinyllama-Q4_K_M.gguf", "tinyllama-Q6_K.gguf", "tinyllama-Q4_0.gguf"]
LCPP_DIRS = [REPO / "models" / "kquant", Path("/work/wt/lcpp/models/kquant")]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def ensure_f16() -> None:
    if not F16.is_file():
        log(f"making {F16}")
        subprocess.run([sys.executable, str(REPO / "bench" / "make_tinyllama_gguf.py"), "--types", "f16"],
                       check=True)


def convert(ie_convert: Path, dtype: str, threads: int) -> Path:
    """models/bench/kquant/tinyllama-<dtype>/, converted from the f16 file unless already there."""
    out = CACHE / f"tinyllama-{dtype}"
    if (out / "model.ie.json").is_file():  # written last: the model is complete (docs/FORMAT.md)
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    manifest = CACHE / f"manifest-{dtype}.json"
    rules = [{"pattern": "^(token_embd|output)\\.weight$", "dtype": dtype, "fallback": "auto"},
             {"pattern": "^blk\\.\\d+\\.", "dtype": dtype, "fallback": "auto"}]
    manifest.write_text(json.dumps({"version": 1, "comment": "bench/bench_kquant.py", "rules": rules}) + "\n")
    log(f"converting {F16.name} -> {out.name}")
    t0 = time.time()
    cp = subprocess.run([str(ie_convert), "--in", str(F16), "--out-dir", str(out), "--q4-map", str(manifest),
                         "--threads", str(threads), "--quiet"], capture_output=True, text=True)
    if cp.returncode != 0:
        raise SystemExit(f"ie-convert {dtype} failed ({cp.returncode}): {cp.stderr.strip()[-400:]}")
    log(f"  {time.time() - t0:.0f} s")
    return out


def weights_per_token(path: Path) -> int:
    """Weights one decode step reads, as ie_worker_bytes_per_token counts them: every matrix but
    token_embd (norms are 1-D and not counted), plus one embedding row."""
    n = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name == "token_embd.weight":
            n += int(t.shape[0])  # GGUF shape [n_embd, n_vocab]: one row
        elif len(t.shape) >= 2:
            n += int(t.n_elements)
    return n


def decode(build: Path, model: Path, args) -> dict:
    cmd = [str(build / "bench_decode"), "--model", str(model), "--tokens", str(args.tokens),
           "--threads", str(args.threads)]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if cp.returncode != 0:
        return {"error": f"bench_decode exit {cp.returncode}: {cp.stderr.strip()[-300:]}"}
    for line in reversed(cp.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": "bench_decode printed no JSON"}


def prefill(build: Path, model: Path, prompt: str, args) -> dict:
    return run_engine(build / "inference-engine", model, prompt, 1, args.threads, "native", 900)


def med(v):
    v = [x for x in v if isinstance(x, (int, float))]
    return statistics.median(v) if v else None


def f(v, spec):
    return "-" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=Path, default=Path(os.environ.get("IE_BUILD_DIR", REPO / "build")))
    ap.add_argument("--types", default=",".join(TYPES), help="ggml types to convert and measure")
    ap.add_argument("--iq", default="", help="grid i-quants to add as GGUFs by bench/make_iquant_gguf.py "
                    "(iq2_xxs,iq3_s,...: layers in the type, token_embd and output Q4_0)")
    ap.add_argument("--no-lcpp", action="store_true", help="leave out the llama.cpp-made files")
    ap.add_argument("--lcpp-dir", type=Path, action="append", help="where tinyllama-Q4_K_M.gguf etc. are")
    ap.add_argument("--tokens", type=int, default=48, help="bench_decode tokens per run (48)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over every model (1)")
    ap.add_argument("--words", type=int, default=0, help="prompt words (default: ~512 tokens' worth)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--base-every", type=int, default=1,
                    help="models between two Q4_0 baseline runs (1; 2 or 3 to save time)")
    ap.add_argument("--no-pp", action="store_true", help="decode only")
    ap.add_argument("--convert-only", action="store_true")
    args = ap.parse_args()
    if args.base_every < 1 or args.tokens < 1 or args.rounds < 1:
        ap.error("--base-every, --tokens and --rounds must be >= 1")

    ensure_f16()
    models = [("q4_0", convert(args.build / "ie-convert", "q4_0", args.threads))]
    for t in [t for t in args.types.split(",") if t]:
        models.append((t, convert(args.build / "ie-convert", t, args.threads)))
    if not args.no_lcpp:
        for name in LCPP:
            for d in (args.lcpp_dir or LCPP_DIRS):
                if (d / name).is_file():
                    models.append(("llama.cpp " + name.removeprefix("tinyllama-").removesuffix(".gguf"), d / name))
                    break
    for t in [t for t in args.iq.split(",") if t]:  # i-quant GGUFs (random codes; no quantizer writes them)
        if not (REPO / "models" / "bench" / "tinyllama-q4_0.gguf").is_file():
            subprocess.run([sys.executable, str(REPO / "bench" / "make_tinyllama_gguf.py"), "--types", "q4_0"],
                           check=True)
        cp = subprocess.run([sys.executable, str(REPO / "bench" / "make_iquant_gguf.py"), "--types", t],
                            capture_output=True, text=True, check=True)
        models.append((t + " (gguf)", Path(cp.stdout.strip().splitlines()[-1])))
    if args.convert_only:
        return 0
    base, others = models[0], models[1:]
    params = weights_per_token(F16)

    words = corpus_words()
    n_words = args.words
    if not n_words:
        n_words, n_tok = words_for_tokens(args.build / "inference-engine", F16, 512, words)
        log(f"prompt: {n_words} words = {n_tok} tokens")
    prompt = " ".join(words[:n_words])

    out = REPO / "bench" / "out" / f"kquant-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {name: [] for name, _ in models}
    pp_ratio: dict[str, list[float]] = {name: [] for name, _ in others}
    load0 = os.getloadavg()
    t_start = time.time()
    with open(out, "w", encoding="utf-8") as jf:
        def one(name: str, path: Path, rnd: int) -> dict:
            rec = {"model": name, "path": str(path), "round": rnd, "loadavg": os.getloadavg()[0],
                   "decode": decode(args.build, path, args)}
            if not args.no_pp:
                rec["pp512"] = prefill(args.build, path, prompt, args)
            jf.write(json.dumps(rec) + "\n")
            jf.flush()
            runs[name].append(rec)
            d = rec["decode"].get("all", {})
            log(f"round {rnd} {name:22} decode {f(d.get('decode_tps'), '.1f')} t/s"
                f" frac_j {f(d.get('frac_jobs'), '.3f')} frac_f {f(d.get('frac_flat'), '.3f')}"
                f" pp {f(rec.get('pp512', {}).get('prefill_tps'), '.1f')}"
                + "".join(f"  ERROR {e}" for e in (rec['decode'].get('error'), rec.get('pp512', {}).get('error'))
                          if e))
            return rec

        for rnd in range(args.rounds):
            order = others if rnd % 2 == 0 else others[::-1]
            prev = one(*base, rnd)
            for i in range(0, len(order), args.base_every):
                group = [(name, one(name, path, rnd)) for name, path in order[i:i + args.base_every]]
                nxt = one(*base, rnd)
                b = [r.get("pp512", {}).get("prefill_tps") for r in (prev, nxt)]
                b = [x for x in b if isinstance(x, (int, float))]
                for name, cur in group:
                    pp = cur.get("pp512", {}).get("prefill_tps")
                    if b and isinstance(pp, (int, float)):
                        pp_ratio[name].append(pp / statistics.mean(b))
                prev = nxt
    load1 = os.getloadavg()

    tok_in = med([r.get("pp512", {}).get("tokens_in") for rs in runs.values() for r in rs])
    print(f"TinyLlama-1.1B shape, {args.threads} threads, {args.rounds} round(s), decode {args.tokens} tokens"
          f" a run, pp512 prompt {n_words} words = {f(tok_in, '.0f')} tokens; {time.time() - t_start:.0f} s;"
          f" load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end\n")
    print("| type | bits/weight | decode t/s | of the read (jobs / flat) | high phase: t/s (of the read, jobs)"
          " | pp512 t/s | pp512 / Q4_0's |")
    print("|---|---|---|---|---|---|---|")
    for name, _ in models:
        rs = runs[name]
        dec = [r["decode"] for r in rs if "error" not in r["decode"]]
        mb = med([d.get("mb_per_token") for d in dec])
        bpw = 8 * mb * 1e6 / params if mb else None
        al = [d.get("all", {}) for d in dec]
        hi = [d.get("high", {}) for d in dec if d.get("high", {}).get("n")]
        pp = med([r.get("pp512", {}).get("prefill_tps") for r in rs])
        ratio = 1.0 if name == "q4_0" and pp else med(pp_ratio.get(name, []))
        print(f"| {name} | {f(bpw, '.2f')} | {f(med([a.get('decode_tps') for a in al]), '.1f')}"
              f" | {f(med([a.get('frac_jobs') for a in al]), '.3f')} / {f(med([a.get('frac_flat') for a in al]), '.3f')}"
              f" | {f(med([h.get('decode_tps') for h in hi]), '.1f')} ({f(med([h.get('frac_jobs') for h in hi]), '.3f')})"
              f" | {f(pp, '.1f')} | {f(ratio, '.3f')} |")
    log(f"(every run in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
