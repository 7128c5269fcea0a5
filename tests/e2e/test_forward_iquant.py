"""GGUF grid i-quants end to end (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S): tiny Llamas in every type, a mixed file and a tied one; the engine's
logits against a numpy forward of the same weights, plans, bad files.

No torch, no llama.cpp, no committed fixtures: gguf.quants cannot quantize
these types, but any bytes are a valid block once its f16 scale d is finite,
so the models are written here, at test time (deterministic: fixed seeds),
from the committed tests/data/tiny_kq_mixed.gguf / tiny_kq_tied.gguf
(gen_tiny_kquant.py: hidden 256, FFN 512, 2 layers, 4/2 heads of 64, vocab
512): keys, tokenizer and norms copied; each replaced 2-D weight is random
bytes with d = f16(s * jitter) per block, jitter ~ U(0.7, 1.4), s chosen so
that the values (as gguf.quants dequantizes them) have the rms of the
weight they replace. The logits then have std ~1.6 and max |logit| 7-10
(the tied head's ~6x that, as for the k-quant tied file). The files:

  iq_<t>.gguf   every 2-D weight in type t, token_embd and output included
  iq_mixed.gguf i-quants in every role, each layer different, beside the
                source's q4_K token_embd, q5_0 / iq4_nl attn_output (32-element
                blocks, so tensor:2 can cut their 256 columns) and q5_1 attn_k
  iq_tied.gguf  tied embeddings: token_embd iq3_xxs is also the head; layers
                iq2_xs / iq1_m, attn_v and ffn_down the source's q6_K

The reference (class Forward) is a numpy Llama in f64 on the weights as
gguf.quants dequantizes them — the decoder tests/unit/test_iquant.c proves
the engine's equal to, bit for bit. With act=True it also rounds every
matmul's input as the native path does (Q8_K per 256 for the i-quants and K
types, Q8_P per 32 for q5_0/q5_1/iq4_nl, as kquant_ref.c / quant_ref.c
compute them): the "simulation" of the native path's only other rounding.

Prompts (per file, the first of seeded candidates that qualify): 8 random
ids, then 6 greedy steps on which the reference and the simulation pick the
same id, each leading by >= 5% of the row's largest |logit| (MARGIN); so the
engine's native and f32 greedy ids must both be that id at every step.

Metric: rel = max over positions of max|ours - ref| / max|ref|;
rms = rms(ours - ref) / rms(ref).

Bounds (measured 2026-11 with the AVX-512 i-quant kernels of 1e77c5e, 2
threads; IE_ISA=avx2 / ref where they differ; brackets: the extremes over
the 9 files, both modes, both prompts):
  --precision f32 vs the reference: rel <= 1e-4 [1.6e-6]; greedy ids equal.
  native vs the simulation: rel <= 0.08, rms <= 0.05 [3.3e-7 / 1.8e-7; with
        IE_ISA=avx2 or ref 8.0e-3 / 2.7e-3, on the mixed file, whose q4_K /
        q5_0 / iq4_nl parts then sum in another order]. The i-quant kernels
        round exactly as the simulation does, but this model is sensitive:
        a float-order difference upstream flips single 8-bit codes, and each
        flip moves the logits. Rounding every activation after a random
        relative perturbation of 1e-7 / 1e-6 / 1e-5 moves them by up to
        2.8e-2 / 5.6e-2 / 5.7e-2 rel (1.5e-2 / 3.1e-2 / 3.6e-2 rms): the
        flips' effect saturates at about the rounding's own size, and the
        bounds hold that with ~1.4x to spare, for any kernel that rounds
        activations as Q8_K does. (Errors in one tensor's weights of the
        mixed or iq2_xs file — one group of 8 negated per block, one block
        doubled — move the simulation by 0.08 .. 1.1 rel, 0.036 .. 0.61 rms;
        one sub-block's scale x1.2 in every block of one ffn_down only by
        0.045 / 0.029, below the bounds: exactness per block is the unit
        tests' job.)
  native vs the engine's f32 (the i-quants' whole effect on the logits):
        rel <= 1.25 * sim + 0.08 and rms <= 1.25 * sim_rms + 0.05, sim being
        the simulation's distance from the reference on the same ids
        (measured: native vs f32 equals sim to 3-4 digits, rel 0.047 .. 0.080,
        rms 0.036 .. 0.049). Greedy ids equal f32's, both modes; they stay
        so under the 1e-5 perturbation above (every step's lead then still
        >= 3% of the row's largest |logit|).
  plans (mixed file, decode): pipeline:2 gives the embedded bits; tensor:2
        (partial sums added in rank order) f32 rel <= 1e-4 [7.1e-7], native
        <= 0.08 [1.7e-3; avx2 8.0e-3, ref 2.7e-7: code flips again], the
        same greedy ids. pipeline:2 on every other file gives the embedded
        bits. tensor:2 on a file whose attn_output is an i-quant (256
        columns: one block) is refused at plan time, naming the tensor.
  bad files: a NaN / infinite d in any type (IQ1_M's assembled from its
        nibbles; in token_embd, the head, a layer) exits 3 naming the
        tensor, its type and the block (native, f32 and int8w); so does a
        file that ends inside output.weight.
  ie-convert: to f32, every i-quant tensor is gguf.quants' values bit for
        bit and the IEBIN's f32 logits are the GGUF's bit for bit; with
        every tensor kept, the i-quants stay ROWS blocks and the IEBIN gives
        the GGUF's logits bit for bit, native and f32.

Run time: 11 s on 2 cores (17-20 s while they are busy), about half of it
building the files and choosing the prompts.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from conftest import EXIT_MODEL, EXIT_USAGE, THREADS, engine_logits, fixture_path, row_rel_err, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from gguf_rewrite import IQ, copy_keys, set_iq_d  # noqa: E402  (name -> (ggml type, block bytes, ftype))
TYPES = tuple(IQ)
SEED = 20261128
WEIGHTS = ["token_embd.weight", "output.weight"] + [
    f"blk.{i}.{s}.weight" for i in (0, 1)
    for s in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
MIXED = {
    "output.weight": "iq3_s",
    "blk.0.attn_q.weight": "iq2_xxs", "blk.0.attn_k.weight": "iq1_s", "blk.0.attn_v.weight": "iq3_xxs",
    "blk.0.ffn_gate.weight": "iq2_xs", "blk.0.ffn_up.weight": "iq1_m", "blk.0.ffn_down.weight": "iq2_s",
    "blk.1.attn_q.weight": "iq3_s", "blk.1.attn_v.weight": "iq1_m",
    "blk.1.ffn_gate.weight": "iq3_xxs", "blk.1.ffn_up.weight": "iq2_xxs", "blk.1.ffn_down.weight": "iq1_s",
}
TIED = {"token_embd.weight": "iq3_xxs", **{
    f"blk.{i}.{s}.weight": ("iq2_xs", "iq1_m")[i]
    for i in (0, 1) for s in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")}}
FILES = {  # file -> (source fixture, plan: tensor -> i-quant)
    **{f"iq_{t}.gguf": ("tiny_kq_mixed.gguf", {n: t for n in WEIGHTS}) for t in TYPES},
    "iq_mixed.gguf": ("tiny_kq_mixed.gguf", MIXED),
    "iq_tied.gguf": ("tiny_kq_tied.gguf", TIED),
}

N_RANDOM, N_GREEDY, N_PROMPTS = 8, 6, 2
# top 1 - top 2 at every greedy step (reference and simulation), relative to
# the row's largest |logit| (~8 here, ~50 for the tied head)
MARGIN = 0.05
TOL_F32 = 1e-4
SIM_MAX, SIM_RMS = 0.08, 0.05                       # native vs the simulation
NAT_SLACK, NAT_ABS_MAX, NAT_ABS_RMS = 1.25, 0.08, 0.05  # native vs f32: NAT_SLACK * sim + NAT_ABS_*
F16_NAN, F16_INF, F16_NINF = 0x7E00, 0x7C00, 0xFC00


# ------------------------------------------------------- random i-quant blocks
def random_iquant(name, shape, target_rms, rng):
    """Random blocks of type name for a weight [rows][cols] whose values have
    rms ~ target_rms. Returns (uint8 [rows][row bytes], f32 [rows][cols] as
    gguf.quants dequantizes them)."""
    qt, bb, _ = IQ[name]
    rows, cols = shape
    nb = rows * cols // 256
    blk = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    set_iq_d(name, blk, np.full(nb, 0x3C00))  # d = 1
    unit = gguf.quants.dequantize(blk.reshape(rows, -1), qt).astype(np.float64)
    jitter = rng.uniform(0.7, 1.4, nb)
    s = target_rms / float(np.sqrt(np.mean(unit ** 2) * np.mean(jitter ** 2)))
    set_iq_d(name, blk, (s * jitter).astype(np.float16).view(np.uint16))
    q = blk.reshape(rows, -1)
    w = gguf.quants.dequantize(q, qt).astype(np.float32)
    assert w.shape == shape and np.all(np.isfinite(w))
    return q, w


def build(src, dst, plan, rng):
    """dst: src's keys and tensors in src's order, each 2-D tensor in plan
    replaced by random blocks of type plan[name]. Returns (name -> f32
    values, name -> type name, hyper-parameters)."""
    r = gguf.GGUFReader(str(src))
    ftypes = {IQ[t][2] for t in plan.values()}
    w = gguf.GGUFWriter(str(dst), "llama")
    copy_keys(r, w, ftypes.pop() if len(ftypes) == 1 else 7, dst.stem)  # 7 (MOSTLY_Q8_0) for the mixes
    vals, types = {}, {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if t.tensor_type == QT.F32:
            a = np.array(t.data, dtype=np.float32).reshape(shape)
            w.add_tensor(t.name, a)
            vals[t.name], types[t.name] = a, "f32"
            continue
        orig = gguf.quants.dequantize(np.array(t.data), t.tensor_type).reshape(shape)
        if t.name in plan:
            rms = float(np.sqrt(np.mean(orig.astype(np.float64) ** 2)))
            q, a = random_iquant(plan[t.name], shape, rms, rng)
            qt, types[t.name] = IQ[plan[t.name]][0], plan[t.name]
        else:
            q, a, qt = np.array(t.data), orig, t.tensor_type
            types[t.name] = t.tensor_type.name.lower()
        w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=qt)
        vals[t.name] = a.astype(np.float32)
    assert set(plan) <= set(vals), set(plan) - set(vals)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    def f(k):
        return r.fields[k].parts[-1][0].item()
    hp = {"n_layer": f("llama.block_count"), "n_head": f("llama.attention.head_count"),
          "n_kv": f("llama.attention.head_count_kv"), "eps": f("llama.attention.layer_norm_rms_epsilon"),
          "theta": f("llama.rope.freq_base")}
    return vals, types, hp


# ------------------------------------------------------------ numpy reference
def _q8k(x):
    """Q8_K (kquant_ref.c): per 256, iscale = -127 / (the value of largest
    magnitude, first on ties), q = min(127, nearest-even(iscale * x)),
    x' = q * (1 / iscale); f32 arithmetic."""
    b = x.astype(np.float32).reshape(-1, 256)
    mx = b[np.arange(len(b)), np.abs(b).argmax(1)]
    with np.errstate(divide="ignore", over="ignore"):
        isc = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0)).astype(np.float32)
        isc = np.where(np.isinf(isc), np.float32(0), isc)
        d = np.where(isc != 0, np.float32(1.0) / isc, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(b * isc[:, None]), 127).astype(np.float32)
    return (q * d[:, None]).reshape(x.shape)


def _q8p(x):
    """Q8_P (quant_ref.c, q5_0/q5_1/iq4_nl activations): per 32, d = max|x|
    / 127, q = round-half-away(x * (1 / d))."""
    b = x.astype(np.float32).reshape(-1, 32)
    d = (np.abs(b).max(1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = b * inv[:, None]
    return ((np.sign(v) * np.floor(np.abs(v) + 0.5)) * d[:, None]).reshape(x.shape).astype(np.float32)


ACT = {**{t: _q8k for t in TYPES + ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")},
       **{t: _q8p for t in ("q5_0", "q5_1", "iq4_nl")}}


def _mm(x, w):
    if len(x) == 1:
        return x @ w.T
    # einsum, not @: numpy's BLAS threads make a (20 x 256) @ (256 x 512)
    # ~100x slower on a loaded 2-core machine; einsum has its own loops
    return np.einsum("ti,oi->to", x, w)


class Forward:
    """A numpy Llama over the GGUF's tensors (Q/K rows in GGUF's order:
    RoPE on adjacent pairs), f64, with a KV cache: run(ids) returns the
    logits of the new ids. act: every matmul's input rounded as the native
    path rounds it (the simulation)."""

    def __init__(self, model, act=False):
        self.vals, self.types, self.hp = model["vals"], model["types"], model["hp"]
        if "w64" not in model:
            model["w64"] = {k: v.astype(np.float64) for k, v in self.vals.items()}
        self.W = model["w64"]
        self.head = "output.weight" if "output.weight" in self.W else "token_embd.weight"
        self.act = act
        self.k = [None] * self.hp["n_layer"]
        self.v = [None] * self.hp["n_layer"]
        self.pos = 0

    def mm(self, x, name):
        if self.act and self.types[name] in ACT:
            x = ACT[self.types[name]](x).astype(np.float64)
        return _mm(x, self.W[name])

    def norm(self, x, name):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + self.hp["eps"]) * self.W[name]

    def run(self, ids):
        T, H, KV = len(ids), self.hp["n_head"], self.hp["n_kv"]
        x = self.W["token_embd.weight"][np.asarray(ids)]
        D = x.shape[1] // H
        pos = np.arange(self.pos, self.pos + T)
        ang = pos[:, None] * self.hp["theta"] ** (-np.arange(0, D, 2) / D)[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

        def rope(v):
            a, b = v[..., 0::2], v[..., 1::2]
            out = np.empty_like(v)
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
            return out

        n_all = self.pos + T
        mask = np.where(np.arange(n_all)[None, :] > pos[:, None], -np.inf, 0.0)
        for i in range(self.hp["n_layer"]):
            p = f"blk.{i}."
            h = self.norm(x, p + "attn_norm.weight")
            q = rope(self.mm(h, p + "attn_q.weight").reshape(T, H, D))
            k = rope(self.mm(h, p + "attn_k.weight").reshape(T, KV, D))
            v = self.mm(h, p + "attn_v.weight").reshape(T, KV, D)
            self.k[i] = k if self.k[i] is None else np.concatenate([self.k[i], k])
            self.v[i] = v if self.v[i] is None else np.concatenate([self.v[i], v])
            o = np.empty((T, H, D))
            for hh in range(H):
                kv = hh // (H // KV)
                s = np.einsum("td,sd->ts", q[:, hh], self.k[i][:, kv]) / np.sqrt(D) + mask
                e = np.exp(s - s.max(-1, keepdims=True))
                o[:, hh] = np.einsum("ts,sd->td", e / e.sum(-1, keepdims=True), self.v[i][:, kv])
            x = x + self.mm(o.reshape(T, H * D), p + "attn_output.weight")
            h = self.norm(x, p + "ffn_norm.weight")
            g, u = self.mm(h, p + "ffn_gate.weight"), self.mm(h, p + "ffn_up.weight")
            x = x + self.mm(g / (1 + np.exp(-g)) * u, p + "ffn_down.weight")
        self.pos += T
        return self.mm(self.norm(x, "output_norm.weight"), self.head)


def _margin(row):
    top = np.sort(row)[-2:]
    return float(top[1] - top[0]) / float(np.abs(row).max())


def choose_prompts(model, seed, max_tries=2000):
    """N_PROMPTS id lists: N_RANDOM random ids, then N_GREEDY greedy steps
    where the reference and the simulation agree, each by >= MARGIN; the
    first such candidates of a seeded stream."""
    rng = np.random.default_rng(seed)
    vocab = model["vals"]["token_embd.weight"].shape[0]
    out = []
    for _ in range(max_tries):
        ids = [int(i) for i in rng.integers(3, vocab, N_RANDOM)]
        ref, sim = Forward(model), Forward(model, act=True)
        lr, ls = ref.run(ids)[-1], sim.run(ids)[-1]
        for _step in range(N_GREEDY):
            nxt = int(lr.argmax())
            if int(ls.argmax()) != nxt or _margin(lr) < MARGIN or _margin(ls) < MARGIN:
                break
            ids.append(nxt)
            lr, ls = ref.run([nxt])[-1], sim.run([nxt])[-1]
        else:
            out.append(np.array(ids, dtype=np.int32))
            if len(out) == N_PROMPTS:
                return out
    raise AssertionError(f"no {N_PROMPTS} prompts with {N_GREEDY} clear greedy steps in {max_tries} tries")


# ----------------------------------------------------------- models, runs
class IQModels:
    """Builds each file on first use (seeded per file), with its prompts and
    the reference / simulated logits; caches the engine's embedded runs."""

    def __init__(self, root):
        self.root = root
        self.models = {}
        self.runs = {}

    def __call__(self, name):
        if name not in self.models:
            src, plan = FILES[name]
            idx = sorted(FILES).index(name)
            path = self.root / name
            vals, types, hp = build(fixture_path(src), path, plan, np.random.default_rng(SEED + idx))
            m = {"path": path, "vals": vals, "types": types, "hp": hp}
            m["prompts"] = choose_prompts(m, SEED + 100 + idx)
            m["ref"] = [Forward(m).run(ids) for ids in m["prompts"]]
            m["sim"] = [Forward(m, act=True).run(ids) for ids in m["prompts"]]
            self.models[name] = m
        return self.models[name]

    def logits(self, name, p, precision, mode, tmp_path):
        key = (name, p, precision, mode)
        if key not in self.runs:
            m = self(name)
            self.runs[key] = engine_logits(m["path"], m["prompts"][p], tmp_path, precision=precision, mode=mode)
        return self.runs[key]


@pytest.fixture(scope="module")
def iq(tmp_path_factory):
    return IQModels(tmp_path_factory.mktemp("iquant"))


def _rms(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def _greedy_ok(lg, ids):
    """The arg max after each prefix of the greedy part is the next id."""
    return np.array_equal(lg[N_RANDOM - 1:-1].argmax(-1), ids[N_RANDOM:])


# ------------------------------------------------------------------- tests
def test_files_are_what_they_claim(iq):
    """Every planned tensor has its i-quant type and values of the replaced
    weight's rms (within 10%), and the logits are of a sane size (the tied
    head's ~6x the others', as for the k-quant tied file)."""
    for name in ("iq_iq1_m.gguf", "iq_iq3_s.gguf", "iq_mixed.gguf", "iq_tied.gguf"):
        m = iq(name)
        src, plan = FILES[name]
        orig = {t.name: t for t in gguf.GGUFReader(str(fixture_path(src))).tensors}
        got = {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(str(m["path"])).tensors}
        assert set(got) == set(orig)
        for tensor, t in plan.items():
            assert got[tensor] == t, (name, tensor, got[tensor])
            o = orig[tensor]
            rms_o = np.sqrt(np.mean(gguf.quants.dequantize(np.array(o.data), o.tensor_type).astype(np.float64) ** 2))
            ratio = np.sqrt(np.mean(m["vals"][tensor].astype(np.float64) ** 2)) / rms_o
            assert 0.9 < ratio < 1.1, (name, tensor, ratio)
        ref = np.concatenate(m["ref"])
        print(f"{name}: max |logit| {np.abs(ref).max():.1f}, std {ref.std():.2f}")
        assert np.all(np.isfinite(ref)) and 3 < np.abs(ref).max() < 100, np.abs(ref).max()


@pytest.mark.parametrize("name", sorted(FILES))
def test_f32_matches_reference(name, iq, tmp_path):
    """--precision f32 (the i-quants dequantized at load by ie_iq_decode)
    against the numpy forward on gguf.quants' values."""
    m = iq(name)
    for p, ids in enumerate(m["prompts"]):
        lg = iq.logits(name, p, "f32", "prefill", tmp_path)
        worst = float(row_rel_err(lg, m["ref"][p]).max())
        print(f"{name} f32 prompt {p}: max rel {worst:.3e}")
        assert worst <= TOL_F32, f"{name} f32 prompt {p}: max rel {worst:.3e} > {TOL_F32}"
        assert _greedy_ok(lg, ids), f"{name} f32 prompt {p}: greedy ids differ from the reference's"


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("name", sorted(FILES))
def test_native_matches_simulation(name, mode, iq, tmp_path):
    """Native (i-quant blocks x Q8_K activations): close to the simulation,
    within the activation rounding's own distance of the engine's f32 run,
    and the same greedy ids as f32."""
    m = iq(name)
    for p, ids in enumerate(m["prompts"]):
        nat = iq.logits(name, p, "native", mode, tmp_path)
        f32 = iq.logits(name, p, "f32", "prefill", tmp_path)
        sim, ref = m["sim"][p], m["ref"][p]
        s_max, s_rms = float(row_rel_err(nat, sim).max()), _rms(nat, sim)
        sim_max, sim_rms = float(row_rel_err(sim, ref).max()), _rms(sim, ref)
        n_max, n_rms = float(row_rel_err(nat, f32).max()), _rms(nat, f32)
        msg = (f"{name} {mode} prompt {p}: native vs simulation rel {s_max:.3e} rms {s_rms:.3e}; "
               f"native vs f32 rel {n_max:.3e} rms {n_rms:.3e} (simulated {sim_max:.3e} / {sim_rms:.3e})")
        print(msg)
        assert s_max <= SIM_MAX and s_rms <= SIM_RMS, msg
        assert n_max <= NAT_SLACK * sim_max + NAT_ABS_MAX, msg
        assert n_rms <= NAT_SLACK * sim_rms + NAT_ABS_RMS, msg
        assert _greedy_ok(nat, ids), msg + ": greedy ids differ from f32's"


# ------------------------------------------------------------------ plans
def _plan_logits(path, ids, plan, precision, tmp_path):
    out = tmp_path / f"plan_{plan.replace(':', '_')}_{precision}.f32"
    cp = run_cli(["logits", "--model", path, "--ids", ",".join(map(str, ids)), "--mode", "decode",
                  "--threads", THREADS, "--plan", plan, "--precision", precision, "--out", out])
    assert cp.returncode == 0, f"--plan {plan}: exit {cp.returncode}\n{cp.stderr[-2000:]}"
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


@pytest.mark.parametrize("plan", ["tensor:2", "pipeline:2"])
def test_plans_on_mixed(plan, iq, tmp_path):
    """The mixed file (i-quant q/k/v, MLP and head cut by rows; ffn_down's
    512 columns cut at 256, a block boundary; attn_output in 32-element
    types): pipeline gives the embedded bits, tensor ranks reorder sums."""
    name = "iq_mixed.gguf"
    m = iq(name)
    ids = m["prompts"][0]
    for precision, tol in (("native", SIM_MAX), ("f32", TOL_F32)):
        a = _plan_logits(m["path"], ids, "none", precision, tmp_path)
        b = _plan_logits(m["path"], ids, plan, precision, tmp_path)
        if plan.startswith("pipeline"):
            assert np.array_equal(a, b), precision
        else:
            err = float(row_rel_err(b, a).max())
            print(f"{plan} {precision}: rel {err:.3e} vs embedded")
            assert err <= tol, (precision, err)
        assert _greedy_ok(b, ids), f"{plan} {precision}: greedy ids differ"


@pytest.mark.parametrize("name", sorted(set(FILES) - {"iq_mixed.gguf"}))
def test_pipeline_every_file(name, iq, tmp_path):
    m = iq(name)
    ids = m["prompts"][0]
    a = iq.logits(name, 0, "native", "decode", tmp_path)
    assert np.array_equal(a, _plan_logits(m["path"], ids, "pipeline:2", "native", tmp_path)), name


@pytest.mark.parametrize("t", ["iq1_m", "iq3_xxs"])
def test_tensor_plan_refuses_cutting_blocks(t, iq, tmp_path):
    """2 ranks would cut attn_output's 256 columns (one i-quant block) at 128."""
    m = iq(f"iq_{t}.gguf")
    cp = run_cli(["logits", "--model", m["path"], "--ids", "5,6", "--plan", "tensor:2", "--out", tmp_path / "x.f32"])
    assert cp.returncode == EXIT_USAGE, (cp.returncode, cp.stderr)
    for w in (f"blk.0.attn_output.weight ({t}, blocks of 256)", "at 128", "tensor:N for N in {1}"):
        assert w in cp.stderr, (w, cp.stderr)


# ------------------------------------------------------------ bad files
def _tensor_info(path):
    """name -> (absolute data offset, type name, [rows, cols])."""
    r = gguf.GGUFReader(str(path))
    return {t.name: (int(t.data_offset), t.tensor_type.name.lower(), [int(x) for x in reversed(t.shape.tolist())])
            for t in r.tensors}


def _corrupt_d(src, dst, tensor, block, h):
    """Copy src to dst with block `block` of tensor's d set to the f16 bits h."""
    shutil.copyfile(src, dst)
    off, t, shape = _tensor_info(src)[tensor]
    _, bb, _ = IQ[t]
    with open(dst, "r+b") as f:
        f.seek(off + block * bb)
        blk = np.frombuffer(f.read(bb), dtype=np.uint8).copy().reshape(1, bb)
        set_iq_d(t, blk, [h])
        f.seek(off + block * bb)
        f.write(blk.tobytes())
    per_row = shape[1] // 256
    return t, block // per_row, 256 * (block % per_row)


def _expect_model_error(path, tmp_path, *words, precision="native"):
    cp = run_cli(["logits", "--model", path, "--ids", "5,6,7", "--precision", precision,
                  "--out", tmp_path / "x.f32"])
    assert cp.returncode == EXIT_MODEL, (cp.returncode, cp.stderr)
    assert cp.stdout == ""
    for w in words:
        assert w in cp.stderr, (w, cp.stderr)


@pytest.mark.parametrize("t,tensor,block,h", [
    ("iq1_s", "blk.0.attn_q.weight", 0, F16_NAN),
    ("iq1_m", "blk.1.ffn_down.weight", 511, F16_INF),     # last block, row 255 columns 256..511
    ("iq1_m", "blk.0.attn_output.weight", 7, 0xFC01),     # -NaN: every nibble of d matters
    ("iq2_xxs", "token_embd.weight", 511, F16_NAN),        # the embedding (lookups only)
    ("iq2_xs", "output.weight", 100, F16_NINF),            # the head
    ("iq2_s", "blk.1.attn_k.weight", 127, F16_NAN),
    ("iq3_xxs", "blk.0.ffn_gate.weight", 300, F16_INF),
    ("iq3_s", "blk.1.attn_v.weight", 5, F16_NAN),
])
def test_nonfinite_scale_refused(t, tensor, block, h, iq, tmp_path):
    bad = tmp_path / "bad.gguf"
    typ, row, c0 = _corrupt_d(iq(f"iq_{t}.gguf")["path"], bad, tensor, block, h)
    assert typ == t
    _expect_model_error(bad, tmp_path, f"tensor '{tensor}' ({t})", "NaN or infinite scale",
                        f"in block {block} (row {row}, columns {c0}..{c0 + 255})")


@pytest.mark.parametrize("precision", ["f32", "int8w"])
def test_nonfinite_scale_refused_in_every_precision(precision, iq, tmp_path):
    bad = tmp_path / "bad.gguf"
    _corrupt_d(iq("iq_mixed.gguf")["path"], bad, "blk.0.ffn_up.weight", 33, F16_NAN)  # iq1_m
    _expect_model_error(bad, tmp_path, "'blk.0.ffn_up.weight'", "NaN or infinite scale", precision=precision)


@pytest.mark.parametrize("t", ["iq3_s", "iq1_m"])
def test_truncated_tensor_refused(t, iq, tmp_path):
    """The file ends 100 bytes into the last block of output.weight, the last tensor."""
    src = iq(f"iq_{t}.gguf")["path"]
    info = _tensor_info(src)
    off, typ, shape = info["output.weight"]
    assert typ == t and off == max(v[0] for v in info.values())
    end = off + shape[0] * shape[1] // 256 * IQ[t][1]
    assert end == src.stat().st_size
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(src.read_bytes()[:end - 100])
    _expect_model_error(bad, tmp_path, "'output.weight'", "past end of file")


# --------------------------------------------------------------- ie-convert
def test_convert_to_f32_is_gguf_quants(iq, tmp_path):
    """ie-convert of the mixed file to f32 (ROWS): every i-quant tensor is
    gguf.quants' dequantization bit for bit, and the IEBIN runs to the
    GGUF's f32 logits bit for bit."""
    from test_convert import convert_ok, model_json, write_manifest
    m = iq("iq_mixed.gguf")
    out = tmp_path / "f32"
    convert_ok(["--in", m["path"], "--out-dir", out, "--quiet", "--pretranspose", "none", "--q4-map",
                write_manifest(tmp_path / "f32.json", {"version": 1, "rules": [{"pattern": ".", "dtype": "f32"}]})])
    blob = np.fromfile(out / "model.ie.bin", dtype=np.uint8)
    seen = set()
    for t in model_json(out)["tensors"]:
        src = t.get("quant", {}).get("from")
        if src not in IQ:
            continue
        assert t["dtype"] == "f32" and t["layout"] == "rows", t
        got = blob[t["offset"]:t["offset"] + t["size"]].view("<f4").reshape(m["vals"][t["name"]].shape)
        assert np.array_equal(got.view(np.uint32), m["vals"][t["name"]].view(np.uint32)), t["name"]
        seen.add(src)
    assert seen == set(TYPES), seen
    ids = m["prompts"][0]
    assert np.array_equal(engine_logits(out, ids, tmp_path, precision="f32"),
                          iq.logits("iq_mixed.gguf", 0, "f32", "prefill", tmp_path))


@pytest.mark.parametrize("name", ["iq_mixed.gguf", "iq_tied.gguf"])
def test_convert_keep_is_the_gguf(name, iq, tmp_path):
    """ie-convert with every tensor kept: the i-quants stay ROWS blocks in
    the IEBIN, which runs to the GGUF's logits bit for bit (native, f32)."""
    from test_convert import convert_ok, model_json, write_manifest
    m = iq(name)
    out = tmp_path / "keep"
    convert_ok(["--in", m["path"], "--out-dir", out, "--quiet",
                "--q4-map", write_manifest(tmp_path / "keep.json", {"version": 1, "rules": []})])
    kept = {t["name"]: (t["dtype"], t["layout"]) for t in model_json(out)["tensors"]}
    for tensor, t in FILES[name][1].items():
        assert kept[tensor] == (t, "rows"), (tensor, kept[tensor])
    for prec in ("native", "f32"):
        a = iq.logits(name, 0, prec, "prefill", tmp_path)
        assert np.array_equal(engine_logits(out, m["prompts"][0], tmp_path, precision=prec), a), prec
