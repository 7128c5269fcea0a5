"""Structured output (docs/HTTP.md, response_format): `inference-engine serve`
on SmolLM2-135M-Instruct, driven by the official openai client.

For four schemas (a nested object with an enum and an array, integers with
ranges, anyOf, a recursive $ref) 100 generations in all at temperature 1.0
with different seeds; every one must end by itself (finish_reason "stop")
and its text must parse and validate with the `jsonschema` package. A model
this small does not produce such JSON unprompted, so without the token mask
(coordinator/src/grammar.c, applied in sched.c) these fail. json_object
outputs must parse as objects; unsupported or malformed schemas are 400
with param "response_format" and a message naming the keyword. The mean
mask time per step (ie_stage_seconds{stage="grammar"}) is printed.
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from conftest import REPO, free_port
from test_http_api import Server, assert_error_shape, metric_value, raw

sys.path.insert(0, str(REPO / "apps" / "clients"))
import ie_client  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "role": {"enum": ["engineer", "artist", "doctor", "farmer"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "role", "address", "skills"],
    "additionalProperties": False,
}

INTEGERS = {
    "type": "object",
    "properties": {
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "month": {"type": "integer", "minimum": 1, "maximum": 12},
        "temps": {"type": "array", "items": {"type": "integer", "minimum": -40, "maximum": 50},
                  "minItems": 2, "maxItems": 5},
        "delta": {"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 10},
    },
    "required": ["year", "month", "temps", "delta"],
    "additionalProperties": False,
}

SHAPES = {
    "anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number"}},
         "required": ["kind", "radius"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "integer"},
                                          "h": {"type": "integer"}},
         "required": ["kind", "w", "h"], "additionalProperties": False},
        {"type": "array", "items": {"type": ["string", "null"], "maxLength": 12}, "maxItems": 3},
    ]
}

# $ref: a root whose children are $ref'd nodes, whose children are $ref'd
# leaves (three levels, so a small model cannot nest without end; the
# recursive case, a node whose items $ref the node itself, is in
# tests/unit/test_grammar.c)
TREE = {
    "$defs": {
        "leaf": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 12}},
                 "required": ["label"], "additionalProperties": False},
        "node": {
            "type": "object",
            "properties": {
                "label": {"type": "string", "maxLength": 12},
                "children": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "maxItems": 2},
            },
            "required": ["label"],
            "additionalProperties": False,
        },
    },
    "type": "object",
    "properties": {
        "family": {"type": "string", "maxLength": 16},
        "members": {"type": "array", "items": {"$ref": "#/definitions/member"}, "minItems": 1, "maxItems": 2},
    },
    "definitions": {"member": {"$ref": "#/$defs/node"}},
    "required": ["family", "members"],
    "additionalProperties": False,
}

CASES = [
    ("person", PERSON, "Describe a person as JSON."),
    ("integers", INTEGERS, "Give a date and some temperatures as JSON."),
    ("shapes", SHAPES, "Describe a shape as JSON."),
    ("tree", TREE, "Write a small family tree as JSON."),
]
N_PER_SCHEMA = 25  # 100 in all
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def server(smollm2, ie_bin):
    zmq_ep = f"tcp://127.0.0.1:{free_port()}"
    s = Server(smollm2, "--batch", 4, "--ctx", 1024, "--queue", 64, "--zmq-bind", zmq_ep)
    s.zmq_ep = zmq_ep
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def fmt(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def chat(client, server, prompt, rf, seed, temperature=1.0, **kw):
    return client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": prompt}], temperature=temperature, seed=seed,
        max_tokens=MAX_TOKENS, response_format=rf, **kw)


def test_schemas_validate(server, client):
    jobs = [(name, schema, prompt, 1000 * i + k) for i, (name, schema, prompt) in enumerate(CASES)
            for k in range(N_PER_SCHEMA)]

    def one(job):
        name, schema, prompt, seed = job
        r = chat(client, server, prompt, fmt(name, schema), seed)
        return job, r.choices[0].finish_reason, r.choices[0].message.content

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(one, jobs))
    assert len(results) == 100
    bad = []
    for (name, schema, _, seed), finish, text in results:
        try:
            assert finish == "stop", f"finish_reason {finish}"
            jsonschema.validate(json.loads(text), schema)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            bad.append((name, seed, str(e)[:200], text[:300]))
    assert not bad, f"{len(bad)} of 100 outputs invalid, e.g. {bad[:3]}"
    # every schema produced more than one distinct answer (sampling is live)
    for name, *_ in CASES:
        assert len({t for (n, *_), _, t in results if n == name}) > 1, name
    m = raw(server, "GET", "/metrics").text
    total, count = (metric_value(m, f"ie_stage_seconds_{k}", 'stage="grammar"') for k in ("sum", "count"))
    assert count > 0
    print(f"\nmask time per step (all constrained rows of a step): {1e3 * total / count:.2f} ms over {int(count)} steps "
          f"(SmolLM2, 49152 tokens)")


def test_completions_and_stream(server, client):
    """The completions endpoint and streaming take response_format too."""
    r = client.completions.create(model=server.model, prompt="A person as JSON:", temperature=1.0, seed=7,
                                  max_tokens=MAX_TOKENS, extra_body={"response_format": fmt("p", PERSON)})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    parts = []
    for ev in chat(client, server, "Numbers as JSON.", fmt("i", INTEGERS), 8, stream=True):
        if ev.choices and ev.choices[0].delta.content:
            parts.append(ev.choices[0].delta.content)
    jsonschema.validate(json.loads("".join(parts)), INTEGERS)


def test_json_object(server, client):
    # any object: keys and strings are unbounded, and at temperature 1 this
    # model may ramble past max_tokens inside one, so a cooler sampler here
    for seed in range(6):
        r = chat(client, server, 'Reply with a JSON object like {"greeting": "hello"}.', {"type": "json_object"},
                 seed, temperature=0.5)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=8, response_format={"type": "text"})
    assert r.choices[0].message.content is not None


@pytest.mark.parametrize("rf,word", [
    (fmt("x", {"type": "string", "pattern": "a+"}), "pattern"),
    (fmt("x", {"type": "string", "format": "email"}), "format"),
    (fmt("x", {"if": {"type": "string"}, "then": {}}), "if"),
    (fmt("x", {"not": {"type": "null"}}), "not"),
    (fmt("x", {"type": "number", "minimum": 0}), "minimum"),
    (fmt("x", {"$ref": "#/$defs/missing"}), "$ref"),
    (fmt("x", {"type": "objet"}), "type"),
    (fmt("x", {"enum": []}), "enum"),
    (fmt("x", {"properties": {"a": {"$ref": "#"}}, "required": ["a"]}), "no finite"),
    (fmt("x", "not a schema"), "schema"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema"}, "json_schema"),
    ("json", "response_format"),
])
def test_bad_schema_400(server, rf, word):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "response_format": rf}
    e = assert_error_shape(raw(server, "POST", "/v1/chat/completions", json=body), 400, param="response_format")
    assert word in e["message"], e
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(model=server.model, messages=body["messages"], max_tokens=4,
                                                response_format=rf)


def zmq_generate(server, **params):
    m = ie_client.build_request(messages=[{"role": "user", "content": "Numbers as JSON."}], **params)
    with ie_client.Connection(server.zmq_ep) as c:
        c.send(m)
        rep = c.recv(180)
    assert rep.get("id") == m["id"], rep
    return rep


def test_zmq_json_schema(server):
    """The ZeroMQ request's "json_schema" field (docs/PROTOCOL.md)."""
    rep = zmq_generate(server, max_new=MAX_TOKENS, temperature=1.0, seed=5, json_schema=json.dumps(INTEGERS))
    assert rep["type"] == "done" and rep["finish"] != "length", rep
    jsonschema.validate(json.loads(rep["text"]), INTEGERS)
    rep = zmq_generate(server, max_new=MAX_TOKENS, temperature=0.5, seed=5, json_schema="")
    assert rep["type"] == "done", rep
    assert isinstance(json.loads(rep["text"]), dict)
    rep = zmq_generate(server, max_new=8, json_schema=json.dumps({"type": "string", "pattern": "x"}))
    assert rep["type"] == "error" and rep["code"] == "invalid_request" and "pattern" in rep["message"], rep


# ------------------------------------------------- vLLM's guided outputs
CHOICES = ["Paris", "London", "Rome", "a city far away"]


@pytest.mark.parametrize("how", ["guided_choice", "structured_outputs"])
def test_guided_choice(server, client, how):
    """vLLM's guided_choice (and structured_outputs {"choice"}): sampled at
    temperature 1 with 12 seeds, every answer is one of the strings exactly
    and ends by itself; a model this small strays without the mask."""
    body = {"guided_choice": CHOICES} if how == "guided_choice" else {"structured_outputs": {"choice": CHOICES}}
    seen = set()
    for seed in range(12):
        r = client.completions.create(model=server.model, prompt="The best city to visit is", max_tokens=16,
                                      temperature=1.0, seed=seed, extra_body=body)
        c = r.choices[0]
        assert c.text in CHOICES and c.finish_reason == "stop", c
        seen.add(c.text)
    assert len(seen) >= 2, seen                                     # sampled, not one forced answer
    free = [client.completions.create(model=server.model, prompt="The best city to visit is", max_tokens=8,
                                      temperature=1.0, seed=s).choices[0].text for s in range(4)]
    assert not all(t in CHOICES for t in free), free


def test_guided_json(server, client):
    """guided_json (an object or its text) and structured_outputs {"json"}:
    the answer validates against the schema, as with response_format."""
    for body in ({"guided_json": INTEGERS}, {"guided_json": json.dumps(INTEGERS)},
                 {"structured_outputs": {"json": INTEGERS}}):
        r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "A date."}],
                                           max_tokens=200, temperature=1.0, seed=3, extra_body=body)
        assert r.choices[0].finish_reason == "stop", r
        jsonschema.validate(json.loads(r.choices[0].message.content), INTEGERS)


@pytest.mark.parametrize("body,param", [
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a"] * 17}, "guided_choice"),
    ({"guided_choice": ["a", ""]}, "guided_choice"),
    ({"guided_choice": "a"}, "guided_choice"),
    ({"guided_json": 5}, "guided_json"),
    ({"guided_json": {"type": "string", "pattern": "x"}}, "guided_json"),
    ({"guided_json": {"type": "object"}, "guided_choice": ["a"]}, "guided_choice"),
    ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice"),
    ({"structured_outputs": {"choice": ["a"]}, "guided_choice": ["b"]}, "structured_outputs"),
    ({"structured_outputs": 3}, "structured_outputs"),
])
def test_bad_guided_400(server, body, param):
    r = raw(server, "POST", "/v1/completions", json={"model": server.model, "prompt": "x", "max_tokens": 2, **body})
    e = assert_error_shape(r, 400, param=param)
    if "pattern" in json.dumps(body):
        assert "'pattern'" in e["message"], e
