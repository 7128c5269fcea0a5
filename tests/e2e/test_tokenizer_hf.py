"""test_tokenizer_hf.py — our `inference-engine tokenize` against reference
tokenizers on the Jane Austen corpus (tests/data/corpus/austen_*.txt).

Every line is tokenized by our CLI with --lines --no-bos and compared with:
  * Llama-2-style tokenizer.json (tests/data/llama2_tokenizer.json): HF
    `tokenizers` on that file; ours loads the same file;
  * the llama-spm GGUF vocabulary (tests/data/ggml-vocab-llama-spm.gguf):
    SentencePiece and HF `tokenizers` models rebuilt from the GGUF by
    tests/reference/make_llama_spm_reference.py; ours loads the GGUF;
  * SmolLM2: HF `tokenizers` on tests/data/smollm2_tokenizer.json (made by
    tests/reference/make_smollm2_tokenizer_json.py); ours loads the model's
    GGUF (models/, from scripts/setup.sh) and the same tokenizer.json;
  * gpt-oss (o200k_harmony): HF `tokenizers` on gpt-oss's tokenizer.json
    (tests/data/gptoss_tokenizer.json.xz, decompressed to a temp dir); ours
    loads that same json AND tests/data/o200k_base.tiktoken with the
    special-token table beside it; both must give HF's ids.
Plus special-token parsing on/off, whole-file encoding, CLI exit codes.

The binary comes from $IE_BIN (default build/inference-engine).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import importlib

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
CORPUS = sorted((DATA / "corpus").glob("austen_*.txt"))
LLAMA2_JSON = DATA / "llama2_tokenizer.json"
SPM_GGUF = DATA / "ggml-vocab-llama-spm.gguf"
SMOL_JSON = DATA / "smollm2_tokenizer.json"
SMOL_GGUF = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GPTOSS_JSON_XZ = DATA / "gptoss_tokenizer.json.xz"
O200K_TIKTOKEN = DATA / "o200k_base.tiktoken"  # + o200k_harmony_special_tokens.json beside it

sys.path.insert(0, str(ROOT / "tests" / "reference"))

tokenizers = importlib.import_module("tokenizers")


def ie_bin():
    b = Path(os.environ.get("IE_BIN", ROOT / "build" / "inference-engine"))
    if not b.is_absolute():
        b = ROOT / b
    if not b.exists():
        pytest.fail(f"binary {b} not built (set IE_BIN)")
    return b


def run_cli(tokenizer, data, *flags):
    """Run `tokenize`; return (returncode, stdout lines parsed as id lists, stderr)."""
    p = subprocess.run([str(ie_bin()), "tokenize", "--tokenizer", str(tokenizer), *flags],
                       input=data, capture_output=True, timeout=300)
    out = []
    if p.returncode == 0:
        out = [json.loads(line)["ids"] for line in p.stdout.decode().splitlines()]
    return p.returncode, out, p.stderr.decode(errors="replace")


def corpus_lines(path):
    """Lines as our CLI splits them: on '\\n', a final newline ends the last line."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return data, [l.decode("utf-8") for l in lines]


def compare(name, tokenizer, reference_encode):
    """Tokenize every corpus line with our CLI and with reference_encode(list[str]) -> list[list[int]]."""
    total = same = 0
    bad = []
    for path in CORPUS:
        data, lines = corpus_lines(path)
        rc, ours, err = run_cli(tokenizer, data, "--lines", "--no-bos")
        assert rc == 0, err
        assert len(ours) == len(lines), f"{path.name}: {len(ours)} outputs for {len(lines)} lines"
        ref = reference_encode(lines)
        for i, (a, b) in enumerate(zip(ours, ref)):
            total += 1
            if a == b:
                same += 1
            elif len(bad) < 5:
                bad.append(f"{path.name}:{i + 1}: {lines[i]!r}\n   ours {a}\n   ref  {b}")
    print(f"\n{name}: {same}/{total} lines identical")
    assert same == total, f"{name}: {total - same} of {total} lines differ:\n" + "\n".join(bad)


# ---------------------------------------------------------------- references

@pytest.fixture(scope="module")
def hf_llama2():
    return tokenizers.Tokenizer.from_file(str(LLAMA2_JSON))


@pytest.fixture(scope="module")
def spm_refs(tmp_path_factory):
    """(sentencepiece processor, HF tokenizer) rebuilt from the llama-spm GGUF."""
    spm = importlib.import_module("sentencepiece")
    importlib.import_module("transformers")
    import make_llama_spm_reference as mk
    model, tj = mk.write_all(SPM_GGUF, tmp_path_factory.mktemp("spm_ref"))
    return spm.SentencePieceProcessor(model_file=str(model)), tokenizers.Tokenizer.from_file(str(tj))


@pytest.fixture(scope="module")
def hf_smol():
    return tokenizers.Tokenizer.from_file(str(SMOL_JSON))


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    """(path of the decompressed gpt-oss tokenizer.json, HF tokenizer on it)."""
    import lzma
    path = tmp_path_factory.mktemp("gptoss") / "gptoss_tokenizer.json"
    path.write_bytes(lzma.decompress(GPTOSS_JSON_XZ.read_bytes()))
    return path, tokenizers.Tokenizer.from_file(str(path))


def hf_encode(tok):
    return lambda lines: [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]


# ---------------------------------------------------------------- Austen, line by line

def test_austen_llama2_json(hf_llama2):
    compare("llama2 tokenizer.json vs HF", LLAMA2_JSON, hf_encode(hf_llama2))


def test_austen_llama_spm_gguf_vs_sentencepiece(spm_refs):
    sp, _ = spm_refs
    compare("llama-spm gguf vs SentencePiece", SPM_GGUF, lambda lines: sp.encode(lines))


def test_austen_llama_spm_gguf_vs_hf(spm_refs):
    _, hf = spm_refs
    compare("llama-spm gguf vs HF", SPM_GGUF, hf_encode(hf))


def test_austen_smollm2_gguf(hf_smol):
    if not SMOL_GGUF.exists():
        pytest.fail(f"{SMOL_GGUF} missing (scripts/setup.sh fetches it)")
    compare("SmolLM2 gguf vs HF", SMOL_GGUF, hf_encode(hf_smol))


def test_austen_smollm2_json(hf_smol):
    compare("SmolLM2 tokenizer.json vs HF", SMOL_JSON, hf_encode(hf_smol))


def test_austen_gptoss_json(gptoss):
    path, hf = gptoss
    compare("gpt-oss tokenizer.json vs HF", path, hf_encode(hf))


def test_austen_o200k_tiktoken(gptoss):
    _, hf = gptoss
    compare("o200k tiktoken+specials vs HF gpt-oss", O200K_TIKTOKEN, hf_encode(hf))


HARMONY_LINE = ("<|start|>system<|message|>You are ChatGPT.<|end|><|start|>user<|message|>2+2=?<|end|>"
                "<|start|>assistant<|channel|>final<|message|>4<|return|> <|endoftext|>x<|call|>")


def test_gptoss_specials_and_whole_corpus(gptoss):
    """Harmony special tokens on/off and the whole corpus as one text, both loaders."""
    path, hf = gptoss
    on = hf.encode(HARMONY_LINE, add_special_tokens=False).ids
    hf.encode_special_tokens = True
    try:
        off = hf.encode(HARMONY_LINE, add_special_tokens=False).ids
    finally:
        hf.encode_special_tokens = False
    assert 200006 in on and 200006 not in off
    data = b"".join(p.read_bytes() for p in CORPUS)
    whole = hf.encode(data.decode("utf-8"), add_special_tokens=False).ids
    for tok in (path, O200K_TIKTOKEN):
        rc, out, err = run_cli(tok, HARMONY_LINE.encode(), "--no-bos", "--parse-special")
        assert rc == 0 and out == [on], (tok, err)
        rc, out, err = run_cli(tok, HARMONY_LINE.encode(), "--no-bos")
        assert rc == 0 and out == [off], (tok, err)
        t0 = time.perf_counter()
        rc, out, err = run_cli(tok, data, "--no-bos")
        dt = time.perf_counter() - t0
        assert rc == 0, err
        print(f"\n{tok.name}: {len(data)} bytes -> {len(out[0])} tokens, CLI wall {dt:.2f} s (load included)")
        assert out[0] == whole, tok


# ---------------------------------------------------------------- whole file, speed

def test_whole_corpus_one_text(hf_smol, spm_refs):
    """The whole corpus as one input (no --lines), and how long it takes."""
    sp, _ = spm_refs
    data = b"".join(p.read_bytes() for p in CORPUS)
    text = data.decode("utf-8")
    cases = [(SMOL_JSON, lambda: hf_smol.encode(text, add_special_tokens=False).ids),
             (SPM_GGUF, lambda: sp.encode(text))]
    for tok, ref in cases:
        t0 = time.perf_counter()
        rc, out, err = run_cli(tok, data, "--no-bos")
        dt = time.perf_counter() - t0
        assert rc == 0, err
        assert len(out) == 1
        expect = ref()
        print(f"\n{tok.name}: {len(data)} bytes -> {len(out[0])} tokens, CLI wall {dt:.2f} s (load included)")
        assert out[0] == expect


# ---------------------------------------------------------------- special tokens

SPECIAL_LINE = "Hi <|im_start|>user\nsay <s> and </s> or <|im_end|>!"


def test_parse_special_smollm2(hf_smol):
    paths = [SMOL_JSON] + ([SMOL_GGUF] if SMOL_GGUF.exists() else [])
    data = SPECIAL_LINE.encode()
    on = hf_smol.encode(SPECIAL_LINE, add_special_tokens=False).ids
    hf_smol.encode_special_tokens = True
    try:
        off = hf_smol.encode(SPECIAL_LINE, add_special_tokens=False).ids
    finally:
        hf_smol.encode_special_tokens = False
    assert 1 in on and 2 in on and 1 not in off
    for p in paths:
        rc, out, err = run_cli(p, data, "--no-bos", "--parse-special")
        assert rc == 0, err
        assert out == [on], p
        rc, out, err = run_cli(p, data, "--no-bos")
        assert rc == 0, err
        assert out == [off], p


def test_parse_special_llama(hf_llama2, spm_refs):
    _, hf_spm = spm_refs
    data = SPECIAL_LINE.encode()
    for path, hf in [(LLAMA2_JSON, hf_llama2), (SPM_GGUF, hf_spm)]:
        on = hf.encode(SPECIAL_LINE, add_special_tokens=False).ids
        hf.encode_special_tokens = True
        try:
            off = hf.encode(SPECIAL_LINE, add_special_tokens=False).ids
        finally:
            hf.encode_special_tokens = False
        assert 1 in on and 2 in on and 1 not in off
        rc, out, err = run_cli(path, data, "--no-bos", "--parse-special")
        assert rc == 0, err
        assert out == [on], path
        rc, out, err = run_cli(path, data, "--no-bos")
        assert rc == 0, err
        assert out == [off], path
        # default adds BOS like HF's add_special_tokens=True
        rc, out, err = run_cli(path, b"Hello world")
        assert rc == 0, err
        assert out == [hf.encode("Hello world").ids], path


# ---------------------------------------------------------------- random strings

def random_lines(n=1500, seed=1234):
    """Adversarial lines: mixed scripts, Unicode digits and spaces (NEL, NBSP,
    ideographic), combining marks, ZWJ emoji, U+2581, special-token text."""
    import random
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3 + list(" " * 30)
            + list("\t\r\v\f") + list(".,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`") + ["'s", "'ll", "'t", "'RE", "'D"]
            + list("éèàüößçñÄÖÜ") + list("привет") + list("日本語中文한국어")
            + ["\U0001F999", "\U0001F600", "\U0001F469\u200d\U0001F4BB", "\U0001F1EB\U0001F1F7", "\u200d", "\u0301", "e\u0301"]
            + list("\u0663\uff13\u00b2\u00bd\u216b\u0e53")
            + ["\u00a0", "\u2000", "\u3000", "\u0085", "\u2028", "\u2029", "\u202f", "\u180e", "\u200b", "\ufeff"]
            + ["\u2581", "\u2581\u2581", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
               "\U00010400", "\U0001D7CE", "\U000E0001", "\x00", "\x1f", "\x7f"])
    rng = random.Random(seed)
    return ["".join(rng.choice(pool) for _ in range(rng.choice([1, 2, 3, 5, 8, 13, 30, 80]))) for _ in range(n)]


def compare_lines(name, tokenizer, lines, reference_encode, *flags):
    data = ("\n".join(lines) + "\n").encode()
    rc, ours, err = run_cli(tokenizer, data, "--lines", "--no-bos", *flags)
    assert rc == 0, err
    ref = reference_encode(lines)
    bad = [i for i, (a, b) in enumerate(zip(ours, ref)) if a != b]
    print(f"\n{name} {' '.join(flags)}: {len(lines) - len(bad)}/{len(lines)} random lines identical")
    assert len(ours) == len(ref) and not bad, "\n".join(
        f"{lines[i]!r}\n   ours {ours[i]}\n   ref  {ref[i]}" for i in bad[:5])


def hf_encode_special(tok, parse_special):
    def enc(lines):
        tok.encode_special_tokens = not parse_special
        try:
            return [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
        finally:
            tok.encode_special_tokens = False
    return enc


def test_random_lines(hf_llama2, hf_smol, spm_refs):
    sp, hf_spm = spm_refs
    lines = random_lines()
    targets = [("llama2 json", LLAMA2_JSON, hf_llama2), ("SmolLM2 json", SMOL_JSON, hf_smol),
               ("llama-spm gguf", SPM_GGUF, hf_spm)]
    if SMOL_GGUF.exists():
        targets.append(("SmolLM2 gguf", SMOL_GGUF, hf_smol))
    for name, path, hf in targets:
        compare_lines(name, path, lines, hf_encode_special(hf, False))
        compare_lines(name, path, lines, hf_encode_special(hf, True), "--parse-special")
    compare_lines("llama-spm gguf vs SentencePiece", SPM_GGUF, lines, lambda ls: sp.encode(ls))


def test_random_lines_gptoss(gptoss):
    path, hf = gptoss
    lines = random_lines() + random_lines(300, seed=99)
    for name, tok in [("gpt-oss json", path), ("o200k tiktoken", O200K_TIKTOKEN)]:
        compare_lines(name, tok, lines, hf_encode_special(hf, False))
        compare_lines(name, tok, lines, hf_encode_special(hf, True), "--parse-special")


# ---------------------------------------------------------------- CLI behaviour

def test_cli_errors(tmp_path):
    rc, _, err = run_cli(LLAMA2_JSON, b"ok \xff\xfe", "--no-bos")
    assert rc == 2 and "invalid UTF-8 at byte 3" in err
    rc, _, err = run_cli(LLAMA2_JSON, b"line one\nbad \xc3(\n", "--lines")
    assert rc == 2 and "invalid UTF-8 at byte 13" in err
    rc, _, err = run_cli(tmp_path / "missing.json", b"x")
    assert rc == 3 and err.startswith("error: ")
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {"type": "Unigram", "vocab": []}}')
    rc, _, err = run_cli(bad, b"x")
    assert rc == 3 and "Unigram" in err
    p = subprocess.run([str(ie_bin()), "tokenize", "--bogus"], input=b"", capture_output=True)
    assert p.returncode == 2 and b"usage" in p.stderr
    p = subprocess.run([str(ie_bin()), "tokenize"], input=b"", capture_output=True)
    assert p.returncode == 2 and b"--tokenizer" in p.stderr


def test_cli_lines_edge_cases():
    # empty input: no lines; empty lines give empty id lists; no final newline
    assert run_cli(SMOL_JSON, b"", "--lines")[1] == []
    rc, out, _ = run_cli(SMOL_JSON, b"a\n\nb", "--lines", "--no-bos")
    assert rc == 0 and len(out) == 3 and out[1] == []
    rc, out, _ = run_cli(SMOL_JSON, b"", "--no-bos")
    assert rc == 0 and out == [[]]
