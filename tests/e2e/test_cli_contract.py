"""The generate mode's contract (docs/CLI.md): the streaming prompts batcher
(order, per-line errors, memory independent of the file's length, several
tokenizer threads), --aggregate, the seeds' flags and environment variables
(each honoured or refused with a message; flags win), the exit codes 0, 2,
3, 5, 6, and the stage timers adding up to the wall time."""
import os
import random
import resource
import subprocess
import tempfile

import pytest

from conftest import THREADS, fixture_path, parse_single_json_line, run_cli, run_json

TINY = "tiny_llama"            # HF directory: fast enough for 200,000 prompts
TINY_GGUF = "tiny_llama_q8_0.gguf"
# distinct prompts; a file's lines are drawn from them so that every line's
# expected output is known
WORDS = ["hello world", "the cat sat", "one two three four", "zebra", "a b c d e f",
         "quantum fields", "red green blue"]


def _tiny():
    return str(fixture_path(TINY))


def _run_peak(ie_bin, args):
    """(json, peak RSS in MiB). The kernel's count comes from GNU time when
    it is installed (a wait4 straight from this process would include the
    pages this Python process had when it forked); else the engine's own
    rss_peak_mb (VmHWM, which exec resets)."""
    cmd = [str(ie_bin)] + [str(a) for a in args]
    gtime = "/usr/bin/time"
    rep = None
    if os.access(gtime, os.X_OK):
        rep = tempfile.NamedTemporaryFile(delete=False)
        rep.close()
        cmd = [gtime, "-f", "%M", "-o", rep.name] + cmd
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    out = parse_single_json_line(cp.stdout)
    peak = out["rss_peak_mb"]
    if rep:
        with open(rep.name) as f:
            peak = int(f.read().split()[-1]) / 1024.0
        os.unlink(rep.name)
    return out, peak


def _write_prompts(path, n, seed):
    rng = random.Random(seed)
    choice = [rng.randrange(len(WORDS)) for _ in range(n)]
    with open(path, "w", encoding="utf-8") as f:
        for c in choice:
            f.write(WORDS[c] + "\n")
    return choice


def _reference(tmp_path, batch):
    pf = tmp_path / "words.txt"
    pf.write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    ref = run_json(["--model", _tiny(), "--prompts-file", pf, "--max-new", "1", "--greedy",
                    "--threads", "1", "--batch", str(batch)])
    assert len(set(map(tuple, ref["ids"]))) >= 3, "the reference prompts must tell lines apart"
    return ref["ids"]


def test_batcher_order_errors_constant_memory(tmp_path, ie_bin):
    """200,000 prompts with --max-new 1: output in input order, a bad line
    (invalid UTF-8) and an over-long one reported in their places, peak RSS
    as for 20,000 prompts, tokenization on more than one thread."""
    batch = 16
    ref = _reference(tmp_path, batch)
    runs = {}
    for n in (20_000, 200_000):
        pf = tmp_path / f"p{n}.txt"
        choice = _write_prompts(pf, n, seed=n)
        bad_at, long_at = n // 2, n // 2 + 7          # 0-based prompt indexes
        lines = pf.read_bytes().split(b"\n")
        lines[bad_at] = b"caf\xc3 broken \xff"
        lines[long_at] = b" ".join([b"word"] * 400)    # more tokens than --ctx 64
        pf.write_bytes(b"\n".join(lines))
        out, peak = _run_peak(ie_bin, ["--model", _tiny(), "--prompts-file", pf, "--max-new", "1",
                                       "--greedy", "--threads", "1", "--batch", str(batch),
                                       "--ctx", "64", "--tokenize-threads", "2"])
        runs[n] = (out, peak)
        assert out["prompts"] == n and out["failed"] == 2
        assert len(out["ids"]) == n and len(out["text"]) == n and len(out["stop_reason"]) == n
        assert [e["index"] for e in out["errors"]] == [bad_at, long_at]
        assert [e["line"] for e in out["errors"]] == [bad_at + 1, long_at + 1]
        assert "UTF-8" in out["errors"][0]["error"]
        assert "context" in out["errors"][1]["error"]
        assert out["stop_reason"][bad_at] == "error" and out["ids"][bad_at] == []
        assert out["stop_reason"][long_at] == "error" and out["ids"][long_at] == []
        wrong = [i for i in range(n) if i not in (bad_at, long_at) and out["ids"][i] != ref[choice[i]]]
        assert not wrong, f"{len(wrong)} prompts out of order, first at {wrong[:5]}"
        assert out["tokenize_threads"] >= 2, out["tokenize_threads"]
        assert out["timers_ms"]["tokenize"] > 0
    small, big = runs[20_000][1], runs[200_000][1]
    # 10x the prompts: memory may not grow with them (allow noise)
    assert big < small * 1.25 + 8, f"peak RSS {small:.1f} MiB for 20k vs {big:.1f} MiB for 200k"
    assert runs[200_000][0]["rss_peak_mb"] < runs[20_000][0]["rss_peak_mb"] * 1.25 + 8


def test_aggregate_is_one_summary_line(tmp_path, ie_bin):
    pf = tmp_path / "p.txt"
    _write_prompts(pf, 300, seed=1)
    with open(pf, "ab") as f:
        f.write(b"\xff\xfe\n")
    out = run_json(["--model", _tiny(), "--prompts-file", pf, "--max-new", "2", "--greedy",
                    "--threads", "1", "--batch", "8", "--aggregate", "--prefetch", "3", "--rounds", "2",
                    "--warmup", "1"])
    assert "text" not in out and "ids" not in out and "stop_reason" not in out
    assert out["prompts"] == 301 and out["failed"] == 1 and out["prefetch"] == 3
    assert sum(out["stop_reasons"].values()) == 2 * 300  # two measured rounds
    assert out["errors"][0]["index"] == 300 and "UTF-8" in out["errors"][0]["error"]


def test_prefetch_depth_does_not_change_results(tmp_path, ie_bin):
    pf = tmp_path / "p.txt"
    _write_prompts(pf, 50, seed=2)
    common = ["--model", _tiny(), "--prompts-file", pf, "--max-new", "3", "--greedy", "--threads", "1",
              "--batch", "4"]
    a = run_json(common + ["--prefetch", "1", "--tokenize-threads", "3"])
    b = run_json(common + ["--prefetch", "1000"])
    assert a["ids"] == b["ids"] and a["text"] == b["text"]


def test_all_lines_bad_exits_2(tmp_path, ie_bin):
    pf = tmp_path / "p.txt"
    pf.write_bytes(b"\xff\n\xfe\n")
    cp = run_cli(["--model", _tiny(), "--prompts-file", pf, "--max-new", "1"])
    assert cp.returncode == 2 and cp.stdout == "" and "UTF-8" in cp.stderr


# ------------------------------------------------------------------ timers
def test_stage_timers_add_up_to_wall(smollm2, tmp_path, ie_bin):
    pf = tmp_path / "p.txt"
    pf.write_text("The sky is\nTwo plus two equals\nMy favourite food is\n", encoding="utf-8")
    for src in (["--prompt", "Once upon a time"], ["--prompts-file", pf, "--batch", "2"]):
        out = run_json(["--model", smollm2, "--max-new", "12", "--greedy", "--threads", THREADS] + src)
        t = out["timers_ms"]
        for k in ("load", "queue_wait", "prefill", "decode", "sample", "detokenize", "tokenize", "other"):
            assert t[k] >= 0, (k, t)
        assert t["load"] > 0 and t["prefill"] > 0 and t["decode"] > 0 and t["sample"] > 0
        named = t["load"] + t["queue_wait"] + t["prefill"] + t["decode"] + t["sample"] + t["detokenize"]
        assert abs(t["total"] - named) <= 0.05 * t["total"], t
        # total = load + the measured rounds' wall time
        assert abs(t["total"] - (t["load"] + out["wall_s"] * 1e3)) < 1.0


def test_profile_kernel_shares(smollm2, ie_bin):
    base = ["--model", smollm2, "--prompt", "Once upon a time", "--max-new", "8", "--greedy",
            "--threads", THREADS]
    assert "profile" not in run_json(base)
    out = run_json(base + ["--profile", "--warmup", "1"])
    pr = out["profile"]
    assert abs(pr["step_ms"] - (out["timers_ms"]["prefill"] + out["timers_ms"]["decode"])) < 1e-6
    matmul = sum(v for k, v in pr.items() if k.startswith("matmul_"))
    assert matmul > 0.3, pr        # a 135M model's steps are mostly matmuls
    for k in ("attention", "norm", "elementwise", "other"):
        assert 0 <= pr[k] < 1, (k, pr)
    assert pr["attention"] > 0 and pr["norm"] > 0
    shares = sum(v for k, v in pr.items() if k != "step_ms")
    assert 0.98 < shares < 1.05, pr  # "other" is the rest of the step time


# ------------------------------------------------------------- exit codes
def _cap_memory(mb):
    def f():
        resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
    return f


@pytest.mark.parametrize("code", [0, 2, 3, 5, 6])
def test_exit_codes(code, smollm2, tmp_path, ie_bin):
    args = {0: ["--model", smollm2, "--prompt", "hi"],
            2: ["--model", smollm2, "--prompt", "hi", "--no-such-flag"],
            3: ["--model", tmp_path / "missing.gguf", "--prompt", "hi"],
            5: ["--model", smollm2, "--prompt", "hi", "--device", "cuda"],
            6: ["--model", smollm2, "--prompt", "hi"]}[code]
    cp = subprocess.run([str(ie_bin)] + [str(a) for a in args] + ["--max-new", "2", "--threads", str(THREADS)],
                        capture_output=True, text=True, timeout=120,
                        preexec_fn=_cap_memory(120) if code == 6 else None)
    assert cp.returncode == code, (cp.returncode, cp.stderr)
    if code == 0:
        parse_single_json_line(cp.stdout)
    else:
        assert cp.stdout == ""
        lines = cp.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), cp.stderr
    if code == 5:
        assert "CUDA" in cp.stderr


# ------------------------------------------------------ flags and variables
def _tiny_run(extra=(), env=None, prompt="hello world"):
    return run_json(["--model", _tiny(), "--prompt", prompt, "--max-new", "3", "--greedy"] + list(extra),
                    env=env)


def test_env_variables_take_effect_and_flags_win(tmp_path, ie_bin):
    assert _tiny_run(env={"THREADS": "1"})["threads"] == 1
    assert _tiny_run(["--threads", "2"], env={"THREADS": "1"})["threads"] == 2
    assert _tiny_run(env={"RUNS": "3"})["rounds"] == 3
    assert _tiny_run(["--rounds", "2"], env={"RUNS": "3"})["rounds"] == 2
    assert _tiny_run(env={"IE_PRECISION": "f32"})["precision"] == "f32"
    assert _tiny_run(["--precision", "native"], env={"IE_PRECISION": "f32"})["precision"] == "native"
    pf = tmp_path / "p.txt"
    pf.write_text("a\nb\nc\n", encoding="utf-8")
    out = run_json(["--model", _tiny(), "--max-new", "1"], env={"PROMPTS": str(pf), "BATCH": "2"})
    assert out["prompts"] == 3 and out["batch"] == 2
    out = run_json(["--model", _tiny(), "--max-new", "1", "--prompts-file", pf, "--batch", "3"],
                   env={"PROMPTS": "/nonexistent", "BATCH": "2"})
    assert out["prompts"] == 3 and out["batch"] == 3
    for env in ({"AFFINITY": "compact"}, {"AFFINITY": "scatter"}, {"AFFINITY": "none"},
                {"IE_TP_USE_AFFINITY": "0"}, {"IE_HOT_REPLICATE": "1"}, {"IE_ACT_PREC": "auto"},
                {"IE_REQUIRE_MODEL": "1"}):
        a = _tiny_run(env=env)
        assert a["ids"] == _tiny_run()["ids"], env


@pytest.mark.parametrize("env,words", [
    ({"THREADS": "zero"}, "THREADS"),
    ({"BATCH": "0"}, "BATCH"),
    ({"RUNS": "-1"}, "RUNS"),
    ({"IE_PRECISION": "fp8"}, "IE_PRECISION"),
    ({"IE_REQUIRE_MODEL": "0"}, "IE_REQUIRE_MODEL"),
    ({"IE_REQUIRE_MODEL": "yes"}, "IE_REQUIRE_MODEL"),
    ({"IE_ACT_PREC": "int8"}, "IE_ACT_PREC"),
    ({"AFFINITY": "0-3"}, "AFFINITY"),
    ({"IE_TP_USE_AFFINITY": "2"}, "IE_TP_USE_AFFINITY"),
    ({"IE_HOT_REPLICATE": "yes"}, "IE_HOT_REPLICATE"),
])
def test_env_bad_values_are_refused(env, words, ie_bin):
    cp = run_cli(["--model", _tiny(), "--prompt", "hi", "--max-new", "1"], env=env)
    assert cp.returncode == 2 and cp.stdout == "", cp.stderr
    assert words in cp.stderr


def test_require_model_without_model_exits_3(ie_bin):
    cp = run_cli(["--prompt", "hi"], env={"IE_REQUIRE_MODEL": "1"})
    assert cp.returncode == 3 and "IE_REQUIRE_MODEL" in cp.stderr


def test_model_json_bin_pair(tmp_path, ie_bin):
    conv = os.environ.get("IE_CONVERT") or str(ie_bin.parent / "ie-convert")
    d = tmp_path / "iebin"
    cp = subprocess.run([conv, "--in", str(fixture_path(TINY_GGUF)), "--out-dir", str(d), "--quiet"],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    base = ["--prompt", "hello world", "--max-new", "4", "--greedy"]
    by_dir = run_json(["--model", d] + base)
    pair = run_json(["--model-json", d / "model.ie.json", "--model-bin", d / "model.ie.bin"] + base)
    assert pair["ids"] == by_dir["ids"]
    (tmp_path / "other.bin").write_bytes((d / "model.ie.bin").read_bytes())
    cp = run_cli(["--model-json", d / "model.ie.json", "--model-bin", tmp_path / "other.bin"] + base)
    assert cp.returncode == 2 and "one directory" in cp.stderr
    cp = run_cli(["--model-json", d / "model.ie.json", "--model-bin", tmp_path / "none.bin"] + base)
    assert cp.returncode == 3
    cp = run_cli(["--model-json", d / "model.ie.json"] + base)
    assert cp.returncode == 2 and "--model-bin" in cp.stderr


def test_pretranspose_and_device(ie_bin):
    gguf = str(fixture_path(TINY_GGUF))
    base = ["--model", gguf, "--prompt", "hello world", "--max-new", "4", "--greedy"]
    a = run_json(base + ["--pretranspose", "all"])
    b = run_json(base + ["--pretranspose", "none"])
    assert a["ids"] == b["ids"]     # the packing is lossless
    for mode in ("woh", "wxh"):
        cp = run_cli(base + ["--pretranspose", mode])
        assert cp.returncode == 2 and "ie-convert" in cp.stderr
    assert run_cli(base + ["--pretranspose", "rows"]).returncode == 2
    assert run_json(base + ["--device", "cpu"])["device"] == "cpu"
    assert run_json(base + ["--device", "auto"])["device"] == "cpu"
    assert run_cli(base + ["--device", "tpu"]).returncode == 2
