"""The grammar constraint on the embedded model's tokenizer, fed random logits: whatever the logits, the text
parses and matches the schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from prefill.errors import BadInput
from prefill.server.structured import Grammars, tool_calls_of

pytestmark = pytest.mark.slow  # the tokenizer comes from the embedded model's GGUF

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        "score": {"type": "number"},
        "nickname": {"type": ["string", "null"], "maxLength": 4},
    },
    "required": ["name", "age", "pets", "score", "nickname"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def grammars():
    from prefill.costmodel.gguf_file import open_gguf
    from prefill.loading.resolve import default_model_path
    from prefill.loading.tokenizer import tokenizer_from_gguf

    tok = tokenizer_from_gguf(open_gguf(default_model_path()))
    return Grammars(tok, tok.tok.get_vocab_size())


def run(grammars, grammar, seed: int, max_steps: int = 300) -> str:
    """Random logits through mask -> argmax -> accept until the grammar is done; the text."""
    c = grammars.constraint(grammar)
    g = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(max_steps):
        logits = c.mask(torch.randn(grammars.vocab_size, generator=g) * 5)  # [vocab]
        assert torch.isfinite(logits).any()
        token = int(logits.argmax())
        c.accept(token)
        if c.done():
            return grammars.tokenizer.decode(ids + [token])
        ids.append(token)
    raise AssertionError(f"not done after {max_steps} steps: {grammars.tokenizer.decode(ids)!r}")


@pytest.mark.parametrize("seed", range(12))
def test_random_logits_always_give_json_that_matches_the_schema(grammars, seed):
    text = run(grammars, grammars.json_schema(PERSON), seed)
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_is_an_object(grammars):
    # Bounded only by the model's wish to close it: random logits get a few tries to do so.
    done = 0
    for seed in range(6):
        try:
            assert isinstance(json.loads(run(grammars, grammars.json_object(), seed, max_steps=200)), dict)
            done += 1
        except AssertionError as e:
            assert "not done" in str(e)
    assert done >= 1


def test_tool_call_names_one_of_the_tools_and_its_arguments_validate(grammars):
    weather = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    }
    clock = {
        "type": "object",
        "properties": {"tz": {"enum": ["UTC", "CET"]}},
        "required": ["tz"],
        "additionalProperties": False,
    }
    tools = [{"name": "get_weather", "parameters": weather}, {"name": "get_time", "parameters": clock}]
    grammar = grammars.tool_call(tools)
    assert grammar.tool_names == ("get_weather", "get_time")
    seen = set()
    for seed in range(8):
        (call,) = tool_calls_of(run(grammars, grammar, seed))
        assert call["type"] == "function" and call["id"].startswith("call_")
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
        jsonschema.validate(args, weather if name == "get_weather" else clock)
        seen.add(name)
    assert seen == {"get_weather", "get_time"}


def test_masked_row_keeps_only_allowed_tokens(grammars):
    c = grammars.constraint(grammars.json_schema({"enum": ["yes", "no"]}))
    allowed = c.allowed()
    assert allowed.shape == (grammars.vocab_size,) and 0 < int(allowed.sum()) < 50
    row = c.mask(torch.zeros(grammars.vocab_size))
    assert torch.equal(torch.isfinite(row), allowed)


@pytest.mark.parametrize("schema", [{"type": "objectx"}, {"type": "string", "pattern": "(("}])
def test_a_schema_that_cannot_compile_is_bad_input(grammars, schema):
    with pytest.raises(BadInput, match="response_format"):
        grammars.json_schema(schema)
