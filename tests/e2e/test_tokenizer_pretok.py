"""test_tokenizer_pretok.py — the pre-tokenizers of Llama 3 (llama-bpe),
Qwen2, DeepSeek LLM / Coder, Falcon, StarCoder, Refact, Command-R, MPT and
Gemma's SentencePiece conventions against Hugging Face `tokenizers`.

Fixtures (tests/data/pretok, made by tests/reference/gen_pretok_refs.py):
each model's tokenizer.json pipeline over a small vocabulary
(NAME.tokenizer.json.xz) and the same vocabulary as a GGUF whose
tokenizer.ggml.pre is NAME (NAME.gguf), plus llama.cpp's test sentences
with HF's ids (NAME.inp / NAME.out).

For every NAME, our `inference-engine tokenize` on both the tokenizer.json
and the GGUF must give exactly HF's ids for
  * every llama.cpp test sentence (NAME.out, and HF re-run live),
  * every line of the Austen corpus (tests/data/corpus),
  * adversarial random lines (mixed scripts, Unicode digits and spaces,
    combining marks), and for the NFC pipelines every precomposed
    character and its decomposition.
"""
import importlib
import lzma
import os
import sys
import unicodedata
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_tokenizer_hf import CORPUS, corpus_lines, hf_encode_special, random_lines, run_cli  # noqa: E402

tokenizers = importlib.import_module("tokenizers")

ROOT = HERE.parents[1]
PRETOK = Path(os.environ.get("IE_FIXTURES_DIR", ROOT / "tests" / "data")) / "pretok"
NAMES = ["llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "falcon", "starcoder", "refact", "command-r",
         "mpt", "gemma"]
NFC_NAMES = ["qwen2", "command-r", "mpt"]
SEP = "\n__ggml_vocab_test__\n"


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """name -> (tokenizer.json path, GGUF path, HF tokenizer)."""
    d = tmp_path_factory.mktemp("pretok")
    out = {}
    for n in NAMES:
        j = d / f"{n}.tokenizer.json"
        j.write_bytes(lzma.decompress((PRETOK / f"{n}.tokenizer.json.xz").read_bytes()))
        out[n] = (j, PRETOK / f"{n}.gguf", tokenizers.Tokenizer.from_file(str(j)))
    return out


def hf_ids(tok, lines):
    return [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]


def check_lines(label, path, lines, expect, *flags):
    data = ("\n".join(lines) + "\n").encode()
    rc, ours, err = run_cli(path, data, "--lines", "--no-bos", *flags)
    assert rc == 0, f"{label}: {err}"
    assert len(ours) == len(expect), label
    bad = [i for i, (a, b) in enumerate(zip(ours, expect)) if a != b]
    print(f"\n{label}: {len(lines) - len(bad)}/{len(lines)} lines identical, "
          f"{sum(map(len, expect))} tokens")
    assert not bad, f"{label}: {len(bad)} lines differ:\n" + "\n".join(
        f"{lines[i]!r}\n   ours {ours[i]}\n   ref  {expect[i]}" for i in bad[:5])
    return len(lines), sum(map(len, expect))


@pytest.mark.parametrize("name", NAMES)
def test_sentences(refs, name):
    """llama.cpp's sentences (they contain newlines: one CLI run each)."""
    j, g, hf = refs[name]
    cases = (PRETOK / f"{name}.inp").read_text(encoding="utf-8").split(SEP)
    if cases and cases[-1] == "":
        cases.pop()
    committed = [[int(x) for x in line.split()]
                 for line in (PRETOK / f"{name}.out").read_text(encoding="utf-8").splitlines()]
    assert len(committed) == len(cases) >= 40
    live = hf_ids(hf, cases)
    assert live == committed, f"{name}: HF no longer gives the committed ids (regenerate)"
    for path in (j, g):
        bad = []
        for text, ids in zip(cases, committed):
            rc, out, err = run_cli(path, text.encode(), "--no-bos")
            assert rc == 0, err
            if out != [ids]:
                bad.append(f"{text!r}\n   ours {out}\n   ref  {ids}")
        print(f"\n{name} {path.suffix}: {len(cases) - len(bad)}/{len(cases)} sentences identical")
        assert not bad, "\n".join(bad[:5])


@pytest.mark.parametrize("name", NAMES)
def test_austen(refs, name):
    j, g, hf = refs[name]
    lines = []
    for p in CORPUS:
        lines += corpus_lines(p)[1]
    expect = hf_ids(hf, lines)
    for path in (j, g):
        check_lines(f"{name} {path.suffix} Austen", path, lines, expect)


@pytest.mark.parametrize("name", NAMES)
def test_random_lines(refs, name):
    j, g, hf = refs[name]
    lines = random_lines(800, seed=7)
    for path in (j, g):
        check_lines(f"{name} {path.suffix} random", path, lines, hf_encode_special(hf, False)(lines))
        check_lines(f"{name} {path.suffix} random --parse-special", path, lines, hf_encode_special(hf, True)(lines),
                    "--parse-special")


# U+11938 DIVES AKURU VOWEL SIGN O (Unicode 13): our tables (Python's
# unicodedata) compose U+11935 U+11930 into it, HF `tokenizers` does not
# (its normalization tables differ here); the only difference found.
NFC_VERSION_SKEW = {0x11938}


def nfc_lines():
    """Every character with a canonical decomposition, its NFD, marks in
    scrambled order, Hangul jamo sequences, and random mark soups."""
    import random
    lines = []
    for cp in range(0xC0, 0x30000):
        c = chr(cp)
        d = unicodedata.decomposition(c)
        if not d or d[0] == "<" or cp in NFC_VERSION_SKEW:
            continue
        lines.append(c + " " + unicodedata.normalize("NFD", c) + "x")
    rng = random.Random(5)
    marks = ["\u0301", "\u0300", "\u0308", "\u0323", "\u031b", "\u0327", "\u05b0", "\u093c", "\u0f71", "\u0f72",
             "\u3099", "\u1161", "\u11a8", "\u0345", "\u0334"]
    bases = ["a", "e", "o", "u", "A", "\u1100", "\uac00", "\u304b", "\u0915", "\u0f40", "\u03b1", "\u0391", " ", "1"]
    for _ in range(3000):
        lines.append("".join(rng.choice(bases) + "".join(rng.choice(marks) for _ in range(rng.randint(0, 4)))
                             for _ in range(rng.randint(1, 6))))
    return lines


@pytest.mark.parametrize("name", NFC_NAMES)
def test_nfc(refs, name):
    """A GGUF has no normalizer; ours applies NFC for the pre-tokenizer names
    whose models normalise (llama.cpp does not)."""
    j, g, hf = refs[name]
    lines = nfc_lines()
    expect = hf_ids(hf, lines)
    for path in (j, g):
        check_lines(f"{name} {path.suffix} NFC", path, lines, expect)


def test_unknown_pre_tokenizer(tmp_path, refs):
    """An unknown tokenizer.ggml.pre or pre_tokenizer type is refused, naming it."""
    import json
    gguf = importlib.import_module("gguf")
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("no-such-pre")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    rc, _, err = run_cli(tmp_path / "bad.gguf", b"ab")
    assert rc == 3 and "no-such-pre" in err and "llama-bpe" in err, err
    j = json.loads(refs["qwen2"][0].read_text(encoding="utf-8"))
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "UnicodeScripts"}]}
    (tmp_path / "bad.json").write_text(json.dumps(j), encoding="utf-8")
    rc, _, err = run_cli(tmp_path / "bad.json", b"ab")
    assert rc == 3 and "UnicodeScripts" in err, err
    j["pre_tokenizer"] = None
    j["normalizer"] = {"type": "NFKC"}
    (tmp_path / "bad.json").write_text(json.dumps(j), encoding="utf-8")
    rc, _, err = run_cli(tmp_path / "bad.json", b"ab")
    assert rc == 3 and "NFKC" in err, err
