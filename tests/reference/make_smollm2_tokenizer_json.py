#!/usr/bin/env python3
"""make_smollm2_tokenizer_json.py — rebuild SmolLM2's Hugging Face
tokenizer.json from the vocabulary inside its GGUF.

The hub's tokenizer.json for HuggingFaceTB/SmolLM2-*-Instruct is a byte-level
BPE with pre_tokenizer Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)], a
ByteLevel decoder and its CONTROL tokens as special added tokens. The GGUF
carries the same vocabulary and merges, so this script writes an equivalent
file that `tokenizers.Tokenizer.from_file` loads; the e2e tests use it as
the reference for our GGUF and tokenizer.json loaders.

usage: make_smollm2_tokenizer_json.py [GGUF] [OUT]
  defaults: models/SmolLM2-135M-Instruct.Q4_1.gguf, tests/data/smollm2_tokenizer.json
"""
import json
import sys
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[2]


def field_list(reader, key):
    f = reader.fields[key]
    return [f.parts[i] for i in f.data]


def main():
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    dst = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "tests/data/smollm2_tokenizer.json"
    r = gguf.GGUFReader(str(src))
    model = bytes(field_list(r, "tokenizer.ggml.model")[0]).decode()
    if model != "gpt2":
        sys.exit(f"{src}: tokenizer.ggml.model is {model!r}, expected 'gpt2'")
    tokens = [bytes(p).decode("utf-8") for p in field_list(r, "tokenizer.ggml.tokens")]
    types = [int(p[0]) for p in field_list(r, "tokenizer.ggml.token_type")]
    merges = [bytes(p).decode("utf-8") for p in field_list(r, "tokenizer.ggml.merges")]

    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3
    ]
    tj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }
    dst.write_text(json.dumps(tj, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {dst} ({len(tokens)} tokens, {len(merges)} merges, {len(added)} special)")


if __name__ == "__main__":
    main()
