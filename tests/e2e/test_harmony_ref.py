"""test_harmony_ref.py — tests/data/harmony_ref.json is what gpt-oss's chat
template renders today.

The fixture (conversations + the text transformers' apply_chat_template
makes of them with tests/data/openai-gpt-oss-120b.jinja) is what
tests/unit/test_harmony.c compares our renderer against byte for byte. Here
the generator runs again and must reproduce the committed file exactly, so
a change to the template, the generator or transformers shows up.
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "reference"))


def test_harmony_fixture_matches_template():
    import gen_harmony_ref as gen
    fresh = gen.render_all()
    committed = json.loads((ROOT / "tests" / "data" / "harmony_ref.json").read_text(encoding="utf-8"))
    assert [c["name"] for c in fresh] == [c["name"] for c in committed]
    for f, c in zip(fresh, committed):
        assert f == c, f"case {c['name']!r}: regenerate with tests/reference/gen_harmony_ref.py"
    # the prompt ends where generation starts, except in the training-style case
    for c in committed:
        assert c["expected"].endswith("<|start|>assistant") == c["generation_prompt"]
