#!/usr/bin/env python3
"""ppl_table.py — perplexity of GGUF files under llama.cpp and under clocher.

For each GGUF file (the arguments: files, or directories searched for
*.gguf) runs

  llama-perplexity -m FILE -f TEXT -c CTX --chunks K -b CTX -t THREADS
  inference-engine perplexity --model FILE --file TEXT --ctx CTX --chunks K --threads THREADS

and prints a markdown table on stdout:

  file | type | bpw | llama.cpp PPL | clocher PPL | rel. diff | llama.cpp s | clocher s

  type       general.file_type of the file (llama-quantize's name for it; the
             tensors inside may be other types, see scripts/make_kquant_models.sh)
  bpw        bits per weight: file size * 8 / number of tensor elements
             (metadata included, so a little above the tensors' own bpw)
  rel. diff  (clocher - llama.cpp) / llama.cpp
  s          wall seconds of the run, and (in brackets) its CPU seconds, which
             say more on a busy machine

A file either tool cannot evaluate shows "n/a (its error message)" in that
column and the table goes on. Progress goes to stderr; with --jsonl every row
is also appended to a file as one JSON object.

Both tools score the same tokens: the text is tokenized as a whole, cut into
non-overlapping windows of CTX tokens, each window is evaluated from an empty
cache and only its second half is scored (CTX/2 - 1 tokens per window, the
last token of a window predicts nothing). -b CTX makes llama-perplexity
evaluate one window per batch as clocher does (its default, -b 2048, packs 4
windows of 512 into one batch of 4 sequences). For SmolLM2 both tokenizers
give the same 221850 ids for austen_1.txt (checked with llama-tokenize).

By default llama-perplexity runs with `-fa off -ctk f32 -ctv f32`, the
arithmetic of clocher's attention: an f32 KV cache and a plain softmax.
Stock llama-perplexity (flash attention "auto", on for CPU, with an f16 KV
cache and an f16 accumulator for V) differs from it by up to ~0.1% on 40
windows of SmolLM2; `--llama-args ''` gives the stock figure.

Known differences that remain:
  * BOS: llama-perplexity tokenizes the text *with* BOS when the vocabulary
    adds one (then replaces each window's first token by BOS), clocher
    tokenizes it without BOS and replaces each window's first token. For a
    vocabulary with add_bos_token = true (Llama-2 SPM, e.g. the TinyLlama
    bench files) the windows are shifted by one token between the tools. For
    SmolLM2 (add_bos_token = false) neither adds BOS and the windows are the
    same.
  * Activations: llama.cpp multiplies quantized weights by 8-bit quantized
    activations (Q8_0/Q8_1/Q8_K); clocher's repacked Q8_0 path uses 16-bit
    ones (Q16_P), so its Q8_0 perplexity is ~0.4% lower than llama.cpp's on
    SmolLM2 (with IE_REPACK=0, 8-bit row kernels, it agrees to 0.02%).

Usage: bench/ppl_table.py [PATH ...] [--text FILE] [--ctx N] [--chunks K]
                          [--threads N] [--bin PATH] [--llama-perplexity PATH]
                          [--timeout S] [--only llama|clocher] [--jsonl FILE]
Defaults: PATH models/kquant and models/SmolLM2-135M-Instruct.Q4_1.gguf
(tinyllama-* files are skipped unless named: random weights, and much
slower), --text tests/data/corpus/austen_1.txt, --ctx 512, --chunks 40.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import gguf

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PATHS = [REPO / "models" / "kquant", REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"]
DEFAULT_LLAMA = REPO / "third_party" / "llama.cpp" / "build" / "bin" / "llama-perplexity"


def log(*a):
    print("[ppl_table]", *a, file=sys.stderr, flush=True)


def gguf_info(path: Path) -> tuple[str, float]:
    """(file type name, bits per weight from the file size)."""
    r = gguf.GGUFReader(str(path))
    n = sum(int(t.n_elements) for t in r.tensors)
    ftype = "?"
    f = r.fields.get("general.file_type")
    if f is not None:
        v = int(f.contents())
        try:
            ftype = gguf.LlamaFileType(v).name.removeprefix("MOSTLY_")
        except ValueError:
            ftype = str(v)
    return ftype, path.stat().st_size * 8 / n


def short(msg: str, n: int = 160) -> str:
    msg = " ".join(msg.split()).replace("|", "/")
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd: list[str], timeout: float) -> tuple[int, str, str, dict]:
    """(exit status, stdout, stderr, {"s": wall seconds, "cpu": CPU seconds})."""
    t0, c0 = time.monotonic(), cpu_children()
    t = lambda: {"s": time.monotonic() - t0, "cpu": cpu_children() - c0}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout:.0f} s", t()
    except OSError as e:
        return -1, "", str(e), t()
    return p.returncode, p.stdout, p.stderr, t()


def llama_ppl(exe: str, model: Path, a) -> dict:
    if not Path(exe).is_file():
        return {"error": f"no {exe} (run scripts/llama_cpp.sh)"}
    cmd = [exe, "-m", str(model), "-f", str(a.text), "-c", str(a.ctx), "-b", str(a.ctx),
           "--chunks", str(a.chunks), "-t", str(a.threads)] + shlex.split(a.llama_args)
    rc, out, err, tm = run(cmd, a.timeout)
    text = out + err
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
    if rc != 0 or not m:
        lines = [l for l in text.splitlines() if re.search(r"error|failed|timed out", l, re.I)]
        return {"error": short(lines[-1] if lines else f"exit {rc}"), **tm}
    r = {"ppl": float(m.group(1)), "pm": float(m.group(2)), **tm}
    c = re.search(r"calculating perplexity over (\d+) chunks", text)
    if c:
        r["chunks"] = int(c.group(1))
    return r


def clocher_ppl(exe: str, model: Path, a) -> dict:
    cmd = [exe, "perplexity", "--model", str(model), "--file", str(a.text), "--ctx", str(a.ctx),
           "--chunks", str(a.chunks), "--threads", str(a.threads)]
    rc, out, err, tm = run(cmd, a.timeout)
    if rc == 0:
        try:
            j = json.loads(out.strip().splitlines()[-1])
            return {"ppl": j["ppl"], "chunks": j["chunks"], "tokens": j["tokens"], **tm}
        except (ValueError, KeyError, IndexError):
            pass
    lines = [l for l in err.splitlines() if l.strip()]
    msg = next((l for l in reversed(lines) if l.startswith("error:")), lines[-1] if lines else f"exit {rc}")
    return {"error": short(msg.removeprefix("error: ")), **tm}


def cell(r: dict | None) -> str:
    if r is None:
        return "—"
    return f"{r['ppl']:.4f}" if "ppl" in r else f"n/a ({r['error']})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--text", type=Path, default=REPO / "tests" / "data" / "corpus" / "austen_1.txt")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--bin", default=str(REPO / "build" / "inference-engine"))
    ap.add_argument("--llama-perplexity", default=os.environ.get("LLAMA_PERPLEXITY", str(DEFAULT_LLAMA)))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--llama-args", default="-fa off -ctk f32 -ctv f32",
                    help="extra llama-perplexity arguments ('' for its defaults)")
    ap.add_argument("--only", choices=["llama", "clocher"])
    ap.add_argument("--jsonl", type=Path)
    a = ap.parse_args()

    files: list[Path] = []
    for p in a.paths or DEFAULT_PATHS:
        if p.is_dir():
            files += sorted(f for f in p.glob("*.gguf") if a.paths or not f.name.startswith("tinyllama"))
        elif p.is_file():
            files.append(p)
        elif a.paths:
            log(f"no such file or directory: {p}")
            return 2
    if not files:
        log("no GGUF files")
        return 2

    rows = []
    for f in files:
        ftype, bpw = gguf_info(f)
        row = {"file": f.name, "type": ftype, "bpw": bpw, "ctx": a.ctx, "chunks": a.chunks,
               "text": a.text.name, "threads": a.threads}
        if a.only != "clocher":
            log(f"{f.name}: llama-perplexity")
            row["llama"] = llama_ppl(a.llama_perplexity, f, a)
        if a.only != "llama":
            log(f"{f.name}: inference-engine perplexity")
            row["clocher"] = clocher_ppl(a.bin, f, a)
        log(f"{f.name}: {cell(row.get('llama'))} vs {cell(row.get('clocher'))}")
        rows.append(row)
        if a.jsonl:
            with a.jsonl.open("a") as o:
                o.write(json.dumps(row) + "\n")

    print(f"Perplexity on {a.text.name}, ctx {a.ctx}, {a.chunks} chunks, {a.threads} threads, "
          f"llama-perplexity args '{a.llama_args}'\n")
    print("| file | type | bpw | llama.cpp PPL | clocher PPL | rel. diff | llama.cpp s (CPU s) | clocher s (CPU s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        lp, cp = r.get("llama"), r.get("clocher")
        diff = "—"
        if lp and cp and "ppl" in lp and "ppl" in cp:
            diff = f"{(cp['ppl'] - lp['ppl']) / lp['ppl'] * 100:+.2f}%"
        secs = [f"{x['s']:.0f} ({x['cpu']:.0f})" if x and "s" in x else "—" for x in (lp, cp)]
        print(f"| {r['file']} | {r['type']} | {r['bpw']:.2f} | {cell(lp)} | {cell(cp)} | {diff} | "
              f"{secs[0]} | {secs[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
