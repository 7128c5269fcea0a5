#!/usr/bin/env python3
"""gen_tool_templates.py — transformers' renders of chat templates with tools.

For the tool-capable templates of tests/data/templates and the CASES below
(OpenAI-style requests: tools, a developer message, assistant turns with
content None and tool_calls whose arguments are JSON strings, tool results),
prepares the messages as ie_tool_messages_prepare does (prepare() below),
renders each case with
transformers.utils.chat_template_utils.render_jinja_template(tools=...)
(what tokenizer.apply_chat_template(conversation, tools=tools,
tokenize=False, add_generation_prompt=True) calls) and writes

  tests/data/templates/tools_expected.json
      {"cases": [{"name", "messages", "tools"}],
       "renders": {"<template file>": {"bos_token", "eos_token",
                   "renders": {"<case>": {"text"} | {"error", "raised"}}}}}

tests/unit/test_tools.c renders the same with coordinator/chat and compares
bytes. strftime_now is pinned as in gen_chat_templates.py.

Usage: gen_tool_templates.py [OUT_DIR]   (default tests/data/templates)
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_chat_templates as gct  # noqa: E402  (tokens_for, _FixedDatetime)

TEMPLATES = [
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "Qwen-QwQ-32B.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "openai-gpt-oss-120b.jinja",
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web <|im_end|> for a query.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
                   "required": ["q"]}}}
SYS = {"role": "system", "content": "You are a careful assistant."}
U1 = {"role": "user", "content": "What is the weather in Paris?"}
CALL1 = {"id": "call12345", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}
CALL2 = {"id": "call67890", "type": "function",
         "function": {"name": "search", "arguments": "{\"q\": \"Paris {events}\", \"n\": 3}"}}
A_CALL = {"role": "assistant", "content": None, "tool_calls": [CALL1]}
T1 = {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 18, \"sky\": \"clear\"}"}

CASES = [
    ("tools_system", [SYS, U1], [WEATHER]),
    ("developer", [{"role": "developer", "content": "Answer in French."}, U1], [WEATHER]),
    ("tools_no_system", [U1], [WEATHER, SEARCH]),
    ("tool_roundtrip", [SYS, U1, A_CALL, T1], [WEATHER]),
    ("two_calls", [U1, {"role": "assistant", "content": None, "tool_calls": [CALL1, CALL2]}, T1,
                   {"role": "tool", "tool_call_id": "call67890", "content": "three results"}], [WEATHER, SEARCH]),
    ("call_with_text", [U1, {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL1]}, T1,
                        {"role": "assistant", "content": "It is 18 C and clear."},
                        {"role": "user", "content": "Thanks"}], [WEATHER]),
]


def prepare(messages):
    """What ie_tool_messages_prepare does to an OpenAI request's messages
    (vLLM does the same before apply_chat_template): developer -> system (no
    template here mentions developer), content None -> "", tool_calls'
    arguments JSON string -> the object it encodes."""
    out = json.loads(json.dumps(messages))
    for m in out:
        if m.get("role") == "developer":
            m["role"] = "system"
        if "content" in m and m["content"] is None:
            m["content"] = ""
        for c in m.get("tool_calls") or []:
            a = c["function"].get("arguments")
            if isinstance(a, str):
                try:
                    v = json.loads(a)
                except ValueError:
                    continue
                if isinstance(v, dict):
                    c["function"]["arguments"] = v
    return out


def main():
    root = Path(__file__).resolve().parents[2] / "tests" / "data" / "templates"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else root
    os.environ["TZ"] = "UTC"
    import jinja2
    from transformers.utils import chat_template_utils as ctu

    ctu.datetime = gct._FixedDatetime
    renders = {}
    for name in TEMPLATES:
        tmpl = (root / name).read_text(encoding="utf-8")
        bos, eos = gct.tokens_for(name)
        r = {}
        for case, messages, tools in CASES:
            try:
                (text,), _ = ctu.render_jinja_template(
                    conversations=[prepare(messages)], tools=json.loads(json.dumps(tools)),
                    chat_template=tmpl, add_generation_prompt=True, bos_token=bos, eos_token=eos)
                r[case] = {"text": text}
            except jinja2.exceptions.TemplateError as e:
                r[case] = {"error": str(e), "raised": type(e) is jinja2.exceptions.TemplateError}
            except Exception as e:  # noqa: BLE001 - a template's runtime error is a result too
                r[case] = {"error": f"{type(e).__name__}: {e}", "raised": False}
        renders[name] = {"bos_token": bos, "eos_token": eos, "renders": r}
    doc = {"cases": [{"name": n, "messages": m, "tools": t} for n, m, t in CASES], "renders": renders}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tools_expected.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    n_err = sum("error" in c for t in renders.values() for c in t["renders"].values())
    print(f"{len(renders)} templates x {len(CASES)} tool cases, {n_err} rejected", file=sys.stderr)


if __name__ == "__main__":
    main()
