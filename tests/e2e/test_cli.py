"""CLI contract: exit codes and one-line errors on bad input, the single JSON
line on success, seeded sampling determinism, --prompts-file.

Exit codes: 0 ok, 2 usage / bad prompt text, 3 model missing or malformed.
Every failure prints exactly one line on stderr and nothing on stdout.
Corrupted models are copies of the tiny q8_0 GGUF fixture, patched at
positions found by an independent header walk (conftest.gguf_layout), and are
fed to both the generation mode and the logits mode.
"""
from __future__ import annotations

import json
import math
import os
import struct

import pytest

from conftest import (EXIT_MODEL, EXIT_USAGE, RUN_FIELDS, THREADS, fixture_path,
                      gguf_layout, parse_single_json_line, run_cli, run_json)

BASE_GGUF = "tiny_llama_q8_0.gguf"
N_VOCAB_SMOL = 49152


def assert_fails(cp, code):
    assert cp.returncode == code, (f"exit {cp.returncode}, want {code}\n"
                                   f"stdout: {cp.stdout[:300]!r}\nstderr: {cp.stderr[:500]!r}")
    lines = cp.stderr.strip("\n").splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"want one stderr line, got {cp.stderr!r}"
    assert lines[0].startswith("error: "), f"docs/CLI.md: errors read 'error: ...', got {lines[0]!r}"
    assert cp.stdout == "", f"nothing on stdout on failure, got {cp.stdout[:300]!r}"


def model_args(mode, model, tmp_path):
    if mode == "run":
        return ["--model", model, "--prompt", "hello", "--max-new", "2", "--greedy",
                "--threads", THREADS]
    return ["logits", "--model", model, "--ids", "1,2,3", "--threads", THREADS,
            "--out", tmp_path / "out.f32"]


# --------------------------------------------------------------- bad models
def _base_bytes():
    return fixture_path(BASE_GGUF).read_bytes()


def _patched(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def corrupt_missing(tmp_path):
    return tmp_path / "does-not-exist.gguf"


def corrupt_truncated_header(tmp_path):
    return _patched(tmp_path, "trunc_header.gguf", _base_bytes()[:200])


def corrupt_truncated_data(tmp_path):
    b = _base_bytes()
    return _patched(tmp_path, "trunc_data.gguf", b[:len(b) - 1000])


def corrupt_truncated_tensor_infos(tmp_path):
    # cut inside the last tensor's info record: every count is plausible
    b = _base_bytes()
    return _patched(tmp_path, "trunc_infos.gguf", b[:gguf_layout(b).tensors[-1].type_pos])


def corrupt_empty(tmp_path):
    return _patched(tmp_path, "empty.gguf", b"")


def corrupt_bad_magic(tmp_path):
    b = bytearray(_base_bytes())
    b[0:4] = b"GGUX"
    return _patched(tmp_path, "bad_magic.gguf", bytes(b))


def corrupt_bad_version(tmp_path):
    b = bytearray(_base_bytes())
    struct.pack_into("<I", b, 4, 99)
    return _patched(tmp_path, "bad_version.gguf", bytes(b))


def _patch_tensor(tmp_path, name, fn):
    b = bytearray(_base_bytes())
    lay = gguf_layout(bytes(b))
    t = next(t for t in lay.tensors if t.name == "blk.0.attn_q.weight")
    fn(b, t)
    return _patched(tmp_path, name, bytes(b))


def corrupt_unknown_type(tmp_path):
    return _patch_tensor(tmp_path, "unknown_type.gguf",
                         lambda b, t: struct.pack_into("<I", b, t.type_pos, 250))


def corrupt_data_past_end(tmp_path):
    return _patch_tensor(tmp_path, "past_end.gguf",
                         lambda b, t: struct.pack_into("<Q", b, t.offset_pos, 1 << 40))


def corrupt_absurd_dims(tmp_path):
    return _patch_tensor(tmp_path, "absurd_dims.gguf",
                         lambda b, t: struct.pack_into("<Q", b, t.dims_pos + 8, 1 << 62))


def corrupt_wrong_shape(tmp_path):
    # A valid-looking tensor of the wrong shape: attn_q rows halved (still in
    # bounds), so only the model-level shape check can catch it.
    return _patch_tensor(tmp_path, "wrong_shape.gguf",
                         lambda b, t: struct.pack_into("<Q", b, t.dims_pos + 8, 32))


def corrupt_huge_tensor_count(tmp_path):
    b = bytearray(_base_bytes())
    struct.pack_into("<Q", b, 8, 1 << 60)
    return _patched(tmp_path, "huge_count.gguf", bytes(b))


def corrupt_hf_dir_no_weights(tmp_path):
    d = tmp_path / "hf_broken"
    d.mkdir()
    (d / "config.json").write_bytes(fixture_path("tiny_llama/config.json").read_bytes())
    return d


def corrupt_hf_dir_truncated_safetensors(tmp_path):
    d = tmp_path / "hf_trunc"
    d.mkdir()
    (d / "config.json").write_bytes(fixture_path("tiny_llama/config.json").read_bytes())
    (d / "tokenizer.json").write_bytes(fixture_path("tiny_llama/tokenizer.json").read_bytes())
    st = fixture_path("tiny_llama/model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(st[:len(st) // 2])
    return d


CORRUPTIONS = [corrupt_missing, corrupt_empty, corrupt_truncated_header, corrupt_truncated_tensor_infos,
               corrupt_truncated_data,
               corrupt_bad_magic, corrupt_bad_version, corrupt_unknown_type,
               corrupt_data_past_end, corrupt_absurd_dims, corrupt_wrong_shape,
               corrupt_huge_tensor_count, corrupt_hf_dir_no_weights,
               corrupt_hf_dir_truncated_safetensors]


def test_base_gguf_is_valid(tmp_path):
    """The unpatched copy loads: the failures below are due to the patches."""
    run_json(model_args("logits", fixture_path(BASE_GGUF), tmp_path))
    lay = gguf_layout(_base_bytes())
    assert lay.n_tensors == len(lay.tensors) == 2 + 2 * 9 + 1


@pytest.mark.parametrize("mode", ["run", "logits"])
@pytest.mark.parametrize("make", CORRUPTIONS, ids=[c.__name__[8:] for c in CORRUPTIONS])
def test_bad_model_exits_3(make, mode, tmp_path, ie_bin):
    cp = run_cli(model_args(mode, make(tmp_path), tmp_path), timeout=60)
    assert_fails(cp, EXIT_MODEL)


# ---------------------------------------------------------- bad flags / text
BAD_FLAGS = [
    ["--bogus-flag"],
    ["--max-new"],                      # missing value
    ["--max-new", "abc"],
    ["--max-new", "-5"],
    ["--threads", "0"],
    ["--threads", "many"],
    ["--temperature", "-1"],
    ["--seed", "x"],
    ["--precision", "int3"],
    ["--logit-bias", "12"],
    ["--logit-bias", "x+1"],
    ["--logit-bias", "12+nan"],
    ["--logit-bias", "49152+1"],          # SmolLM2 has 49152 tokens
    ["--ignore-eos", "x"],
    ["--json-schema", '{"type": "string", "pattern": "x"}'],
    ["--json-schema", "{not json"],
    ["--json-schema", "@/nonexistent/schema.json"],
]


@pytest.mark.parametrize("extra", BAD_FLAGS, ids=[" ".join(f) for f in BAD_FLAGS])
def test_bad_flags_exit_2(extra, smollm2, ie_bin):
    cp = run_cli(["--model", smollm2, "--prompt", "hi", "--max-new", "2"] + extra, timeout=60)
    assert_fails(cp, EXIT_USAGE)


@pytest.mark.parametrize("extra", [["--mode", "sideways"], ["--ids", "1,x,3"], ["--ids", ""],
                                   ["--ids", "1,99999999"]],
                         ids=["bad-mode", "bad-ids", "empty-ids", "id-out-of-range"])
def test_logits_bad_flags_exit_2(extra, tmp_path, ie_bin):
    model = fixture_path(BASE_GGUF)
    args = ["logits", "--model", model, "--out", tmp_path / "o.f32", "--ids", "1,2"]
    # later flags override earlier ones
    cp = run_cli(args + extra, timeout=60)
    assert_fails(cp, EXIT_USAGE)


def test_no_model_flag_exit_2(ie_bin):
    assert_fails(run_cli(["--prompt", "hi"], timeout=60), EXIT_USAGE)


def test_bad_utf8_prompt_exit_2(smollm2, tmp_path, ie_bin):
    pf = tmp_path / "bad.txt"
    pf.write_bytes(b"hello \xff\xfe world\n")
    cp = run_cli(["--model", smollm2, "--prompts-file", pf, "--max-new", "2", "--greedy",
                  "--threads", THREADS], timeout=60)
    assert_fails(cp, EXIT_USAGE)
    assert "UTF-8" in cp.stderr, f"the error should say what is wrong: {cp.stderr!r}"


def test_bad_utf8_prompt_arg_exit_2(smollm2, ie_bin):
    # invalid UTF-8 bytes straight in argv (surrogateescape round-trips them)
    cp = run_cli(["--model", smollm2, "--prompt", os.fsdecode(b"caf\xe9 \xc3"),
                  "--max-new", "2", "--greedy"], timeout=60)
    assert_fails(cp, EXIT_USAGE)


# ------------------------------------------------------------------ success
def _check_run_fields(out, *, n_prompts, max_new):
    missing = [f for f in RUN_FIELDS if f not in out]
    assert not missing, f"missing fields {missing} in {out}"
    assert isinstance(out["model"], str) and out["model"]
    assert out["prompts"] == n_prompts
    assert isinstance(out["tokens_in"], int) and out["tokens_in"] > 0
    assert isinstance(out["tokens_out"], int) and 1 <= out["tokens_out"] <= max_new * n_prompts
    for f in ("wall_s", "tps", "prefill_tps", "ttft_ms", "latency_p50_ms", "latency_p95_ms",
              "rss_peak_mb"):
        v = out[f]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{f}={v!r}"
    assert isinstance(out["decode_tps"], (int, float)) and out["decode_tps"] >= 0
    if out["tokens_out"] >= 2 * n_prompts:
        assert out["decode_tps"] > 0
    assert out["latency_p50_ms"] <= out["latency_p95_ms"]
    assert out["ttft_ms"] <= out["wall_s"] * 1000 + 1e-6
    assert 10 < out["rss_peak_mb"] < 8192
    # every prompt token is either computed or taken from the prefix cache
    assert out["kv_hits"] + out["kv_misses"] == out["tokens_in"], out
    assert out["kv_misses"] >= out["prompts"] and out["preemptions"] >= 0
    assert out["threads"] == THREADS
    assert out["precision"] in ("native", "f32")
    # one prompt: text is a string and ids a flat list; several prompts:
    # one entry per prompt (docs/CLI.md)
    if n_prompts == 1:
        texts, id_lists = [out["text"]], [out["ids"]]
    else:
        texts, id_lists = out["text"], out["ids"]
        assert isinstance(texts, list) and len(texts) == n_prompts
        assert isinstance(id_lists, list) and len(id_lists) == n_prompts
    assert all(isinstance(t, str) for t in texts)
    assert sum(len(ids) for ids in id_lists) == out["tokens_out"]
    assert all(isinstance(i, int) and 0 <= i < N_VOCAB_SMOL for ids in id_lists for i in ids)


def test_run_single_json_line(smollm2, ie_bin):
    cp = run_cli(["--model", smollm2, "--prompt", "The capital of France is", "--max-new", "8",
                  "--greedy", "--threads", THREADS], timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    out = parse_single_json_line(cp.stdout)
    _check_run_fields(out, n_prompts=1, max_new=8)
    assert out["precision"] == "native"


def test_seeded_sampling_is_deterministic(smollm2, ie_bin):
    args = ["--model", smollm2, "--prompt", "Once upon a time", "--max-new", "16",
            "--temperature", "0.8", "--seed", "7", "--threads", THREADS]
    a = run_json(args)
    b = run_json(args)
    assert a["ids"] == b["ids"] and a["text"] == b["text"]
    assert len(a["ids"]) >= 1


def test_prompts_file_three_prompts(smollm2, tmp_path, ie_bin):
    pf = tmp_path / "prompts.txt"
    pf.write_text("The sky is\nTwo plus two equals\nMy favourite food is\n", encoding="utf-8")
    out = run_json(["--model", smollm2, "--prompts-file", pf, "--max-new", "4", "--greedy",
                    "--threads", THREADS])
    _check_run_fields(out, n_prompts=3, max_new=4)


def test_reported_random_seed_replays(smollm2, ie_bin):
    """Without --seed a random seed is used and reported exactly (a 64-bit
    integer, not a rounded double), so --seed <reported> replays the run."""
    base = ["--model", smollm2, "--prompt", "Once upon a time", "--max-new", "16",
            "--temperature", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0",
            "--threads", THREADS]
    a = run_json(base)
    assert isinstance(a["seed"], int)
    b = run_json(base + ["--seed", str(a["seed"])])
    assert b["seed"] == a["seed"] and b["ids"] == a["ids"]


def test_ignore_eos_and_logit_bias(smollm2, ie_bin):
    """--ignore-eos runs a chat answer that ends by itself to --max-new;
    --logit-bias ID-inf bans the greedy token, ID+100 forces one."""
    chat = '[{"role": "user", "content": "Name three colors."}]'
    base = ["--model", smollm2, "--greedy", "--threads", THREADS]
    a = run_json(base + ["--chat", chat, "--max-new", "120"])
    n0 = len(a["ids"])
    assert a["stop_reason"] == "eos" and n0 < 100, a
    b = run_json(base + ["--chat", chat, "--max-new", str(n0 + 10), "--ignore-eos"])
    assert len(b["ids"]) == n0 + 10 and b["stop_reason"] == "length", b
    assert b["ids"][:n0 - 1] == a["ids"][:n0 - 1]              # the same answer, then on past its end
    p = run_json(base + ["--prompt", "The capital of France is", "--max-new", "1"])
    t0 = p["ids"][0]
    q = run_json(base + ["--prompt", "The capital of France is", "--max-new", "1", "--logit-bias", f"{t0}-inf"])
    assert q["ids"][0] != t0
    f = run_json(base + ["--prompt", "The capital of France is", "--max-new", "3", "--logit-bias", "1000+100",
                         "--logit-bias", f"{t0}-inf"])
    assert f["ids"] == [1000, 1000, 1000], f


def test_json_schema_flag(smollm2, tmp_path, ie_bin):
    """--json-schema (inline or @file): every answer of a prompts file is an
    instance of the schema and ends by itself."""
    import jsonschema
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    sf = tmp_path / "schema.json"
    sf.write_text(json.dumps(schema), encoding="utf-8")
    pf = tmp_path / "prompts.txt"
    pf.write_text("A person:\nSomeone's details:\nJSON please:\n", encoding="utf-8")
    for arg in (json.dumps(schema), f"@{sf}"):
        out = run_json(["--model", smollm2, "--prompts-file", pf, "--batch", "3", "--max-new", "80",
                        "--temperature", "1.0", "--seed", "5", "--json-schema", arg, "--threads", THREADS])
        assert out["stop_reason"] == ["eos"] * 3, out
        for t in out["text"]:
            jsonschema.validate(json.loads(t), schema)


SPEC_PROMPTS = ["Repeat the list exactly. List: apple, banana, cherry, date, elderberry, fig, grape. "
                "Again: apple, banana, cherry,",
                "The capital of France is"]


@pytest.mark.parametrize("plan", ["none", "pipeline:2", "tensor:2"])
def test_spec_ngram_same_ids(plan, smollm2, tmp_path, ie_bin):
    """--spec-ngram 4 (prompt-lookup drafts confirmed by the arg max): the
    greedy ids of every prompt, batched, are those without drafts (embedded,
    and through a pipeline's and a tensor split's workers), and some drafts
    were confirmed. Should an id differ, it may only be where the model's
    own logits (teacher-forced) hold a near tie: rows computed several a
    step may round differently from one a step."""
    from conftest import engine_logits
    pf = tmp_path / "prompts.txt"
    pf.write_text("\n".join(SPEC_PROMPTS) + "\n", encoding="utf-8")
    common = ["--model", smollm2, "--max-new", "40", "--greedy", "--threads", THREADS, "--plan", plan,
              "--batch", "2", "--prompts-file", pf]
    plain = run_json(common)
    spec = run_json(common + ["--spec-ngram", "4"])
    assert "spec_accepted" not in plain
    assert spec["spec_accepted"] > 0 and spec["spec_drafted"] >= spec["spec_accepted"], spec
    for i, (a, b) in enumerate(zip(plain["ids"], spec["ids"])):
        if a == b:
            continue
        k = next(j for j in range(min(len(a), len(b))) if a[j] != b[j])
        out = subprocess.run([str(ie_bin), "tokenize", "--tokenizer", str(smollm2)], input=SPEC_PROMPTS[i].encode(),
                             capture_output=True, timeout=120)
        row = engine_logits(smollm2, json.loads(out.stdout)["ids"] + a[:k], tmp_path)[-1]
        top = sorted(row)[-2:]
        assert top[1] - top[0] < 1e-3, (plan, i, k, a[k], b[k], top)    # only a near tie may flip


def test_batched_prompts_equal_solo_runs(smollm2, tmp_path, ie_bin):
    """Greedy output of each prompt is the same alone and in a batch of 3."""
    prompts = ["The sky is", "Two plus two equals", "My favourite food is"]
    pf = tmp_path / "prompts.txt"
    pf.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    common = ["--model", smollm2, "--max-new", "12", "--greedy", "--threads", THREADS]
    batched = run_json(common + ["--prompts-file", pf, "--batch", "3"])
    for i, p in enumerate(prompts):
        solo = run_json(common + ["--prompt", p])
        assert batched["ids"][i] == solo["ids"], f"prompt {i}"
        assert batched["text"][i] == solo["text"]


@pytest.mark.parametrize("limit_mb", [120, 300])
def test_out_of_memory_exits_6(limit_mb, smollm2, ie_bin):
    """With the address space capped, the model mapping (120 MB) or the KV
    cache (300 MB) cannot be had: exit 6 with one error line, no crash."""
    import resource
    import subprocess

    def cap():
        lim = limit_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    cp = subprocess.run([str(ie_bin), "--model", str(smollm2), "--prompt", "hi", "--max-new", "4",
                         "--greedy", "--threads", str(THREADS)], capture_output=True, text=True, timeout=60,
                        preexec_fn=cap)
    assert cp.returncode == 6, (cp.returncode, cp.stderr)
    assert cp.stdout == ""
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "memory" in lines[0]
