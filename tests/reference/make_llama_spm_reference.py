#!/usr/bin/env python3
"""make_llama_spm_reference.py — reference tokenizers for a SentencePiece
("llama") GGUF vocabulary such as tests/data/ggml-vocab-llama-spm.gguf.

Writes two independent references built from the GGUF's pieces, scores and
token types:
  llama_spm.model          a SentencePiece BPE ModelProto (byte_fallback,
                           add_dummy_prefix, no whitespace collapsing), i.e.
                           what Llama 2's tokenizer.model describes; loaded
                           with the `sentencepiece` library;
  llama_spm_tokenizer.json the same vocabulary in Hugging Face's Llama-2 hub
                           format (normalizer Prepend("▁") + Replace(" ",
                           "▁"), BPE with byte_fallback and fuse_unk, merges
                           from transformers' generate_merges ordered by
                           piece score), loaded with `tokenizers`.

usage: make_llama_spm_reference.py [GGUF] [OUTDIR]
"""
import json
import sys
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[2]
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def read_vocab(path):
    r = gguf.GGUFReader(str(path))

    def arr(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    model = bytes(arr("tokenizer.ggml.model")[0]).decode()
    if model != "llama":
        raise SystemExit(f"{path}: tokenizer.ggml.model is {model!r}, expected 'llama'")
    tokens = [bytes(p).decode("utf-8") for p in arr("tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in arr("tokenizer.ggml.scores")]
    types = [int(p[0]) for p in arr("tokenizer.ggml.token_type")]
    return tokens, scores, types


def spm_model_bytes(path):
    from sentencepiece import sentencepiece_model_pb2 as pb

    tokens, scores, types = read_vocab(path)
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.vocab_size = len(tokens)
    m.trainer_spec.unk_id = types.index(UNKNOWN) if UNKNOWN in types else 0
    m.trainer_spec.bos_id = tokens.index("<s>") if "<s>" in tokens else -1
    m.trainer_spec.eos_id = tokens.index("</s>") if "</s>" in tokens else -1
    m.trainer_spec.pad_id = -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    kinds = {NORMAL: pb.ModelProto.SentencePiece.NORMAL, UNKNOWN: pb.ModelProto.SentencePiece.UNKNOWN,
             CONTROL: pb.ModelProto.SentencePiece.CONTROL, USER_DEFINED: pb.ModelProto.SentencePiece.USER_DEFINED,
             UNUSED: pb.ModelProto.SentencePiece.UNUSED, BYTE: pb.ModelProto.SentencePiece.BYTE}
    for t, s, ty in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece, p.score, p.type = t, s, kinds[ty]
    return m.SerializeToString()


def hf_tokenizer_json(path):
    from transformers.tokenization_utils_base import generate_merges

    tokens, scores, types = read_vocab(path)
    vocab = {t: i for i, t in enumerate(tokens)}
    # SentencePiece merges only normal pieces; keep control/unknown/byte out
    skip = [t for t, ty in zip(tokens, types) if ty in (UNKNOWN, CONTROL, BYTE)]
    merges = generate_merges(vocab, {t: s for t, s, ty in zip(tokens, scores, types) if ty == NORMAL}, skip)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (UNKNOWN, CONTROL)]
    unk = tokens[types.index(UNKNOWN)] if UNKNOWN in types else None
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        ]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


def write_all(path, outdir):
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    model = outdir / "llama_spm.model"
    model.write_bytes(spm_model_bytes(path))
    tj = outdir / "llama_spm_tokenizer.json"
    tj.write_text(json.dumps(hf_tokenizer_json(path), ensure_ascii=False), encoding="utf-8")
    return model, tj


def main():
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/data/ggml-vocab-llama-spm.gguf"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".")
    for p in write_all(src, out):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
