"""POST /v1/embeddings (docs/HTTP.md, "Embeddings").

Servers run the tiny Llama fixture (tests/data/tiny_llama) at --precision
f32; the reference is tests/data/embed/ref.npz (tests/reference/
gen_embed_ref.py: transformers' final-norm hidden states of four id
sequences, pooled mean / last / cls and L2-normalized, and the raw mean).
The client is the official `openai` package (httpx for what it cannot send).

Checked: each pooling within 1e-4 (relative to the vector's largest entry)
of transformers', the raw mean with --embd-normalize -1 too; the same from
the cluster plans pipeline:2 and tensor:2 (in-process ranks over ZeroMQ:
node.c's hidden-state frame, cluster.c's merge) and equal to the embedded
engine within 1e-5, and from ie-coordinator with two ie-worker processes; base64 decodes to the float vector bit for bit; a batch
keeps order and indexes; usage counts the input tokens; bad inputs (empty,
wrong types, ids out of range, too long, dimensions, bad encoding_format,
unknown model) are 400 / 404 in OpenAI's error shape; generation requests
running beside a stream of embedding requests give their solo outputs, and
an embedding of a prompt the prefix cache holds is still computed whole.
"""
from __future__ import annotations

import base64
import json
import struct
import subprocess
import threading
import time
import urllib.request

import numpy as np
import openai
import pytest

try:
    import httpx
except ImportError:
    import httpx2 as httpx

from conftest import IE_BIN, fixture_path, free_port
from test_distributed import clusters, start_cluster  # noqa: F401  (the fixture)
from test_http_api import KEY, Server, assert_error_shape

TOL = 1e-4


@pytest.fixture(scope="module")
def ref():
    return np.load(fixture_path("embed/ref.npz"))


@pytest.fixture(scope="module")
def tiny():
    return fixture_path("tiny_llama")


def ids_of(ref):
    return [ref[f"ids_{k}"].tolist() for k in range(4)]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def serve(model, *extra):
    return Server(model, "--precision", "f32", "--batch", 4, *extra)


def embed_all(client, inputs, **kw):
    kw.setdefault("encoding_format", "float")  # the client's own default is base64
    r = client.embeddings.create(model="tiny_llama", input=inputs, **kw)
    assert r.object == "list"
    assert [d.index for d in r.data] == list(range(len(r.data)))
    assert all(d.object == "embedding" for d in r.data)
    return r


@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
def test_pooling_matches_transformers(pooling, tiny, ref):
    s = serve(tiny, "--pooling", pooling)
    try:
        c = s.client()
        ids = ids_of(ref)
        r = embed_all(c, ids)
        assert len(r.data) == 4
        for k, d in enumerate(r.data):
            v = np.array(d.embedding, np.float32)
            assert v.shape == (64,)
            assert rel(v, ref[f"{pooling}_{k}"]) < TOL, (k, rel(v, ref[f"{pooling}_{k}"]))
            assert abs(np.linalg.norm(v) - 1) < 1e-5
        assert r.usage.prompt_tokens == sum(map(len, ids)) == r.usage.total_tokens
        # one input alone (a bare list of ids) is the same vector
        one = embed_all(c, ids[2])
        assert len(one.data) == 1 and one.usage.prompt_tokens == len(ids[2])
        assert rel(one.data[0].embedding, ref[f"{pooling}_2"]) < TOL
    finally:
        s.stop()


def test_raw_mean_without_normalization(tiny, ref):
    s = serve(tiny, "--embd-normalize", -1)
    try:
        r = embed_all(s.client(), ids_of(ref))
        for k, d in enumerate(r.data):
            assert rel(d.embedding, ref[f"mean_raw_{k}"]) < TOL, k
    finally:
        s.stop()


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_plans_match_embedded(pooling, tiny, ref):
    ids = ids_of(ref)
    got = {}
    for plan in ("none", "pipeline:2", "tensor:2"):
        s = serve(tiny, "--pooling", pooling, "--plan", plan)
        try:
            r = embed_all(s.client(), ids)
            got[plan] = np.array([d.embedding for d in r.data], np.float32)
            assert r.usage.prompt_tokens == sum(map(len, ids))
        finally:
            s.stop()
    for plan in ("pipeline:2", "tensor:2"):
        for k in range(4):
            assert rel(got[plan][k], ref[f"{pooling}_{k}"]) < TOL, (plan, k)
            assert rel(got[plan][k], got["none"][k]) < 1e-5, (plan, k)


@pytest.fixture(scope="module")
def server(tiny):
    s = serve(tiny, "--ctx", 32, "--queue", 8)
    yield s
    s.stop()


def test_base64_batch_order_usage(server):
    c = server.client()
    texts = ["hello world", "the cat sat on the mat", "x", "hello world"]
    f = embed_all(c, texts)
    b = embed_all(c, texts, encoding_format="base64")
    assert len(f.data) == len(b.data) == 4
    for df, db in zip(f.data, b.data):
        # asked for base64, the client hands the string over as it came:
        # little-endian f32, bit for bit the float answer
        assert isinstance(db.embedding, str)
        v = np.frombuffer(base64.b64decode(db.embedding), "<f4")
        assert np.array_equal(v, np.array(df.embedding, np.float32))
    # the wire, without the client: base64 of 64 little-endian f32
    r = httpx.post(server.url + "/v1/embeddings", json={"input": texts[:1], "encoding_format": "base64"},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert len(raw) == 64 * 4
    assert np.array_equal(np.array(struct.unpack("<64f", raw), np.float32), np.array(f.data[0].embedding, np.float32))
    # without encoding_format the client asks for base64 itself and decodes it
    d = c.embeddings.create(model="tiny_llama", input=texts[:1]).data[0].embedding
    assert isinstance(d, list) and np.array_equal(np.array(d, np.float32), np.array(f.data[0].embedding, np.float32))
    # order: reversed inputs come back reversed; equal inputs, equal vectors
    rv = embed_all(c, texts[::-1])
    for i, d in enumerate(rv.data):
        assert np.array_equal(np.array(d.embedding, np.float32), np.array(f.data[3 - i].embedding, np.float32))
    assert f.data[0].embedding == f.data[3].embedding
    assert f.data[0].embedding != f.data[1].embedding
    # usage: the sum of the inputs' own counts
    singles = [embed_all(c, t).usage.prompt_tokens for t in texts]
    assert f.usage.prompt_tokens == sum(singles) == f.usage.total_tokens
    assert all(n >= 1 for n in singles)
    # more inputs than the queue holds (--queue 8): submitted as it drains
    many = embed_all(c, [[1, 5 + i] for i in range(40)])
    assert len(many.data) == 40 and many.usage.prompt_tokens == 80
    assert many.data[0].embedding == embed_all(c, [[1, 5]]).data[0].embedding


@pytest.mark.parametrize("body,param,code", [
    ({"input": ""}, "input", None),
    ({"input": []}, "input", None),
    ({"input": [[]]}, "input", None),
    ({"input": ["a", ""]}, "input", None),
    ({"input": [1, "a"]}, "input", None),
    ({"input": ["a", [1, 2]]}, "input", None),
    ({"input": [[1, 2], "a"]}, "input", None),
    ({"input": 3.5}, "input", None),
    ({"input": {"a": 1}}, "input", None),
    ({"input": None}, "input", None),
    ({}, "input", None),
    ({"input": [1, 512]}, "input", None),
    ({"input": [1, -1]}, "input", None),
    ({"input": [1, 2.5]}, "input", None),
    ({"input": [[1, 2], [3, True]]}, "input", None),
    ({"input": list(range(1, 34))}, "input", "context_length_exceeded"),
    ({"input": ["a", list(range(1, 34))]}, "input", None),
    ({"input": "word " * 40}, "input", "context_length_exceeded"),
    ({"input": "a", "dimensions": 8}, "dimensions", None),
    ({"input": "a", "encoding_format": "hex"}, "encoding_format", None),
    ({"input": "a", "encoding_format": 1}, "encoding_format", None),
    ({"input": "a", "model": 7}, "model", None),
    ({"input": [[1]] * 2049}, "input", None),
])
def test_bad_inputs(server, body, param, code):
    r = httpx.post(server.url + "/v1/embeddings", json=body, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=60)
    assert_error_shape(r, 400, code=code, param=param)


def test_bad_inputs_through_the_client(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError):
        c.embeddings.create(model="tiny_llama", input="hello", dimensions=16)
    with pytest.raises(openai.NotFoundError):
        c.embeddings.create(model="no-such-model", input="hello")
    r = httpx.post(server.url + "/v1/embeddings", content=b"{not json", timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert_error_shape(r, 400, code="invalid_json")
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "a\u0000b"}, timeout=60,
                   headers={"Authorization": f"Bearer {KEY}"})
    assert_error_shape(r, 400)
    r = httpx.get(server.url + "/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert_error_shape(r, 405)
    # the server still serves
    assert len(embed_all(c, "fine").data) == 1


def post_json(server, path, body):
    """POST body to the server with the standard library alone (see below)."""
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_generation_beside_embeddings(server, ref):
    """Greedy generations running while embedding requests come and go give
    their solo outputs; an embedding of a prompt whose blocks the prefix
    cache holds is computed whole (equal to transformers').
    The concurrent requests go through urllib, not the openai client: that
    client's Python machinery in several threads at once hit CPython 3.11's
    thread-unsafe AST constructor (SystemError "AST constructor recursion
    depth mismatch", python/cpython#106905) in full-suite runs, a client-side
    failure that says nothing about the server."""
    c = server.client()
    prompts = [ref["ids_2"].tolist(), [1, 9, 8, 7], [1, 300, 301]]

    def gen(p):
        r = c.completions.create(model="tiny_llama", prompt=p, max_tokens=12, temperature=0)
        return r.choices[0].text, r.usage.completion_tokens

    def gen_raw(p):
        r = post_json(server, "/v1/completions", {"model": "tiny_llama", "prompt": p, "max_tokens": 12,
                                                  "temperature": 0})
        return r["choices"][0]["text"], r["usage"]["completion_tokens"]

    def embed_raw(inputs):
        r = post_json(server, "/v1/embeddings", {"model": "tiny_llama", "input": inputs, "encoding_format": "float"})
        assert [d["index"] for d in r["data"]] == list(range(len(inputs)))
        return [d["embedding"] for d in r["data"]]

    solo = [gen(p) for p in prompts]
    alone = embed_all(c, ids_of(ref)).data
    assert [gen_raw(p) for p in prompts[:1]] == solo[:1]  # the two clients agree
    out, errs = [None] * len(prompts), []

    def run_gen(i):
        try:
            out[i] = gen_raw(prompts[i])
        except Exception as e:  # noqa: BLE001 (reported below)
            errs.append(e)

    emb = []

    def run_emb():
        try:
            for _ in range(4):
                emb.append(embed_raw(ids_of(ref)))
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    ts = [threading.Thread(target=run_gen, args=(i,)) for i in range(len(prompts))]
    ts += [threading.Thread(target=run_emb) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errs, errs
    assert out == solo
    assert len(emb) == 8
    for data in emb:
        for k, d in enumerate(data):
            assert rel(d, alone[k].embedding) < 1e-5, k
    # ids_2's first 16 positions are a full KV block the generation above
    # published: the embedding must not take them from the cache
    for k in range(4):
        assert rel(alone[k].embedding, ref[f"mean_{k}"]) < TOL, k
    again = embed_all(c, [ref["ids_2"].tolist()]).data[0].embedding
    assert rel(again, ref["mean_2"]) < TOL


@pytest.mark.parametrize("plan", ["pipeline", "tensor"])
def test_process_cluster(plan, tiny, ref, clusters, tmp_path):
    """ie-coordinator --http-port with two ie-worker processes: the
    hidden-state rows cross real sockets (RESULT's extra frame)."""
    port = free_port()
    c = start_cluster(clusters, tiny, plan, 2, tmp_path / "logs",
                      coord_extra=["--precision", "f32", "--http-port", str(port), "--pooling", "last"])
    for i in range(2):
        c.start_worker(i)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert c.coord.poll() is None, c.log()
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    else:
        pytest.fail(f"cluster not ready\n{c.log()}", pytrace=False)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    r = embed_all(client, ids_of(ref))
    for k, d in enumerate(r.data):
        assert rel(d.embedding, ref[f"last_{k}"]) < TOL, (plan, k)
    assert r.usage.prompt_tokens == sum(map(len, ids_of(ref)))


def test_cli_embed_mode(server, tiny):
    """`inference-engine embed`: one JSON line per stdin line, in order, the
    server's vectors; bad lines get an error line in their place."""
    lines = ["hello world", "", "the cat sat on the mat", "word " * 40, "x"]
    cp = subprocess.run([str(IE_BIN), "embed", "--model", str(tiny), "--precision", "f32", "--ctx", "32",
                         "--threads", "1"], input="\n".join(lines) + "\n", capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    out = [json.loads(x) for x in cp.stdout.splitlines()]
    assert [o["index"] for o in out] == list(range(len(lines)))
    assert "error" in out[1] and "error" in out[3] and "context" in out[3]["error"]
    want = embed_all(server.client(), [lines[0], lines[2], lines[4]]).data
    for o, w in zip((out[0], out[2], out[4]), want):
        assert o["tokens"] >= 1
        assert rel(o["embedding"], w.embedding) < 1e-6


def test_adapter_model_is_leased(tiny, ref):
    """`model` naming a LoRA adapter runs the inputs under it (the vectors
    move off the base's, the same on a second call) while the request
    holds the adapter; an unloaded name is 404."""
    qv8 = fixture_path("lora/qv8")
    hdr = {"Authorization": f"Bearer {KEY}"}
    s = serve(tiny, "--lora", f"qv8={qv8}")
    try:
        c = s.client()
        ids = ids_of(ref)
        base = [d.embedding for d in embed_all(c, ids).data]
        kw = {"model": "qv8", "input": ids, "encoding_format": "float"}
        ad1 = [d.embedding for d in c.embeddings.create(**kw).data]
        ad2 = [d.embedding for d in c.embeddings.create(**kw).data]
        assert ad1 == ad2
        assert all(rel(a, b) > 1e-3 for a, b in zip(ad1, base)), [rel(a, b) for a, b in zip(ad1, base)]
        r = httpx.post(s.url + "/v1/unload_lora_adapter", json={"lora_name": "qv8"}, headers=hdr, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.post(s.url + "/v1/embeddings", json={"model": "qv8", "input": "hi"}, headers=hdr, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    finally:
        s.stop()
