#!/usr/bin/env python3
"""make_hf_vectors.py — expected ids for tokenizer test cases, from Hugging
Face `tokenizers`, in llama.cpp's test-tokenizer-0 format.

Reads INP (cases separated by "\\n__ggml_vocab_test__\\n", as in llama.cpp's
ggml-vocab-*.gguf.inp) and writes OUT with one line per case: the ids, each
preceded by a space, encoded without special tokens (add_special_tokens=False).

usage: make_hf_vectors.py TOKENIZER_JSON INP OUT
"""
import sys

from tokenizers import Tokenizer

SEP = "\n__ggml_vocab_test__\n"


def read_cases(path):
    data = open(path, encoding="utf-8", newline="").read()
    cases = data.split(SEP)
    if cases and cases[-1] == "":
        cases.pop()
    return cases


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    tok = Tokenizer.from_file(sys.argv[1])
    cases = read_cases(sys.argv[2])
    with open(sys.argv[3], "w", encoding="utf-8", newline="\n") as f:
        for c in cases:
            ids = tok.encode(c, add_special_tokens=False).ids
            f.write("".join(f" {i}" for i in ids) + "\n")
    print(f"wrote {sys.argv[3]} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
