"""The real SmolLM2-135M-Instruct (Q4_1 GGUF) vs transformers' fp32 reference.

Fixture: smollm2_ref.npz / .json from tests/reference/gen_smollm2_ref.py.
transformers loads the same GGUF, dequantizes it to fp32 and runs fp32; for
five prompts it stores the prompt ids, its greedy continuation (up to the
prompt's max_new tokens, ending early only at an end-of-generation id), top-50
logits at every position of prompt+continuation, the full logits at the last
prompt position, and the top1-top2 margin at each position that chose a
continuation token. Every continuation covers at least 32 tokens before any
end-of-generation id (checked below), so each check here spans >= 32 greedy
tokens per prompt; the chat prompt's answer ends with <|im_end|> (after 35
tokens), so the run mode also sees an end-of-generation stop.

--precision f32 (weights dequantized to f32 at load, fp32 arithmetic):
  * per position, max|ours - ref| over the stored top-50 entries
    / max|ref top-50| <= 1e-3, and no logit of ours anywhere in the vocabulary
    exceeds the reference maximum by more than that;
  * the full last-prompt-position row: max|ours - ref| / max|ref| <= 1e-3;
  * teacher forcing over the continuation with tau = 1e-2 (below).

--precision native (Q4_1 kernels with int8-quantized activations):
  * teacher forcing (one prefill over prompt + continuation, and the same
    through the KV cache with --mode decode): at every continuation position
    the engine's argmax must be the reference's next token, except where the
    reference itself has a near tie: the engine's choice must always have a
    reference logit within tau of the reference maximum. With tau = 0.5 this
    means an exact match wherever the reference margin exceeds 0.5. tau comes
    from simulating llama.cpp-style Q8 activation quantization in transformers
    on this model: it moves the top1-top2 gap by up to ~0.5 logit over these
    prompts, so a reference margin of 0.001 (there are some) cannot be
    resolved by an int8-activation engine, while a margin above 0.5 must be.
  * logits sanity: per position, top-50 rel error <= 0.15 (simulation: <= 0.08).
  * the real generation mode (--greedy, --max-new = the prompt's max_new) on
    each prompt text:
    prompt tokenization equals the reference's, and the generated ids equal the
    reference continuation token for token; the only accepted difference is a
    divergence at a near-tie position as defined above (after which the
    sequences no longer share a context and comparison stops).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import THREADS, engine_logits, fixture_path, run_json

N_PROMPTS = 5
MIN_CONT = 32       # greedy tokens every prompt must cover before any EOG id
TOL_F32 = 1e-3
TAU_F32 = 1e-2
TAU_NATIVE = 0.5
TOL_NATIVE_TOPK = 0.15


@pytest.fixture(scope="module")
def ref():
    d = np.load(fixture_path("smollm2_ref.npz"))
    meta = json.loads(str(d["meta"]))
    assert len(meta["prompts"]) == N_PROMPTS
    eog = set(meta["eog_ids"])
    out = []
    for i in range(N_PROMPTS):
        r = {k: d[f"p{i}_{k}"] for k in ("prompt_ids", "cont_ids", "topk_ids", "topk_vals",
                                         "last_logits", "margins")}
        r["text"] = meta["prompts"][i]["text"]
        r["cont_text_plain"] = meta["prompts"][i]["cont_text_plain"]
        r["max_new"] = int(meta["prompts"][i]["max_new"])
        P, C = len(r["prompt_ids"]), len(r["cont_ids"])
        assert r["topk_ids"].shape == (P + C, meta["topk"])
        assert r["last_logits"].shape == (meta["n_vocab"],)
        assert r["margins"].shape == (C,)
        cont = [int(t) for t in r["cont_ids"]]
        # every prompt covers >= MIN_CONT greedy tokens, none of them an EOG id
        assert C >= MIN_CONT, f"prompt {i}: continuation has {C} tokens, want >= {MIN_CONT}"
        assert not eog & set(cont[:MIN_CONT]), f"prompt {i}: EOG within the first {MIN_CONT} tokens"
        assert C <= r["max_new"] and (C == r["max_new"] or cont[-1] in eog), \
            f"prompt {i}: {C} tokens, budget {r['max_new']}, no EOG at the end"
        out.append(r)
    # the run-mode test must see an end-of-generation stop somewhere
    assert any(int(r["cont_ids"][-1]) in eog for r in out), "no reference continuation ends in EOG"
    return meta, out


def _seq(r):
    return np.concatenate([r["prompt_ids"], r["cont_ids"]]).astype(np.int64)


def _topk_rel(ours, r):
    """Per row: max|ours[topk ids] - ref topk| / max|ref topk|."""
    got = np.take_along_axis(ours, r["topk_ids"].astype(np.int64), axis=-1)
    return np.max(np.abs(got - r["topk_vals"]), axis=-1) / np.max(np.abs(r["topk_vals"]), axis=-1)


def _ref_logit_of(r, row, tok):
    """Reference logit of token `tok` at `row`, or None if outside the top-50."""
    hit = np.nonzero(r["topk_ids"][row] == tok)[0]
    return float(r["topk_vals"][row, hit[0]]) if hit.size else None


def _check_choice(r, row, tok, tau):
    """The engine chose `tok` at `row`: fine if it is the reference top-1, or
    its reference logit is within tau of the reference maximum."""
    best = int(r["topk_ids"][row, 0])
    if tok == best:
        return None
    lv = _ref_logit_of(r, row, tok)
    gap = None if lv is None else float(r["topk_vals"][row, 0]) - lv
    if gap is not None and gap <= tau:
        return None
    return (f"row {row}: engine chose {tok} (ref logit gap "
            f"{'>top-50' if gap is None else f'{gap:.3f}'}), reference top-1 {best}")


def _teacher_forcing(ours, r, tau):
    P, C = len(r["prompt_ids"]), len(r["cont_ids"])
    errors, near_ties = [], 0
    for j in range(C):
        row = P - 1 + j
        tok = int(np.argmax(ours[row]))
        assert int(r["topk_ids"][row, 0]) == int(r["cont_ids"][j])  # fixture consistency
        e = _check_choice(r, row, tok, tau)
        if e:
            errors.append(f"cont[{j}] " + e)
        elif tok != int(r["cont_ids"][j]):
            near_ties += 1
    return errors, near_ties


@pytest.mark.parametrize("i", range(N_PROMPTS))
def test_f32_logits_match(ref, i, smollm2, tmp_path):
    _, refs = ref
    r = refs[i]
    P = len(r["prompt_ids"])
    ours = engine_logits(smollm2, _seq(r), tmp_path, precision="f32", mode="prefill")
    assert ours.shape[1] == r["last_logits"].shape[0]
    rel = _topk_rel(ours, r)
    assert rel.max() <= TOL_F32, f"top-50 rel err {rel.max():.3e} at row {int(rel.argmax())}"
    scale = np.max(np.abs(r["topk_vals"]), axis=-1)
    over = (ours.max(axis=-1) - r["topk_vals"][:, 0]) / scale
    assert over.max() <= TOL_F32, f"a logit outside the reference top-50 is too high at row {int(over.argmax())}"
    full = np.max(np.abs(ours[P - 1] - r["last_logits"])) / np.max(np.abs(r["last_logits"]))
    assert full <= TOL_F32, f"last prompt position full-row rel err {full:.3e}"
    errors, _ = _teacher_forcing(ours, r, TAU_F32)
    assert not errors, "; ".join(errors)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("i", range(N_PROMPTS))
def test_native_teacher_forcing(ref, i, mode, smollm2, tmp_path):
    _, refs = ref
    r = refs[i]
    ours = engine_logits(smollm2, _seq(r), tmp_path, precision="native", mode=mode)
    rel = _topk_rel(ours, r)
    assert rel.max() <= TOL_NATIVE_TOPK, f"top-50 rel err {rel.max():.3e} at row {int(rel.argmax())}"
    errors, near = _teacher_forcing(ours, r, TAU_NATIVE)
    assert not errors, f"{len(errors)} wrong greedy choices: " + "; ".join(errors[:5])
    # Near ties are allowed, but not many: the reference has few.
    n_ties = int(np.sum(r["margins"] <= TAU_NATIVE))
    assert near <= n_ties


def _strip_eog(ids, eog):
    ids = list(ids)
    while ids and ids[-1] in eog:
        ids.pop()
    return ids


@pytest.mark.parametrize("i", range(N_PROMPTS))
def test_generate_matches_reference(ref, i, smollm2):
    meta, refs = ref
    r = refs[i]
    eog = set(meta["eog_ids"])
    out = run_json(["--model", smollm2, "--prompt", r["text"], "--max-new", r["max_new"],
                    "--greedy", "--threads", THREADS], timeout=300)
    assert out["tokens_in"] == len(r["prompt_ids"]), \
        f"prompt tokenized to {out['tokens_in']} tokens, reference {len(r['prompt_ids'])}"
    ours = [int(x) for x in out["ids"]]
    want = [int(x) for x in r["cont_ids"]]
    ref_stopped = bool(want) and want[-1] in eog
    P = len(r["prompt_ids"])
    for j, (a, b) in enumerate(zip(ours, want)):
        if a == b:
            continue
        e = _check_choice(r, P - 1 + j, a, TAU_NATIVE)
        assert e is None, f"generated token {j} differs: {e}; ours {ours}, ref {want}"
        return  # legitimate near-tie divergence: the contexts differ from here on
    a, b = _strip_eog(ours, eog), _strip_eog(want, eog)
    assert a == b, f"ours {ours}\nref  {want}"
    if ref_stopped:
        assert len(ours) <= len(want), "reference stopped at end-of-generation, engine did not"
        assert out.get("stop_reason") == "eos", \
            f"stop_reason {out.get('stop_reason')!r}, want 'eos'"
    else:
        assert len(ours) == r["max_new"], f"generated {len(ours)} tokens, want {r['max_new']}"
    assert out["tokens_out"] == len(ours)
    assert out["text"] == r["cont_text_plain"], (out["text"], r["cont_text_plain"])
