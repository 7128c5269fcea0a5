#!/usr/bin/env python3
"""gen_pretok_refs.py — reference tokenizers for the pre-tokenizers of
Llama 3, Qwen2, DeepSeek LLM/Coder, Falcon, StarCoder, Refact, MPT,
Command-R and for Gemma's SentencePiece conventions.

The real vocabularies of those models are not available to the project, so
each reference pairs the model's real *pipeline* (pre-tokenizer, normalizer,
BPE options, as in its Hugging Face tokenizer.json) with a vocabulary we
have:

  byte-level BPE  the first N_MERGES merges of GPT-2 (tests/data/
                  ggml-vocab-gpt-2.gguf) and their tokens, + <|endoftext|>;
  Gemma (SPM)     the first N_SPM pieces of the Llama-2 SentencePiece
                  vocabulary (tests/data/ggml-vocab-llama-spm.gguf) and
                  its one-character pieces, with
                  Gemma's conventions: no dummy prefix (add_space_prefix
                  false, no Prepend normalizer), spaces -> U+2581 by a
                  Replace normalizer, a Split(" ", MergedWithPrevious)
                  pre-tokenizer (a no-op after the Replace), byte fallback,
                  no Strip in the decoder, <start_of_turn>/<end_of_turn>
                  control tokens and a user-defined "\\n\\n".

For every NAME it writes into OUT (default tests/data/pretok):
  NAME.tokenizer.json.xz  the HF tokenizer.json (made with `tokenizers`);
  NAME.gguf               the same vocabulary as a vocabulary-only GGUF
                          (gguf package) with tokenizer.ggml.pre = NAME
                          (Gemma: tokenizer.ggml.model "llama",
                          add_space_prefix false);
  NAME.inp / NAME.out     llama.cpp's test sentences (a copy of
                          ggml-vocab-gpt-2.gguf.inp) and HF's ids for them
                          (no special tokens), llama.cpp's format.
The Austen comparison runs HF live (tests/e2e/test_tokenizer_pretok.py).

usage: gen_pretok_refs.py [--out DIR]
"""
import argparse
import lzma
import shutil
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
GPT2_GGUF = DATA / "ggml-vocab-gpt-2.gguf"
SPM_GGUF = DATA / "ggml-vocab-llama-spm.gguf"
INP = DATA / "ggml-vocab-gpt-2.gguf.inp"
SEP = "\n__ggml_vocab_test__\n"
N_MERGES = 3000
N_SPM = 4000

# The models' pre-tokenizer regexes as their tokenizer.json spell them.
RE_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_DS_CJK = "[一-龥ࠀ-一가-퟿]+"
# cased-letter ranges, spelled with escapes: the same ranges as literal
# characters are fragile (U+1F7D, U+1FBE, U+2126, U+212A... normalise to
# other code points under NFC)
RE_DS_LLM_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
    "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+")
RE_DS_LLM_PUNCT = "\\s?[!-/:-~！-／：-～‘-‟　-。]+"


def split(pattern):
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)


def bl(use_regex):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=use_regex)


# name -> (pre_tokenizer, normalizer or None, ignore_merges), as each model's tokenizer.json has them
def bpe_specs():
    P = pre_tokenizers
    return {
        "llama-bpe": (P.Sequence([split(RE_LLAMA3), bl(False)]), None, True),
        "qwen2": (P.Sequence([split(RE_QWEN2), bl(False)]), normalizers.NFC(), False),
        "deepseek-llm": (P.Sequence([split("[\r\n]"), split(RE_DS_LLM_LETTERS), split(RE_DS_LLM_PUNCT),
                                     split("\\s+$"), split(RE_DS_CJK), P.Digits(individual_digits=False),
                                     bl(False)]), None, False),
        "deepseek-coder": (P.Sequence([split("[\r\n]"), split("\\s?\\p{L}+"), split("\\s?\\p{P}+"),
                                       split(RE_DS_CJK), P.Digits(individual_digits=True), bl(False)]),
                           None, False),
        "falcon": (P.Sequence([P.Punctuation(behavior="contiguous"), bl(True), P.Digits(individual_digits=False),
                               split("[0-9][0-9][0-9]")]), None, False),
        "starcoder": (P.Sequence([P.Digits(individual_digits=True), bl(True)]), None, False),
        "refact": (P.Sequence([P.Digits(individual_digits=True), bl(True)]), None, False),
        "command-r": (P.Sequence([P.Digits(individual_digits=True), bl(True)]), normalizers.NFC(), False),
        "mpt": (bl(True), normalizers.NFC(), False),
    }


def gguf_arr(r, key):
    f = r.fields[key]
    return [f.parts[i] for i in f.data]


def small_gpt2_vocab():
    """(tokens in byte-level form, merges as pairs): GPT-2's 256 byte tokens
    then the results of its first N_MERGES merges, in merge order."""
    r = gguf.GGUFReader(str(GPT2_GGUF))
    toks = [bytes(p).decode("utf-8") for p in gguf_arr(r, "tokenizer.ggml.tokens")]
    merges = [bytes(p).decode("utf-8") for p in gguf_arr(r, "tokenizer.ggml.merges")]
    vocab = toks[:256]
    have = set(vocab)
    pairs = []
    for m in merges[:N_MERGES]:
        a, b = m.split(" ", 1)
        assert a in have and b in have, m
        pairs.append((a, b))
        if a + b not in have:
            have.add(a + b)
            vocab.append(a + b)
    return vocab, pairs


def bpe_tokenizer(vocab, pairs, spec):
    pre, norm, ignore_merges = spec
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(vocab)}, pairs, ignore_merges=ignore_merges))
    if norm is not None:
        tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok


def write_bpe_gguf(path, name, vocab, pairs):
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(name)
    w.add_token_list(vocab + ["<|endoftext|>"])
    w.add_token_types([gguf.TokenType.NORMAL] * len(vocab) + [gguf.TokenType.CONTROL])
    w.add_token_merges([f"{a} {b}" for a, b in pairs])
    w.add_bos_token_id(len(vocab))
    w.add_eos_token_id(len(vocab))
    w.add_add_bos_token(False)
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------- Gemma

GEMMA_CONTROL = ["<start_of_turn>", "<end_of_turn>"]
GEMMA_USER = ["\n\n"]


def gemma_vocab():
    """(pieces, scores, types) of the truncated Llama-2 SentencePiece
    vocabulary with Gemma's extra control and user-defined tokens."""
    r = gguf.GGUFReader(str(SPM_GGUF))
    toks = [bytes(p).decode("utf-8") for p in gguf_arr(r, "tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in gguf_arr(r, "tokenizer.ggml.scores")]
    types = [int(p[0]) for p in gguf_arr(r, "tokenizer.ggml.token_type")]
    # the first N_SPM pieces, and every one-character piece (SentencePiece
    # lists those last; without them nothing merges)
    keep = [i for i, t in enumerate(toks) if i < N_SPM or len(t) == 1]
    toks, scores, types = [toks[i] for i in keep], [scores[i] for i in keep], [types[i] for i in keep]
    for t in GEMMA_CONTROL:
        toks.append(t); scores.append(0.0); types.append(int(gguf.TokenType.CONTROL))
    for t in GEMMA_USER:
        toks.append(t); scores.append(0.0); types.append(int(gguf.TokenType.USER_DEFINED))
    return toks, scores, types


def gemma_tokenizer(toks, scores, types):
    from transformers.tokenization_utils_base import generate_merges
    NORMAL, UNKNOWN, CONTROL, USER, BYTE = 1, 2, 3, 4, 6
    vocab = {t: i for i, t in enumerate(toks)}
    skip = [t for t, ty in zip(toks, types) if ty in (UNKNOWN, CONTROL, USER, BYTE)]
    merges = generate_merges(vocab, {t: s for t, s, ty in zip(toks, scores, types) if ty == NORMAL}, skip)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(toks, types) if ty == USER])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(toks, types) if ty in (UNKNOWN, CONTROL)])
    return tok


def write_gemma_gguf(path, toks, scores, types):
    w = gguf.GGUFWriter(str(path), arch="gemma2")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(toks.index("<s>"))
    w.add_eos_token_id(toks.index("</s>"))
    w.add_unk_token_id(toks.index("<unk>"))
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    finish(w)


# ---------------------------------------------------------------- output

def write_vectors(tok, out, name):
    shutil.copyfile(INP, out / f"{name}.inp")
    cases = INP.read_text(encoding="utf-8").split(SEP)
    if cases and cases[-1] == "":
        cases.pop()
    with open(out / f"{name}.out", "w", encoding="utf-8", newline="\n") as f:
        for c in cases:
            f.write("".join(f" {i}" for i in tok.encode(c, add_special_tokens=False).ids) + "\n")
    # the committed json must load back to the same tokenizer
    (out / f"{name}.tokenizer.json.xz").write_bytes(lzma.compress(tok.to_str().encode("utf-8"), preset=9))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DATA / "pretok")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    vocab, pairs = small_gpt2_vocab()
    for name, spec in bpe_specs().items():
        tok = bpe_tokenizer(vocab, pairs, spec)
        write_vectors(tok, a.out, name)
        write_bpe_gguf(a.out / f"{name}.gguf", name, vocab, pairs)
        print(f"{name}: {tok.get_vocab_size()} tokens")
    toks, scores, types = gemma_vocab()
    tok = gemma_tokenizer(toks, scores, types)
    write_vectors(tok, a.out, "gemma")
    write_gemma_gguf(a.out / "gemma.gguf", toks, scores, types)
    print(f"gemma: {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    main()
