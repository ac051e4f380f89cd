"""Tool calls on a model whose chat template has no tool format (the embedded SmolLM2), in the generic format
llama.cpp's server uses: the tools described in a system message, the answer held by a grammar to
{"tool_call": {"name", "arguments"}} or {"response": "..."}.

What is asserted, honestly: with tool_choice "required" or a named tool, the grammar guarantees a call whatever
the model would say, so any prompt and any seed gives a parsed call. With "auto" the model decides; the
assertions are on this model's greedy (temperature 0, deterministic) choice for two prompts, one that asks for
the weather and one that asks for a haiku. (The 135M model over-calls: "Tell me a joke." also gets a weather
call; docs/serving.md says so.)"""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.intake import GENERIC_NOTE
from prefill.server.tool_parser import generic_calls

pytestmark = pytest.mark.slow
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": CITY},
}
TZ = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a zone", "parameters": TZ}}
ASKS = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
NEEDS_NONE = [{"role": "user", "content": "Write a haiku about the sea."}]


@pytest.fixture(scope="module")
def served(smollm_native):
    cfg = ServeConfig(model_id_of(smollm_native), kv_cache_mb=128, chunk_size=256, max_tokens_limit=128)
    with TestClient(create_app(smollm_native, cfg)) as http:
        yield http, cfg.model_id, smollm_native.tokenizer


def chat(served, messages, **extra) -> dict:
    http, model, _ = served
    body = {"model": model, "messages": messages, "tools": [WEATHER], "temperature": 0, "max_tokens": 64, **extra}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_auto_calls_the_tool_a_prompt_asks_for(served):
    choice = chat(served, ASKS)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_auto_answers_in_text_a_prompt_that_needs_no_tool(served):
    choice = chat(served, NEEDS_NONE, tool_choice="auto")["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    text = choice["message"]["content"]
    assert "sea" in text.lower() and not text.lstrip().startswith("{")  # the response's text, not its JSON


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_and_named_always_call_a_tool_with_valid_arguments(served, seed):
    sampled = {"temperature": 1.0, "seed": seed, "tools": [WEATHER, TIME]}
    for messages in (NEEDS_NONE, [{"role": "user", "content": "Tell me a joke."}]):
        required = chat(served, messages, tool_choice="required", **sampled)["choices"][0]
        named = chat(served, messages, tool_choice={"type": "function", "function": {"name": "get_time"}}, **sampled)
        named = named["choices"][0]
        for choice in (required, named):
            assert choice["finish_reason"] == "tool_calls", choice
            (call,) = choice["message"]["tool_calls"]
            schema = {"get_weather": CITY, "get_time": TZ}[call["function"]["name"]]
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
        assert named["message"]["tool_calls"][0]["function"]["name"] == "get_time"


def test_tool_turns_are_rendered_as_text_for_a_template_without_a_tool_format(served):
    _, _, tok = served
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        *ASKS,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    reply = chat(served, messages)
    assert reply["choices"][0]["finish_reason"] in ("stop", "tool_calls", "length")
    spec = [{"name": "get_weather", "description": "Get the current weather in a city", "parameters": CITY}]
    rendered = [  # what the model reads, spelled out
        {"role": "system", "content": "You can call these functions:\n" + json.dumps(spec) + "\n" + GENERIC_NOTE},
        ASKS[0],
        {"role": "assistant", "content": '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'},
        {"role": "user", "content": '{"tool_response": {"tool_call_id": "call_1", "content": "18 C, sunny"}}'},
    ]
    want = tok.encode(tok.render_chat(rendered, add_generation_prompt=True))
    assert reply["usage"]["prompt_tokens"] == len(want)


@pytest.mark.parametrize("messages", [ASKS, NEEDS_NONE])
def test_auto_answers_the_same_streamed_and_not(served, messages):
    http, model, _ = served
    full = chat(served, messages)["choices"][0]
    body = {"model": model, "messages": messages, "tools": [WEATHER], "temperature": 0, "max_tokens": 64}
    events = http.post("/v1/chat/completions", json={**body, "stream": True}).text.splitlines()
    chunks = [json.loads(x[6:]) for x in events if x.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == (full["message"]["content"] or "")
    calls = [tc["function"] for d in deltas for tc in d.get("tool_calls") or []]
    assert calls == [c["function"] for c in full["message"].get("tool_calls") or []]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["finish_reason"]


def test_the_generic_answer_is_read_as_a_call_a_response_or_the_text_as_it_is():
    names = {"get_weather"}
    content, (call,) = generic_calls('{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}', names)
    assert content is None and json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert generic_calls('{"response": "Hello."}', names) == ("Hello.", [])
    for text in ('{"tool_call": {"name": "launch", "arguments": {}}}', '{"response": "cut sh', "plain"):
        assert generic_calls(text, names) == (text, [])
