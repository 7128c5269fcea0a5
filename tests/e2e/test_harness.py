"""bench/harness.py end to end on SmolLM2: a 2x1 sweep (one cell meant to
fail: --threads 0 is a usage error), one run, few tokens, --no-doc, into a
tmp dir. Checks results.jsonl / results.csv / summary.json parse, the failed
cell is recorded (exit code, error text) rather than crashing the sweep, the
plots exist as PNG and SVG, and the document generator keeps the
hand-written section between its markers.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import IE_BIN, REPO, SMOLLM2, need_file

HARNESS = REPO / "bench" / "harness.py"
sys.path.insert(0, str(HARNESS.parent))
import harness  # noqa: E402


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    need_file(IE_BIN, "inference-engine binary (set IE_BIN or build it)")
    need_file(SMOLLM2, "SmolLM2 GGUF (run scripts/setup.sh)")
    out = tmp_path_factory.mktemp("harness") / "out"
    cmd = [sys.executable, str(HARNESS), "--bin", str(IE_BIN), "--model", str(SMOLLM2),
           "--sweep", "threads=2,0|precision=native", "--runs", "1", "--prompt-tokens", "16",
           "--gen", "4", "--warmup", "0", "--probe-args", "--size-mib 64 --passes 1",
           "--out", str(out), "--no-doc"]
    doc = REPO / "docs" / "PERFORMANCE.md"
    before = doc.read_bytes() if doc.is_file() else None
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, f"harness exit {cp.returncode}\nstderr: {cp.stderr[-3000:]}"
    assert (doc.read_bytes() if doc.is_file() else None) == before, "--no-doc must not touch the document"
    return out


def test_jsonl_records_ok_and_failed_cells(sweep):
    recs = [json.loads(line) for line in (sweep / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 2, recs
    by_threads = {r["config"]["threads"]: r for r in recs}
    ok, bad = by_threads["2"], by_threads["0"]
    assert ok["ok"] is True and ok["exit_code"] == 0
    e = ok["engine"]
    assert e["decode_tps"] > 0 and e["prefill_tps"] > 0 and e["threads"] == 2
    assert "latency_p50_ms" in e and "text" not in e
    assert ok["bytes_per_token"] and ok["bytes_per_token"] > 50e6     # SmolLM2 Q4_1: ~97 MB
    assert ok["machine"]["cores"] and ok["git_commit"] is not None
    assert "probe_gbps" in ok and "date" in ok
    assert bad["ok"] is False and bad["exit_code"] == 2
    assert "threads" in bad["error"], bad["error"]
    assert bad["cmd"][0] == str(IE_BIN) and "--threads" in bad["cmd"]


def test_csv_one_row_per_run(sweep):
    with open(sweep / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert {r["config.threads"] for r in rows} == {"2", "0"}
    good = next(r for r in rows if r["ok"] == "True")
    assert float(good["engine.decode_tps"]) > 0
    failed = next(r for r in rows if r["ok"] == "False")
    assert failed["error"] and failed["engine.decode_tps"] == ""


def test_summary_and_plots(sweep):
    summary = json.loads((sweep / "summary.json").read_text())
    assert {c["config_id"]: c["ok"] for c in summary} == {"threads=2 precision=native": 1,
                                                          "threads=0 precision=native": 0}
    pngs = sorted((sweep / "plots").glob("*.png"))
    names = {p.name for p in pngs}
    assert any(n.endswith("_throughput.png") for n in names), names
    assert any(n.endswith("_latency.png") for n in names), names
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p
        assert p.with_suffix(".svg").is_file(), p


def test_doc_keeps_preserved_section(sweep, tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\nold generated text\n\n" + harness.PRESERVE_BEGIN +
                   "\nHand-written | keep *me*.\n" + harness.PRESERVE_END + "\n")
    meta = json.loads((sweep / "meta.json").read_text())
    summary = json.loads((sweep / "summary.json").read_text())
    plots = {c["model_name"]: sorted((sweep / "plots").glob(f"{harness.slug(c['model_name'])}_*.png"))
             for c in summary}
    harness.write_doc(doc, meta, summary, plots, {}, sweep)
    text = doc.read_text()
    assert "Hand-written | keep *me*." in text and "old generated text" not in text
    assert text.count(harness.PRESERVE_BEGIN) == 1
    assert "| threads=2 precision=native |" in text and "failed: exit 2" in text
    for line in text.splitlines():
        if line.startswith("!["):
            link = line[line.index("(") + 1:line.rindex(")")]
            assert (doc.parent / link).is_file(), link


def test_bad_sweep_is_a_clear_error(tmp_path):
    cp = subprocess.run([sys.executable, str(HARNESS), "--bin", str(IE_BIN), "--model", str(SMOLLM2),
                         "--sweep", "threads", "--out", str(tmp_path / "o"), "--no-doc"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "bad sweep axis" in cp.stderr, cp.stderr


def test_sweep_mapping():
    axes = harness.parse_sweep("threads=1,2|precision=native,int8w|batch=1,8|isa=avx2|ctx=512")
    cfgs = harness.expand(axes)
    assert len(cfgs) == 8
    cmd, env = harness.engine_invocation(Path("ie"), Path("m.gguf"), cfgs[-1], Path("p.txt"), 4, 0, [])
    assert env == {"IE_ISA": "avx2"}
    s = " ".join(cmd)
    assert "--threads 2" in s and "--precision int8w" in s and "--batch 8" in s and "--ctx 512" in s
    assert "--prompts-file p.txt" in s
