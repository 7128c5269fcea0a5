"""Function calling on /v1/chat/completions: tools, tool_choice, tool_calls,
the developer role and assistant content null (docs/HTTP.md, "Tools").

The model is the tiny random Qwen3 (tests/data/tiny_qwen3) in a copy of its
folder with Qwen2.5-7B-Instruct's published chat template beside it
(tests/data/templates/Qwen-Qwen2.5-7B-Instruct.jinja, origin in that
folder's README) and max_position_embeddings raised so a prompt with tool
definitions fits (the weights are random: RoPE takes any position). Clients:
the official `openai` package, and httpx for raw error bodies.

Checked:
  - the prompt the server renders with tools (and with developer /
    content-null / tool-result turns) is the one transformers renders: its
    token count (usage.prompt_tokens) equals the tokenizer's count of the
    committed transformers render (tests/data/templates/tools_expected.json,
    tests/reference/gen_tool_templates.py; the unit test test_tools.c
    compares those renders byte for byte); without tools it is shorter;
  - tool_choice "auto" / "none": a 200 whose message is content or calls,
    and a stream whose content deltas add up to the non-streamed content;
  - "required" and a named function: a parseable call whose arguments
    validate against the function's parameters schema, finish_reason
    "tool_calls", streamed as delta.tool_calls — these need the json_schema
    grammar (helper oai-grammar); until it is merged the server refuses
    response_format json_object and these tests are reported as xfail;
  - 400 in OpenAI's error shape: a tool without a name, parameters that are
    not an object, a duplicate name, tool_choice naming an unknown function
    or given without tools, malformed tool_calls in a message, and tools for
    a model whose template has none (SmolLM2).
"""
from __future__ import annotations

import json
import shutil

import openai
import pytest

from conftest import REPO, fixture_path, run_cli
from test_http_api import Server, assert_error_shape, raw

TEMPLATE = REPO / "tests" / "data" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
EXPECTED = REPO / "tests" / "data" / "templates" / "tools_expected.json"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string", "maxLength": 12},
                                                      "n": {"type": "integer", "minimum": 1, "maximum": 9}},
                   "required": ["q"], "additionalProperties": False}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
# (the random model never ends a string by itself: maxLength bounds the
# forced calls' strings so that they end within max_tokens)


@pytest.fixture(scope="module")
def qwen_tools(tmp_path_factory):
    """tiny_qwen3 + Qwen2.5's chat template (chat_template.jinja)."""
    src = fixture_path("tiny_qwen3")
    d = tmp_path_factory.mktemp("qwen_tools") / "tiny_qwen3_tools"
    d.mkdir()
    for f in src.iterdir():
        if f.name == "config.json":
            cfg = json.loads(f.read_text())
            cfg["max_position_embeddings"] = 4096
            (d / f.name).write_text(json.dumps(cfg))
        elif f.suffix == ".json":
            shutil.copy(f, d / f.name)
        else:
            (d / f.name).symlink_to(f)
    shutil.copy(TEMPLATE, d / "chat_template.jinja")
    return d


@pytest.fixture(scope="module")
def server(qwen_tools, ie_bin):
    s = Server(qwen_tools, "--batch", 2, "--ctx", 2048)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def n_tokens(model_dir, text):
    cp = run_cli(["tokenize", "--tokenizer", str(model_dir / "tokenizer.json"), "--no-bos", "--parse-special"],
                 input_bytes=text.encode())
    assert cp.returncode == 0, cp.stderr
    return len(json.loads(cp.stdout)["ids"])


def expected_cases():
    doc = json.loads(EXPECTED.read_text())
    renders = doc["renders"][TEMPLATE.name]["renders"]
    return {c["name"]: (c, renders[c["name"]]["text"]) for c in doc["cases"]}


def grammar_merged(server) -> bool:
    """Whether json_schema is enforced (oai-grammar): main refuses json_object."""
    r = raw(server, "POST", "/v1/chat/completions",
            json={"model": server.model, "messages": USER, "max_tokens": 1,
                  "response_format": {"type": "json_object"}})
    return r.status_code == 200


@pytest.mark.parametrize("case", ["tools_system", "tools_no_system", "developer", "tool_roundtrip", "two_calls",
                                  "call_with_text"])
def test_prompt_with_tools_equals_transformers(case, server, client, qwen_tools):
    conv, want_text = expected_cases()[case]
    r = client.chat.completions.create(model=server.model, messages=conv["messages"], tools=conv["tools"],
                                       max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == n_tokens(qwen_tools, want_text)
    if case == "tools_system":  # without tools the prompt loses the definitions
        r0 = client.chat.completions.create(model=server.model, messages=conv["messages"], max_tokens=1)
        assert r0.usage.prompt_tokens < r.usage.prompt_tokens - 50


def test_developer_and_content_null_accepted(server, client):
    msgs = [{"role": "developer", "content": "Answer briefly."}, *USER,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    r = client.chat.completions.create(model=server.model, messages=msgs, tools=[WEATHER], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # developer without tools too (mapped to system for this template)
    a = client.chat.completions.create(model=server.model, messages=[msgs[0], *USER], max_tokens=1)
    b = client.chat.completions.create(model=server.model, messages=[{**msgs[0], "role": "system"}, *USER],
                                       max_tokens=1)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_auto_and_none(choice, server, client):
    kw = dict(model=server.model, messages=USER, tools=[WEATHER, SEARCH], tool_choice=choice, max_tokens=24,
              temperature=0)
    r = client.chat.completions.create(**kw)
    m = r.choices[0].message
    if choice == "none":
        assert not m.tool_calls
    if m.tool_calls:  # the random model may write a call: then it must be whole
        assert r.choices[0].finish_reason == "tool_calls"
        for c in m.tool_calls:
            assert c.id.startswith("call_") and c.function.name in ("get_weather", "search")
            json.loads(c.function.arguments)
    else:
        assert isinstance(m.content, str) and r.choices[0].finish_reason in ("stop", "length")
    # streamed: the content deltas add up to the same text, calls come whole
    text, calls, finish = "", [], None
    for ch in client.chat.completions.create(stream=True, **kw):
        d = ch.choices[0].delta
        text += d.content or ""
        calls += d.tool_calls or []
        finish = ch.choices[0].finish_reason or finish
    if m.tool_calls:
        assert [c.function.name for c in calls] == [c.function.name for c in m.tool_calls]
        assert finish == "tool_calls"
    else:
        assert text == m.content and not calls and finish == r.choices[0].finish_reason


def validate(v, schema: dict):
    """The JSON Schema subset the test tools use (type, properties, required,
    additionalProperties false, enum); raises AssertionError."""
    types = {"object": dict, "string": str, "integer": int, "number": (int, float), "boolean": bool,
             "array": list}
    t = schema.get("type")
    if t:
        assert isinstance(v, types[t]) and not (t in ("integer", "number") and isinstance(v, bool)), (v, schema)
    if "enum" in schema:
        assert v in schema["enum"], (v, schema)
    if t == "string" and "maxLength" in schema:
        assert len(v) <= schema["maxLength"], (v, schema)
    if t == "integer":
        assert schema.get("minimum", v) <= v <= schema.get("maximum", v), (v, schema)
    if t == "object":
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            assert k in v, (k, v)
        for k, x in v.items():
            if k in props:
                validate(x, props[k])
            else:
                assert schema.get("additionalProperties", True) is not False, (k, v)


@pytest.mark.parametrize("named", [False, True])
def test_forced_call(named, server, client):
    if not grammar_merged(server):
        pytest.xfail("json_schema constrained decoding (helper oai-grammar) is not merged yet")
    tools = [WEATHER, SEARCH]
    choice = {"type": "function", "function": {"name": "search"}} if named else "required"
    names = set()
    for seed in range(100):  # 100 sampled calls, as issue 21 asks of json_schema outputs
        r = client.chat.completions.create(model=server.model, messages=USER, tools=tools, tool_choice=choice,
                                           max_tokens=200, seed=seed, temperature=1)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        (call,) = ch.message.tool_calls
        assert ch.message.content is None and call.id.startswith("call_") and call.type == "function"
        if named:
            assert call.function.name == "search"
        fn = {t["function"]["name"]: t["function"] for t in tools}[call.function.name]
        validate(json.loads(call.function.arguments), fn["parameters"])
        names.add(call.function.name)
    assert names == ({"search"} if named else {"get_weather", "search"})  # "required" reaches both
    # streamed: one delta.tool_calls chunk with index 0
    chunks = list(client.chat.completions.create(model=server.model, messages=USER, tools=tools,
                                                 tool_choice=choice, max_tokens=200, seed=1, stream=True))
    deltas = [c for ch in chunks for c in (ch.choices[0].delta.tool_calls or [])] if chunks else []
    assert len(deltas) == 1 and deltas[0].index == 0
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


BAD_TOOLS = [
    ("missing name", [{"type": "function", "function": {"description": "x", "parameters": {"type": "object"}}}],
     None, "tools", "name"),
    ("parameters not an object", [{"type": "function", "function": {"name": "f", "parameters": "{}"}}], None,
     "tools", "parameters"),
    ("not a function", [{"type": "code_interpreter"}], None, "tools", "type"),
    ("duplicate", [WEATHER, WEATHER], None, "tools", "both named"),
    ("unknown name", [WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice", "nope"),
    ("bad choice", [WEATHER], "sometimes", "tool_choice", "tool_choice"),
    ("choice without tools", None, "required", "tool_choice", "tools"),
]


@pytest.mark.parametrize("what,tools,choice,param,needle", BAD_TOOLS, ids=[b[0] for b in BAD_TOOLS])
def test_bad_tools_400(what, tools, choice, param, needle, server):
    body = {"model": server.model, "messages": USER, "max_tokens": 1}
    if tools is not None:
        body["tools"] = tools
    if choice is not None:
        body["tool_choice"] = choice
    e = assert_error_shape(raw(server, "POST", "/v1/chat/completions", json=body), 400, param=param)
    assert needle in e["message"], e


def test_forced_call_unsupported_schema_400(server):
    if not grammar_merged(server):
        pytest.xfail("json_schema constrained decoding (helper oai-grammar) is not merged yet")
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$"}}}}}
    body = {"model": server.model, "messages": USER, "tools": [tool], "tool_choice": "required", "max_tokens": 1}
    e = assert_error_shape(raw(server, "POST", "/v1/chat/completions", json=body), 400, param="tools")
    assert "pattern" in e["message"], e
    body["tool_choice"] = "auto"  # not forced: the schema is only shown to the model
    assert raw(server, "POST", "/v1/chat/completions", json=body).status_code == 200


def test_bad_tool_calls_in_messages_400(server):
    msgs = [*USER, {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {}}]}]
    r = raw(server, "POST", "/v1/chat/completions", json={"model": server.model, "messages": msgs})
    e = assert_error_shape(r, 400, param="messages")
    assert "tool_calls[0]" in e["message"]


def test_model_without_tool_template_400(smollm2, ie_bin):
    s = Server(smollm2, "--ctx", 512)
    try:
        c = s.client()
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model=s.model, messages=USER, tools=[WEATHER], max_tokens=1)
        assert "does not support tools" in str(ei.value)
        # tool_choice "none" with no tools, developer and content null: fine
        r = c.chat.completions.create(model=s.model, max_tokens=1, tool_choice="none", messages=[
            {"role": "developer", "content": "Be brief."}, *USER, {"role": "assistant", "content": None},
            {"role": "user", "content": "ok?"}])
        assert r.choices[0].message.role == "assistant"
    finally:
        s.stop()


# ------------------------------------------------------------------ harmony
@pytest.fixture(scope="module")
def harmony_tools_model(tmp_path_factory, ie_bin):
    """test_chat_harmony's tiny random gpt-oss GGUF with gpt-oss's own chat
    template (tests/data/templates/openai-gpt-oss-120b.jinja) as
    tokenizer.chat_template: tools render through it."""
    import gguf

    import test_chat_harmony as tch

    text = (REPO / "tests" / "data" / "templates" / "openai-gpt-oss-120b.jinja").read_text()

    class Writer(gguf.GGUFWriter):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.add_chat_template(text)

    p = tmp_path_factory.mktemp("harmony_tools") / "tiny_gptoss_tools.gguf"
    mp = pytest.MonkeyPatch()
    mp.setattr(gguf, "GGUFWriter", Writer)
    try:
        tch._write_tiny_harmony_gguf(p)
    finally:
        mp.undo()
    return p, text


def test_harmony_tools(harmony_tools_model):
    from test_chat_template import hf_render

    model, template = harmony_tools_model
    s = Server(model, "--ctx", 4096)
    try:
        c = s.client()
        msgs = [{"role": "developer", "content": "Be brief."}, *USER]
        r = c.chat.completions.create(model=s.model, messages=msgs, tools=[WEATHER], max_tokens=16, temperature=0)
        want = hf_render(template, msgs, bos="<|startoftext|>", eos="<|return|>", tools=[WEATHER])
        assert "namespace functions" in want and "get_weather" in want
        cp = run_cli(["tokenize", "--tokenizer", str(model), "--no-bos", "--parse-special"],
                     input_bytes=want.encode())
        assert cp.returncode == 0, cp.stderr
        assert r.usage.prompt_tokens == len(json.loads(cp.stdout)["ids"])
        m = r.choices[0].message
        for call in m.tool_calls or []:  # the random model may call: then whole
            assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
            json.loads(call.function.arguments)
        # streamed the same way (greedy: the same answer)
        chunks = list(c.chat.completions.create(model=s.model, messages=msgs, tools=[WEATHER], max_tokens=16,
                                                temperature=0, stream=True))
        assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
        # reasoning_effort reaches gpt-oss's template
        r = c.chat.completions.create(model=s.model, messages=msgs, tools=[WEATHER], max_tokens=1,
                                      reasoning_effort="high")
        want = hf_render(template, msgs, bos="<|startoftext|>", eos="<|return|>", tools=[WEATHER],
                         reasoning_effort="high")
        assert "Reasoning: high" in want
        cp = run_cli(["tokenize", "--tokenizer", str(model), "--no-bos", "--parse-special"],
                     input_bytes=want.encode())
        assert r.usage.prompt_tokens == len(json.loads(cp.stdout)["ids"])
        # forcing a call would have to force the harmony header: refused
        e = assert_error_shape(raw(s, "POST", "/v1/chat/completions",
                                   json={"model": s.model, "messages": USER, "tools": [WEATHER],
                                         "tool_choice": "required"}), 400, param="tool_choice")
        assert "harmony" in e["message"]
    finally:
        s.stop()


def test_forced_call_n_choices(server, client):
    """n > 1: every choice is a call of its own (choice i seeded seed + i),
    streamed as delta.tool_calls chunks of that choice's index."""
    if not grammar_merged(server):
        pytest.xfail("json_schema constrained decoding (helper oai-grammar) is not merged yet")
    kw = dict(model=server.model, messages=USER, tools=[WEATHER, SEARCH], tool_choice="required", max_tokens=200,
              seed=3, n=3)
    r = client.chat.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls"
        (call,) = ch.message.tool_calls
        fn = {t["function"]["name"]: t["function"] for t in (WEATHER, SEARCH)}[call.function.name]
        validate(json.loads(call.function.arguments), fn["parameters"])
    calls, finish = {}, {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                calls.setdefault(ch.index, []).append(tc)
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert finish == {0: "tool_calls", 1: "tool_calls", 2: "tool_calls"}
    for i, ch in enumerate(r.choices):  # the same seeds: the same calls, streamed or not
        assert [(c.function.name, c.function.arguments) for c in calls[i]] == \
            [(c.function.name, c.function.arguments) for c in ch.message.tool_calls]
