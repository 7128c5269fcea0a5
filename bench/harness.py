#!/usr/bin/env python3
"""harness.py — sweep benchmark of inference-engine: runs, probes, plots, docs.

    python bench/harness.py --model PATH [--model PATH2 ...] \\
        --sweep 'threads=1,2|precision=native,int8w,int4w|batch=1,8' \\
        --runs 3 --prompt-tokens 128 --gen 64 [--out bench/out/<stamp>]

The sweep is the cartesian product of its axes ('|' between axes, ',' between
values). Axes map to the engine as follows:

    threads=N            --threads N
    precision=P          --precision P   (native, f32, bf16, f16, int8w, int4w)
    batch=N / streams=N  --batch N with a --prompts-file of N distinct prompts
    ctx=N                --ctx N
    isa=I                environment IE_ISA=I (ref, avx2, avx512, amx)
    IE_*=V               environment variable (IE_QUANT_GROUP=128, IE_REPACK=0, ...)
    any other key=V      --key V

Every (model, config) cell is run --runs times, interleaved round-robin
(round 1: A B C, round 2: A B C, ...) because the machine's memory bandwidth
drifts; build/bench_membw (a short probe) runs before every round and once
after the last, and each result records the probes that bracket it. A cell
whose engine exits non-zero is recorded as failed with its exit code and
error text; the sweep goes on (a cell failing with a deterministic code —
2 usage, 3 model, 5 engine creation — is not retried in later rounds, those
runs are recorded as skipped).

Outputs (under --out):
    results.jsonl   one object per run: config, command, the engine's JSON
                    line (minus text/ids), probe GB/s, bytes/token, machine
                    info (CPU, cores, RAM, kernel), git commit, date
    results.csv     the same, one flattened row per run
    summary.json    per cell: medians, min/max, runs ok
    meta.json       machine info, sweep, command line
    plots/*.png|svg per model: throughput (decode, prefill; bars = median,
                    error bars = min..max over runs) and decode latency
                    percentiles (the engine reports p50/p95 per-token decode
                    latency and mean TTFT; there is no p99); probe timeline
    membw.txt, kernels.txt, kernels.jsonl   with --kernels: the full
                    build/bench_membw and build/bench_kernels output

It then regenerates docs/PERFORMANCE.md (--doc PATH to write elsewhere,
--no-doc to skip): machine, probe range, one table per model, the plots
(small PNGs copied to perf/ beside the document), the kernel tables when
--kernels ran (in perf/kernels.md, linked from the document), and the
hand-written section between the markers
'<!-- harness:preserved:begin -->' and '<!-- harness:preserved:end -->',
which is carried over untouched (a document without markers is preserved
whole, below its title).

Bytes per decoded token are read from the GGUF header (every weight tensor
once, one token_embd row, the whole token_embd again when the output is
tied, 'exps' tensors scaled by expert_used_count/expert_count); for
--precision other than native they are estimated from the element counts
(f32 4 B, f16/bf16 2 B, int8w 34/32 B, int4w 18/32 B per element of every
2-D tensor; group 32) and marked 'est.'.

Only the Python standard library and matplotlib are used.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import itertools
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BIN = Path(os.environ.get("IE_BIN", REPO / "build" / "inference-engine"))
DEFAULT_DOC = REPO / "docs" / "PERFORMANCE.md"
CORPUS = REPO / "tests" / "data" / "corpus" / "austen_1.txt"
PRESERVE_BEGIN = "<!-- harness:preserved:begin -->"
PRESERVE_END = "<!-- harness:preserved:end -->"
FALLBACK_TEXT = (
    "The river wound slowly through the valley, past fields of barley and old stone farmhouses "
    "whose chimneys had not smoked in years. Every morning the ferryman rowed across with the "
    "post, the bread and whatever news had reached the town overnight, and every evening he "
    "rowed back with letters, empty baskets and questions nobody could answer. ")
DETERMINISTIC_EXITS = {2, 3, 5}     # usage, model, engine creation: retrying cannot help
ENGINE_DROP = ("text", "ids", "stop_reason", "channels", "prompt", "prompt_ids")


class HarnessError(Exception):
    """A problem with the harness's own inputs (bad sweep, missing binary/model)."""


def log(*a):
    print("[harness]", *a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ sweep
def parse_sweep(spec: str) -> list[tuple[str, list[str]]]:
    """'threads=1,2|precision=native,int8w' -> [('threads', ['1','2']), ...]."""
    axes: list[tuple[str, list[str]]] = []
    if not spec.strip():
        return axes
    for part in spec.split("|"):
        part = part.strip()
        if not part:
            continue
        key, sep, vals = part.partition("=")
        key = key.strip()
        values = [v.strip() for v in vals.split(",") if v.strip()]
        if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", key) or not values:
            raise HarnessError(f"bad sweep axis {part!r}: want key=v1,v2,... (axes separated by '|')")
        if any(k == key for k, _ in axes):
            raise HarnessError(f"sweep axis {key!r} given twice")
        axes.append((key, values))
    return axes


def expand(axes) -> list[dict[str, str]]:
    if not axes:
        return [{}]
    keys = [k for k, _ in axes]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in axes))]


def config_id(cfg: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items()) or "default"


def engine_invocation(bin_path: Path, model: Path, cfg: dict[str, str], prompts_file: Path,
                      gen: int, warmup: int, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) for one cell."""
    cmd = [str(bin_path), "--model", str(model), "--prompts-file", str(prompts_file),
           "--max-new", str(gen), "--greedy", "--seed", "1", "--warmup", str(warmup)]
    env: dict[str, str] = {}
    for k, v in cfg.items():
        if k in ("batch", "streams"):
            cmd += ["--batch", v]
        elif k == "isa":
            env["IE_ISA"] = v
        elif k.startswith("IE_"):
            env[k] = v
        else:                      # threads, precision, ctx, and any other --key value
            cmd += [f"--{k}", v]
    return cmd + list(extra), env


def n_streams(cfg: dict[str, str]) -> int:
    v = cfg.get("batch", cfg.get("streams", "1"))
    try:
        return max(1, int(v))
    except ValueError:
        return 1                   # the engine will reject it; the cell fails


# ---------------------------------------------------------------- prompts
def corpus_words() -> list[str]:
    try:
        text = CORPUS.read_text(encoding="utf-8")
        i = text.find("Emma Woodhouse")
        words = text[max(i, 0):].split()
        if len(words) > 2000:
            return words
    except OSError:
        pass
    return (FALLBACK_TEXT * 200).split()


def count_tokens(bin_path: Path, model: Path, text: str) -> int | None:
    try:
        cp = subprocess.run([str(bin_path), "tokenize", "--tokenizer", str(model), "--no-bos"],
                            input=text, capture_output=True, text=True, timeout=120)
        if cp.returncode != 0:
            return None
        return len(json.loads(cp.stdout)["ids"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None


def words_for_tokens(bin_path: Path, model: Path, n_tokens: int, words: list[str]) -> tuple[int, int | None]:
    """Words of corpus text giving about n_tokens tokens with this model's
    tokenizer (falls back to 0.75 words per token). -> (words, tokens)."""
    guess = max(4, int(n_tokens * 0.75))
    n = None
    for _ in range(5):
        n = count_tokens(bin_path, model, " ".join(words[:guess]))
        if n is None or abs(n - n_tokens) <= max(2, n_tokens // 50):
            break
        guess = max(4, min(len(words) // 2, int(round(guess * n_tokens / max(n, 1)))))
    return guess, n


def write_prompts(path: Path, words: list[str], n_words: int, n: int) -> None:
    """n prompts of n_words words each, from different places in the corpus."""
    lines = []
    for i in range(n):
        start = (i * 997) % max(1, len(words) - n_words)
        lines.append(" ".join(words[start:start + n_words]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ----------------------------------------------------------- GGUF header
_GGUF_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# ggml type -> (elements per block, bytes per block)
_GGML_BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
               9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
               14: (256, 210), 15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
               28: (1, 8), 30: (1, 2), 39: (32, 17)}
_PREC_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "int8w": 34 / 32, "int4w": 18 / 32}


def gguf_tensors(path: Path) -> tuple[dict, list[tuple[str, list[int], int]]]:
    """(integer/string metadata, [(name, dims, ggml type)]) from a GGUF header."""
    with open(path, "rb") as f:
        def rd(fmt):
            n = struct.calcsize("<" + fmt)
            b = f.read(n)
            if len(b) != n:
                raise ValueError("truncated GGUF header")
            return struct.unpack("<" + fmt, b)

        def rstr():
            (n,) = rd("Q")
            if n > 1 << 24:
                raise ValueError("implausible string length")
            return f.read(n).decode("utf-8", "replace")

        def value(t):
            if t in _GGUF_SCALAR:
                return rd(_GGUF_SCALAR[t])[0]
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd("IQ")
                if et in _GGUF_SCALAR:                     # skip numeric arrays (vocab scores...)
                    f.seek(struct.calcsize("<" + _GGUF_SCALAR[et]) * n, 1)
                else:
                    for _ in range(n):
                        value(et)
                return None
            raise ValueError(f"bad GGUF value type {t}")

        if f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        version, n_tensors, n_kv = rd("IQQ")
        if version < 2:
            raise ValueError(f"GGUF version {version} unsupported")
        meta = {}
        for _ in range(n_kv):
            key = rstr()
            (t,) = rd("I")
            v = value(t)
            if v is not None:
                meta[key] = v
        tensors = []
        for _ in range(n_tensors):
            name = rstr()
            (nd,) = rd("I")
            dims = list(rd("Q" * nd)) if nd else []
            (tt,) = rd("I")
            rd("Q")
            tensors.append((name, dims, tt))
    return meta, tensors


def bytes_per_token(path: Path, precision: str) -> tuple[int | None, bool, str]:
    """(weight bytes one decoded token streams, estimated?, note)."""
    try:
        meta, tensors = gguf_tensors(path)
    except (OSError, ValueError, struct.error) as e:
        return None, False, f"bytes/token unavailable: {e}"
    n_exp = next((v for k, v in meta.items() if k.endswith(".expert_count") and isinstance(v, int)), 0)
    n_used = next((v for k, v in meta.items() if k.endswith(".expert_used_count") and isinstance(v, int)), 0)
    est = precision not in ("native", "")
    per_elt = _PREC_BYTES.get(precision) if est else None
    if est and per_elt is None:
        return None, False, f"bytes/token unknown for precision {precision}"
    total, names = 0.0, {t[0] for t in tensors}
    for name, dims, tt in tensors:
        n = 1
        for d in dims:
            n *= d
        if per_elt is not None and len(dims) >= 2:
            nb = n * per_elt
        elif tt in _GGML_BLOCK:
            be, bb = _GGML_BLOCK[tt]
            nb = n / be * bb
        else:
            return None, False, f"bytes/token unknown: tensor {name} has ggml type {tt}"
        if name == "token_embd.weight":
            rows = dims[-1] if dims else 1
            total += nb / rows
            if "output.weight" not in names:
                total += nb            # tied output projection reads the whole matrix
            continue
        if "_exps" in name and n_exp and n_used:
            nb = nb * n_used / n_exp
        total += nb
    return int(total), est, ""


# ------------------------------------------------------------ machine info
def machine_info() -> dict:
    info: dict = {"hostname": platform.node(), "kernel": platform.release(),
                  "arch": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        cpu = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", cpu, re.M)
        info["cpu_model"] = m.group(1).strip() if m else None
        fl = re.search(r"^flags\s*:\s*(.+)$", cpu, re.M)
        flags = set(fl.group(1).split()) if fl else set()
        info["cpu_flags"] = [x for x in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                                         "avx512_vnni", "avx512_bf16", "amx_int8") if x in flags]
    except OSError:
        info["cpu_model"] = None
    try:
        mem = Path("/proc/meminfo").read_text()
        m = re.search(r"^MemTotal:\s*(\d+)\s*kB", mem, re.M)
        info["ram_gib"] = round(int(m.group(1)) / 2**20, 1) if m else None
    except OSError:
        info["ram_gib"] = None
    try:
        nodes = [p for p in Path("/sys/devices/system/node").glob("node[0-9]*")]
        info["numa_nodes"] = len(nodes) or None
    except OSError:
        pass
    try:
        info["loadavg"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


def git_info() -> dict:
    def git(*a):
        try:
            cp = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, timeout=20)
            return cp.stdout.strip() if cp.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            return None
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": bool(dirty) if dirty is not None else None}


# ----------------------------------------------------------------- probe
def run_probe(exe: Path | None, args: list[str]) -> dict:
    """One bandwidth probe: {'gbps': read_gbps_2t or None, 'raw': JSON, 'error': ...}."""
    if exe is None:
        return {"gbps": None, "error": "probe disabled"}
    if not exe.is_file():
        return {"gbps": None, "error": f"{exe} not found"}
    t0 = time.time()
    try:
        cp = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return {"gbps": None, "error": str(e)}
    for line in reversed(cp.stdout.splitlines()):
        if line.strip().startswith("{"):
            try:
                obj = json.loads(line)
                return {"gbps": float(obj["read_gbps_2t"]), "raw": obj,
                        "time": dt.datetime.now().isoformat(timespec="seconds"),
                        "seconds": round(time.time() - t0, 2)}
            except (ValueError, KeyError):
                break
    return {"gbps": None, "error": f"no JSON from probe (exit {cp.returncode}): {cp.stderr.strip()[-200:]}"}


# ------------------------------------------------------------ one run
def run_cell(cmd: list[str], env_extra: dict[str, str], timeout: float) -> dict:
    env = dict(os.environ, **env_extra)
    t0 = time.time()
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                            errors="replace")
    except subprocess.TimeoutExpired:
        return {"ok": False, "exit_code": None, "error": f"timeout after {timeout:g} s",
                "outer_wall_s": round(time.time() - t0, 3)}
    except OSError as e:
        return {"ok": False, "exit_code": None, "error": f"cannot run: {e}",
                "outer_wall_s": round(time.time() - t0, 3)}
    out = {"exit_code": cp.returncode, "outer_wall_s": round(time.time() - t0, 3)}
    if cp.returncode != 0:
        err = cp.stderr.strip().splitlines()
        why = f"killed by signal {-cp.returncode}" if cp.returncode < 0 else f"exit {cp.returncode}"
        out.update(ok=False, error=f"{why}: {err[-1] if err else '(no stderr)'}"[:500])
        return out
    lines = [ln for ln in cp.stdout.splitlines() if ln.strip()]
    try:
        res = json.loads(lines[-1])
        if not isinstance(res, dict):
            raise ValueError("not an object")
    except (IndexError, ValueError) as e:
        out.update(ok=False, error=f"bad stdout ({e}): {cp.stdout[:200]!r}")
        return out
    out.update(ok=True, engine={k: v for k, v in res.items() if k not in ENGINE_DROP})
    return out


# ------------------------------------------------------------ outputs
def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = " ".join(shlex.quote(str(x)) for x in v) if key == "cmd" else json.dumps(v)
        else:
            out[key] = v
    return out


def write_csv(path: Path, records: list[dict]) -> None:
    first = ["date", "model_name", "config_id", "round", "ok", "exit_code", "error", "probe_gbps",
             "probe_after_gbps", "engine.decode_tps", "engine.prefill_tps", "engine.tps",
             "engine.ttft_ms", "engine.latency_p50_ms", "engine.latency_p95_ms"]
    rows = [flatten(r) for r in records]
    cols = [c for c in first if any(c in r for r in rows)]
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def summarize(records: list[dict]) -> list[dict]:
    """Per (model, config): medians and ranges over the ok runs."""
    cells: dict[tuple[str, str], dict] = {}
    for r in records:
        key = (r["model"], r["config_id"])
        c = cells.setdefault(key, {"model": r["model"], "model_name": r["model_name"],
                                   "config_id": r["config_id"], "config": r["config"],
                                   "runs": 0, "ok": 0, "errors": [], "_vals": {},
                                   "bytes_per_token": r.get("bytes_per_token"),
                                   "bytes_per_token_est": r.get("bytes_per_token_est")})
        c["runs"] += 1
        if not r["ok"]:
            if r.get("error") and r["error"] not in c["errors"]:
                c["errors"].append(r["error"])
            continue
        c["ok"] += 1
        e = r["engine"]
        vals = {"decode_tps": e.get("decode_tps"), "prefill_tps": e.get("prefill_tps"),
                "tps": e.get("tps"), "ttft_ms": e.get("ttft_ms"),
                "latency_p50_ms": e.get("latency_p50_ms"), "latency_p95_ms": e.get("latency_p95_ms"),
                "latency_p99_ms": e.get("latency_p99_ms"),        # if the engine ever reports it
                "rss_peak_mb": e.get("rss_peak_mb"), "tokens_in": e.get("tokens_in"),
                "tokens_out": e.get("tokens_out"), "probe_gbps": r.get("probe_gbps"),
                "achieved_gbps": r.get("achieved_gbps"), "fraction_of_probe": r.get("fraction_of_probe")}
        for k, v in vals.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                c["_vals"].setdefault(k, []).append(float(v))
        for k in ("isa", "precision", "threads", "batch"):
            if k in e:
                c.setdefault("engine_" + k, e[k])
    out = []
    for c in cells.values():
        vals = c.pop("_vals")
        for k, vs in vals.items():
            c[k] = {"median": statistics.median(vs), "min": min(vs), "max": max(vs), "n": len(vs)}
        out.append(c)
    return out


def slug(s: str) -> str:
    s = re.sub(r"\.gguf$", "", s)
    return re.sub(r"[^A-Za-z0-9_-]+", "_", s).strip("_") or "model"


def make_plots(summary: list[dict], probes: list[dict], plot_dir: Path) -> dict[str, list[Path]]:
    """Per model: throughput and latency figures (PNG + SVG); a probe timeline.
    -> {model_name or '_probe': [png paths]}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    made: dict[str, list[Path]] = {}
    models = list(dict.fromkeys(c["model_name"] for c in summary))
    for mname in models:
        cells = [c for c in summary if c["model_name"] == mname]
        labels = [c["config_id"] for c in cells]
        ys = list(range(len(cells)))
        h = 1.2 + 0.38 * len(cells)

        fig, axes = plt.subplots(1, 2, figsize=(11, h), sharey=True)
        for ax, key, title in ((axes[0], "decode_tps", "decode tokens/s"),
                               (axes[1], "prefill_tps", "prefill tokens/s")):
            for y, c in zip(ys, cells):
                s = c.get(key)
                if not s:
                    ax.text(0, y, "  failed" if c["ok"] == 0 else "  n/a", va="center", color="#b00",
                            fontsize=8)
                    continue
                ax.barh(y, s["median"], color="#4a7ab5" if key == "decode_tps" else "#d08a3a",
                        xerr=[[s["median"] - s["min"]], [s["max"] - s["median"]]],
                        error_kw={"capsize": 3, "elinewidth": 1}, height=0.7)
                ax.text(s["max"], y, f" {s['median']:.1f}", va="center", fontsize=7)
            ax.set_title(title, fontsize=10)
            ax.grid(axis="x", alpha=0.3)
            ax.margins(x=0.15)
        axes[0].set_yticks(ys, labels, fontsize=8)
        axes[0].set_ylim(len(cells) - 0.5, -0.5)
        fig.suptitle(f"{mname}: median over runs, error bars min..max", fontsize=10)
        fig.tight_layout()
        base = plot_dir / f"{slug(mname)}_throughput.png"
        fig.savefig(base, dpi=90)
        fig.savefig(base.with_suffix(".svg"))
        plt.close(fig)
        made.setdefault(mname, []).append(base)

        fig, ax = plt.subplots(figsize=(9, h))
        series = [("latency_p50_ms", "#4a7ab5", "p50"), ("latency_p95_ms", "#c0504d", "p95")]
        if any(c.get("latency_p99_ms") for c in cells):
            series.append(("latency_p99_ms", "#7f5fa8", "p99"))
        bw = 0.76 / len(series)
        for i, (key, color, lab) in enumerate(series):
            off = (i - (len(series) - 1) / 2) * bw
            for y, c in zip(ys, cells):
                s = c.get(key)
                if not s:
                    continue
                ax.barh(y + off, s["median"], height=bw, color=color,
                        xerr=[[s["median"] - s["min"]], [s["max"] - s["median"]]],
                        error_kw={"capsize": 2, "elinewidth": 1},
                        label=lab if y == next((yy for yy, cc in zip(ys, cells) if cc.get(key)), -1) else None)
        for y, c in zip(ys, cells):
            if c["ok"] == 0:
                ax.text(0, y, "  failed", va="center", color="#b00", fontsize=8)
        ax.set_yticks(ys, labels, fontsize=8)
        ax.set_ylim(len(cells) - 0.5, -0.5)
        ax.set_xlabel("per-token decode latency, ms" + ("" if len(series) > 2 else
                      " (the engine reports p50 and p95; no p99)"), fontsize=8)
        ax.set_title(f"{mname}: decode latency percentiles (median, min..max)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        if any(c.get("latency_p50_ms") for c in cells):
            ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        base = plot_dir / f"{slug(mname)}_latency.png"
        fig.savefig(base, dpi=90)
        fig.savefig(base.with_suffix(".svg"))
        plt.close(fig)
        made[mname].append(base)

    probes = [(p["round"], p["gbps"]) for p in probes if p.get("gbps")]
    if probes:
        fig, ax = plt.subplots(figsize=(6, 2.4))
        ax.plot([p[0] for p in probes], [p[1] for p in probes], "o-", color="#555")
        ax.set_xlabel("before round (last: after the final round)", fontsize=8)
        ax.set_ylabel("read GB/s", fontsize=8)
        ax.set_title("bandwidth probe before each round (bench_membw, read_gbps_2t)", fontsize=9)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        base = plot_dir / "probe_timeline.png"
        fig.savefig(base, dpi=90)
        fig.savefig(base.with_suffix(".svg"))
        plt.close(fig)
        made["_probe"] = [base]
    return made


# ----------------------------------------------------------------- kernels
def run_kernels(bin_dir: Path, out_dir: Path, kernels_args: list[str], membw_args: list[str]) -> dict:
    got = {}
    for name, args in (("membw", membw_args), ("kernels", kernels_args)):
        exe = bin_dir / f"bench_{name}"
        if not exe.is_file():
            log(f"{exe} not found; skipping")
            got[name] = {"error": f"{exe} not found"}
            continue
        log(f"running {exe.name} {' '.join(args)}")
        try:
            cp = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.SubprocessError) as e:
            got[name] = {"error": str(e)}
            continue
        (out_dir / f"{name}.txt").write_text(cp.stdout + (cp.stderr and "\n# stderr\n" + cp.stderr))
        objs = []
        for line in cp.stdout.splitlines():
            if line.startswith("{"):
                try:
                    objs.append(json.loads(line))
                except ValueError:
                    pass
        with open(out_dir / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for o in objs:
                f.write(json.dumps(o) + "\n")
        got[name] = {"exit_code": cp.returncode, "json": objs}
    return got


def kernel_tables(kern: dict) -> list[str]:
    L: list[str] = []
    mb = [o for o in kern.get("membw", {}).get("json", []) if o.get("bench") == "membw"]
    if mb:
        o = mb[-1]
        t = o.get("threads", 2)

        def g(k):
            v = o.get(k)
            return f"{v:.1f} GB/s" if isinstance(v, (int, float)) else "-"
        L += ["### Memory bandwidth (`bench_membw`, read)", "",
              "| threads | 2 MiB pages | 4 KiB pages |", "|---|---|---|",
              f"| 1 | {g('read_gbps_1t')} | {g('read_gbps_1t_4k')} |",
              f"| {t} | {g('read_gbps_2t')} | {g('read_gbps_2t_4k')} |", ""]
    ks = kern.get("kernels", {}).get("json", [])
    gemv = [o for o in ks if o.get("bench") == "gemv"]
    if gemv:
        shapes = list(dict.fromkeys(f"{o['n_out']}x{o['n_in']}" for o in gemv))
        rows = list(dict.fromkeys((o["isa"], o["type"]) for o in gemv))
        th = gemv[0].get("threads")
        L += [f"### Decode GEMV (`bench_kernels`, {th} threads): GB/s of weights (fraction of an interleaved bandwidth read)",
              "", "| isa | type | " + " | ".join(shapes) + " |", "|---|---|" + "---|" * len(shapes)]
        for isa, ty in rows:
            cells = []
            for s in shapes:
                o = next((o for o in gemv if o["isa"] == isa and o["type"] == ty
                          and f"{o['n_out']}x{o['n_in']}" == s), None)
                cells.append(f"{o['gbps']:.1f} ({o['frac']:.2f})" if o else "-")
            L.append(f"| {isa} | {ty} | " + " | ".join(cells) + " |")
        L.append("")
    gemm = [o for o in ks if o.get("bench") == "gemm"]
    if gemm:
        shapes = list(dict.fromkeys(f"{o['n_out']}x{o['n_in']}x{o['n_tok']}" for o in gemm))
        rows = list(dict.fromkeys((o["isa"], o["type"]) for o in gemm))
        L += ["### Prefill GEMM (`bench_kernels`): GOP/s, shape n_out x n_in x tokens", "",
              "| isa | type | " + " | ".join(shapes) + " |", "|---|---|" + "---|" * len(shapes)]
        for isa, ty in rows:
            cells = []
            for s in shapes:
                o = next((o for o in gemm if o["isa"] == isa and o["type"] == ty
                          and f"{o['n_out']}x{o['n_in']}x{o['n_tok']}" == s), None)
                cells.append(f"{o['gops']:.0f}" if o else "-")
            L.append(f"| {isa} | {ty} | " + " | ".join(cells) + " |")
        L.append("")
    return L


# ------------------------------------------------------------------- doc
def preserved_section(doc: Path) -> str:
    if not doc.is_file():
        return "(Hand-written findings go here; bench/harness.py keeps this section as it is.)\n"
    text = doc.read_text(encoding="utf-8")
    b, e = text.find(PRESERVE_BEGIN), text.find(PRESERVE_END)
    if b >= 0 and e > b:
        return text[b + len(PRESERVE_BEGIN):e].strip("\n") + "\n"
    lines = text.splitlines()                           # no markers: keep all but the title
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(lines).strip("\n") + "\n"


def fmt(v, spec=".1f", none="-"):
    return none if v is None else format(v, spec)


def med(c, k):
    s = c.get(k)
    return s["median"] if s else None


def write_doc(doc: Path, meta: dict, summary: list[dict], plots: dict[str, list[Path]],
              kern: dict, out_dir: Path) -> None:
    perf_dir = doc.parent / "perf"
    perf_dir.mkdir(parents=True, exist_ok=True)
    links: dict[str, list[str]] = {}
    for name, pngs in plots.items():
        for p in pngs:
            shutil.copyfile(p, perf_dir / p.name)
            links.setdefault(name, []).append(f"perf/{p.name}")
    preserved = preserved_section(doc)
    m, s = meta["machine"], meta["sweep"]
    probes = [p for p in meta.get("probes", []) if p.get("gbps")]
    try:
        out_rel = out_dir.resolve().relative_to(REPO)
    except ValueError:
        out_rel = out_dir
    L = ["# Performance", "",
         f"<!-- The section between the 'harness:preserved' markers is hand-written; the rest is "
         f"generated by bench/harness.py ({meta['date']}). Regenerate with `make bench`. -->", "",
         "## Current state (hand-written)", "", PRESERVE_BEGIN, preserved.rstrip("\n"), PRESERVE_END, "",
         "## Latest sweep (bench/harness.py)", "",
         f"- **Machine**: {m.get('cpu_model') or '?'}, {m.get('cores')} cores "
         f"({', '.join(m.get('cpu_flags') or []) or 'flags ?'}), {m.get('ram_gib')} GiB RAM, "
         f"{m.get('numa_nodes') or '?'} NUMA node(s), Linux {m.get('kernel')}; load average "
         f"{fmt(m.get('loadavg'), '.1f')} at the start",
         f"- **Commit**: `{(meta.get('git_commit') or '?')[:12]}`" + (" (dirty tree)" if meta.get("git_dirty") else "")
         + f", {meta['date']}",
         f"- **Sweep**: `{s['spec'] or '(none)'}` × {len(meta['models'])} model(s), {s['runs']} run(s) per "
         f"cell interleaved round-robin, prompt ~{s['prompt_tokens']} tokens, {s['gen']} generated "
         f"(greedy, --warmup {s['warmup']}), raw results in `{out_rel}`",
         ]
    if probes:
        g = [p["gbps"] for p in probes]
        L.append(f"- **Bandwidth probe** (`bench_membw {' '.join(meta['probe_args'])}`, read GB/s at "
                 f"{probes[0].get('raw', {}).get('threads', 2)} threads, before every round and after "
                 f"the last): {min(g):.1f} – {max(g):.1f} GB/s (median {statistics.median(g):.1f})")
    else:
        L.append("- **Bandwidth probe**: not run")
    L += ["", "Columns: medians over the successful runs of each cell, [min – max] for decode. "
          "MB/tok = weight bytes one decode step streams (from the GGUF; 'est.' when the "
          "precision changes the weight types), GB/s = MB/tok × decode t/s / batch (a step "
          "decodes one token of each of the batch's sequences), % probe = that over the mean of "
          "the probes bracketing the run. Latency = per-token decode latency (the engine reports "
          "p50 and p95, no p99); TTFT = mean time to first token.", ""]
    for mname in dict.fromkeys(c["model_name"] for c in summary):
        cells = [c for c in summary if c["model_name"] == mname]
        L += [f"### {mname}", "",
              "| config | decode t/s | prefill t/s | TTFT ms | p50 ms | p95 ms | MB/tok | GB/s | % probe | RSS MB | runs ok |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in cells:
            d = c.get("decode_tps")
            bpt = c.get("bytes_per_token")
            mbt = f"{bpt / 1e6:.0f}" + (" est." if c.get("bytes_per_token_est") else "") if bpt else "-"
            if c["ok"] == 0:
                err = (c["errors"][0] if c["errors"] else "failed").replace("|", "\\|")
                L.append(f"| {c['config_id']} | failed: {err[:120]} | | | | | {mbt} | | | | 0/{c['runs']} |")
                continue
            fr = med(c, "fraction_of_probe")
            L.append(f"| {c['config_id']} | {fmt(d['median'] if d else None, '.1f')}"
                     + (f" [{d['min']:.1f} – {d['max']:.1f}]" if d and d["n"] > 1 else "")
                     + f" | {fmt(med(c, 'prefill_tps'), '.1f')} | {fmt(med(c, 'ttft_ms'), '.1f')}"
                     f" | {fmt(med(c, 'latency_p50_ms'), '.2f')} | {fmt(med(c, 'latency_p95_ms'), '.2f')}"
                     f" | {mbt} | {fmt(med(c, 'achieved_gbps'), '.1f')} | {fmt(fr * 100 if fr else None, '.0f')}"
                     f" | {fmt(med(c, 'rss_peak_mb'), '.0f')} | {c['ok']}/{c['runs']} |")
        L.append("")
        for link in links.get(mname, []):
            L.append(f"![{mname} {Path(link).stem.rsplit('_', 1)[-1]}]({link})")
        L.append("")
    if "_probe" in links:
        L += [f"![bandwidth probe per round]({links['_probe'][0]})", ""]
    kt = kernel_tables(kern) if kern else []
    if kt:  # in a page of their own, to keep the document short
        (perf_dir / "kernels.md").write_text("\n".join(
            ["# Kernel microbenchmarks", "", f"Generated by bench/harness.py --kernels ({meta['date']}), "
             "the same session as [the sweep](../PERFORMANCE.md).", ""] + kt), encoding="utf-8")
        L += ["## Kernel microbenchmarks (same session)", "",
              "Memory bandwidth, decode GEMV and prefill GEMM per ISA and type: [perf/kernels.md](perf/kernels.md).",
              ""]
    doc.write_text("\n".join(L), encoding="utf-8")


# ------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, type=Path, help="GGUF/HF model (repeatable)")
    ap.add_argument("--sweep", default="threads=2",
                    help="axes 'key=v1,v2|key2=...' (threads, precision, batch/streams, ctx, isa, other --key)")
    ap.add_argument("--runs", type=int, default=3, help="runs per cell, interleaved round-robin (3)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens, about (128)")
    ap.add_argument("--gen", type=int, default=64, help="tokens generated per prompt (--max-new, 64)")
    ap.add_argument("--warmup", type=int, default=1, help="engine --warmup per run (1)")
    ap.add_argument("--out", type=Path, help="output dir (default bench/out/<stamp>)")
    ap.add_argument("--bin", type=Path, default=DEFAULT_BIN, help="inference-engine (default $IE_BIN or build/)")
    ap.add_argument("--membw", type=Path, help="bandwidth probe binary (default bench_membw beside --bin)")
    ap.add_argument("--probe-args", default="--size-mib 256 --passes 2",
                    help="arguments of the between-rounds probe ('--size-mib 256 --passes 2')")
    ap.add_argument("--no-probe", action="store_true", help="skip the bandwidth probe")
    ap.add_argument("--kernels", action="store_true",
                    help="also run bench_membw and bench_kernels (beside --bin) in full, output to the out dir")
    ap.add_argument("--kernels-args", default="", help="arguments for bench_kernels")
    ap.add_argument("--engine-args", default="", help="extra inference-engine arguments for every cell")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run (900)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-doc", action="store_true", help="do not regenerate the performance document")
    ap.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="document to regenerate (docs/PERFORMANCE.md)")
    a = ap.parse_args(argv)

    try:
        axes = parse_sweep(a.sweep)
        if a.runs < 1 or a.prompt_tokens < 1 or a.gen < 0 or a.warmup < 0:
            raise HarnessError("--runs and --prompt-tokens must be >= 1, --gen and --warmup >= 0")
        if not (a.bin.is_file() and os.access(a.bin, os.X_OK)):
            raise HarnessError(f"inference-engine not found or not executable at {a.bin} (build it, or --bin / IE_BIN)")
        for mp in a.model:
            if not mp.exists():
                raise HarnessError(f"model not found: {mp}")
    except HarnessError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        return 2

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = a.out or REPO / "bench" / "out" / stamp
    out.mkdir(parents=True, exist_ok=True)
    configs = expand(axes)
    probe_exe = None if a.no_probe else (a.membw or a.bin.parent / "bench_membw")
    probe_args = shlex.split(a.probe_args)
    extra = shlex.split(a.engine_args)
    machine = machine_info()
    meta = {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine,
            **git_info(), "argv": sys.argv if argv is None else ["harness.py", *argv],
            "bin": str(a.bin), "models": [str(m) for m in a.model], "probe_args": probe_args,
            "sweep": {"spec": a.sweep, "axes": axes, "configs": [config_id(c) for c in configs],
                      "runs": a.runs, "prompt_tokens": a.prompt_tokens, "gen": a.gen, "warmup": a.warmup}}

    # Prompts per model and stream count; bytes/token per model and precision.
    words = corpus_words()
    prompts_dir = out / "prompts"
    prompts_dir.mkdir(exist_ok=True)
    model_info: dict[Path, dict] = {}
    for mp in a.model:
        nw, nt = words_for_tokens(a.bin, mp, a.prompt_tokens, words)
        log(f"{mp.name}: prompt of {nw} words = {nt if nt is not None else '?'} tokens")
        model_info[mp] = {"words": nw, "tokens": nt, "files": {}, "bpt": {}}
    cells = []
    for mp in a.model:
        for cfg in configs:
            ns = n_streams(cfg)
            mi = model_info[mp]
            if ns not in mi["files"]:
                pf = prompts_dir / f"{slug(mp.stem)}_{ns}.txt"
                write_prompts(pf, words, mi["words"], ns)
                mi["files"][ns] = pf
            prec = cfg.get("precision", "native")
            if prec not in mi["bpt"]:
                mi["bpt"][prec] = bytes_per_token(mp, prec) if mp.is_file() else (None, False, "not a GGUF file")
            cmd, env = engine_invocation(a.bin, mp, cfg, mi["files"][ns], a.gen, a.warmup, extra)
            cells.append({"model": mp, "cfg": cfg, "cmd": cmd, "env": env, "failed_hard": None})

    log(f"{len(cells)} cell(s) x {a.runs} run(s) -> {out}")
    records: list[dict] = []
    probes: list[dict] = []          # probes[r]: before round r; probes[runs]: after the last

    def probe(rnd: int) -> dict:
        p = run_probe(probe_exe, probe_args)
        p["round"] = rnd
        probes.append(p)
        return p

    interrupted = False
    try:
        for rnd in range(a.runs):
            p = probe(rnd)
            log(f"round {rnd + 1}/{a.runs}: probe {fmt(p.get('gbps'), '.1f')} GB/s"
                + (f" ({p['error']})" if p.get("error") else ""))
            for cell in cells:
                mp, cfg = cell["model"], cell["cfg"]
                bpt, est, note = model_info[mp]["bpt"][cfg.get("precision", "native")]
                rec = {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                       "model": str(mp), "model_name": mp.name, "config": cfg, "config_id": config_id(cfg),
                       "round": rnd, "cmd": cell["cmd"], "env": cell["env"],
                       "prompt_tokens_target": a.prompt_tokens, "gen": a.gen,
                       "bytes_per_token": bpt, "bytes_per_token_est": est}
                if note:
                    rec["bytes_per_token_note"] = note
                if cell["failed_hard"]:
                    rec.update(ok=False, skipped=True, exit_code=None,
                               error=f"skipped: {cell['failed_hard']}")
                else:
                    rec.update(run_cell(cell["cmd"], cell["env"], a.timeout))
                    if not rec["ok"] and rec.get("exit_code") in DETERMINISTIC_EXITS:
                        cell["failed_hard"] = f"round {rnd + 1} failed with {rec['error']}"
                status = (f"decode {fmt(rec['engine'].get('decode_tps'), '.1f')} t/s, prefill "
                          f"{fmt(rec['engine'].get('prefill_tps'), '.1f')} t/s" if rec["ok"]
                          else f"FAILED: {rec['error']}")
                log(f"  {mp.name} [{rec['config_id']}] {status}")
                records.append(rec)
        probe(a.runs)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: writing the results so far")
    by_round = {p["round"]: p.get("gbps") for p in probes}
    with open(out / "results.jsonl", "w", encoding="utf-8") as jsonl:
        for rec in records:
            rec["probe_gbps"] = by_round.get(rec["round"])
            rec["probe_after_gbps"] = by_round.get(rec["round"] + 1)
            pb = [g for g in (rec["probe_gbps"], rec["probe_after_gbps"]) if g]
            rec["probe_mean_gbps"] = sum(pb) / len(pb) if pb else None
            dec = rec.get("engine", {}).get("decode_tps") if rec["ok"] else None
            if rec.get("bytes_per_token") and isinstance(dec, (int, float)) and dec > 0:
                # One decode step streams the weights once for all `batch` sequences.
                nb = rec["engine"].get("batch") or n_streams(rec["config"])
                rec["achieved_gbps"] = rec["bytes_per_token"] * dec / max(1, nb) / 1e9
                if rec["probe_mean_gbps"]:
                    rec["fraction_of_probe"] = rec["achieved_gbps"] / rec["probe_mean_gbps"]
            rec.update(machine={k: machine.get(k) for k in ("cpu_model", "cores", "ram_gib", "kernel")},
                       git_commit=meta.get("git_commit"))
            jsonl.write(json.dumps(rec) + "\n")
    meta["probes"] = probes
    kern = run_kernels(a.bin.parent, out, shlex.split(a.kernels_args), []) if a.kernels and not interrupted else {}
    write_csv(out / "results.csv", records)
    summary = summarize(records)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    plots = {} if a.no_plots else make_plots(summary, probes, out / "plots")
    if not a.no_doc and not interrupted:         # a partial sweep does not replace the document
        write_doc(a.doc, meta, summary, plots, kern, out)
        log(f"wrote {a.doc}")

    # Console summary.
    print(f"{'model':34} {'config':36} {'decode t/s':>10} {'prefill t/s':>11} {'%probe':>6} {'ok':>5}")
    for c in summary:
        fr = med(c, "fraction_of_probe")
        line = (f"{c['model_name'][:34]:34} {c['config_id'][:36]:36} {fmt(med(c, 'decode_tps')):>10} "
                f"{fmt(med(c, 'prefill_tps')):>11} {fmt(fr * 100 if fr else None, '.0f'):>6} "
                f"{c['ok']}/{c['runs']:<3}")
        if c["ok"] == 0 and c["errors"]:
            line += f"  {c['errors'][0][:80]}"
        print(line)
    log(f"results in {out}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
