"""Issue 21 against the real app and model (FastAPI's TestClient, in process): long stop strings,
max_completion_tokens over max_tokens, an OpenAPI document whose bounds are JSON Schema's and hold, errors that
name what is wrong, token counts that agree (vLLM's convention), metrics that balance per route, JSON integers
bounded in structured output."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from prefill.server.app import ServeConfig, create_app, model_id_of

pytestmark = pytest.mark.slow
MAX_TOKENS_LIMIT = 64
SAY_OK = [{"role": "user", "content": "Say OK."}]


@pytest.fixture(scope="module")
def served(smollm_native):
    cfg = ServeConfig(model_id_of(smollm_native), max_tokens_limit=MAX_TOKENS_LIMIT, chunk_size=64, kv_cache_mb=128)
    with TestClient(create_app(smollm_native, cfg)) as http:
        yield http, cfg.model_id


def post(http: TestClient, path: str, body: dict | str):
    if isinstance(body, str):  # sent as written (NaN is no JSON json.dumps would refuse; this is explicit)
        return http.post(path, content=body.encode(), headers={"content-type": "application/json"})
    return http.post(path, json=body)


def refused(r, param: str | None = None) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    if param is not None:
        assert err["param"] == param, err
    return err


# ---- 1: stop strings ----
def test_a_single_stop_string_longer_than_16_characters_cuts_the_answer(served):
    http, model = served
    base = {"model": model, "prompt": "The history of Rome begins", "max_tokens": 30, "temperature": 0}
    full = post(http, "/v1/completions", {**base, "ignore_eos": True}).json()["choices"][0]["text"]
    stop = full[8:30]  # 22 characters from the middle of the greedy answer
    assert len(stop) > 16
    r = post(http, "/v1/completions", {**base, "stop": stop})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == full[: full.index(stop)] and choice["finish_reason"] == "stop"


def test_stop_lists_are_capped_by_items_and_each_string_by_characters(served):
    http, model = served
    base = {"model": model, "prompt": "Hi", "max_tokens": 1}
    assert post(http, "/v1/completions", {**base, "stop": ["x"] * 16}).status_code == 200
    assert "at most 16 items" in refused(post(http, "/v1/completions", {**base, "stop": ["x"] * 17}), "stop")["message"]
    assert post(http, "/v1/completions", {**base, "stop": "y" * 1024}).status_code == 200
    assert "at most 1024 characters" in refused(post(http, "/v1/completions", {**base, "stop": "y" * 1025}))["message"]


# ---- 5: max_completion_tokens wins ----
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_max_completion_tokens_takes_precedence_over_max_tokens(served, path):
    http, model = served
    body = {"model": model, "max_tokens": 2, "max_completion_tokens": 5, "ignore_eos": True, "temperature": 0}
    body |= {"messages": SAY_OK} if "chat" in path else {"prompt": "One, two,"}
    r = post(http, path, body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5 and r.json()["choices"][0]["finish_reason"] == "length"


# ---- 2: the OpenAPI document ----
def _keys(node, path=""):
    """Every (key path, key) of a JSON document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield path, k
            yield from _keys(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _keys(v, f"{path}/{i}")


def test_the_openapi_document_speaks_json_schema_bounds(served):
    http, _ = served
    doc = http.get("/openapi.json").json()
    pydantic_only = [(p, k) for p, k in _keys(doc) if k in ("ge", "le", "gt", "lt") and not p.endswith("/properties")]
    assert pydantic_only == []
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT} in chat["max_completion_tokens"]["anyOf"]
    assert doc["paths"]["/v1/completions"]["post"]["responses"]["429"]["headers"]["Retry-After"]


def _bounds(schema: dict):
    """(kind, bound, value just outside it) of a property's schema (or of its integer / number member)."""
    for option in schema.get("anyOf", [schema]):
        kind = option.get("type")
        if kind not in ("integer", "number"):
            continue
        step = 1 if kind == "integer" else 0.01
        if "minimum" in option:
            yield "minimum", option["minimum"] - step
        if "exclusiveMinimum" in option:
            yield "exclusiveMinimum", option["exclusiveMinimum"]
        if "maximum" in option:
            yield "maximum", option["maximum"] + step


@pytest.mark.parametrize(
    "path,name", [("/v1/completions", "CompletionRequest"), ("/v1/chat/completions", "ChatCompletionRequest")]
)
def test_a_value_just_outside_each_documented_bound_is_a_400(served, path, name):
    http, model = served
    doc = http.get("/openapi.json").json()
    base = {"model": model, "max_tokens": 1}
    base |= {"messages": SAY_OK} if "chat" in path else {"prompt": "Hi"}
    checked = set()
    for field, schema in doc["components"]["schemas"][name]["properties"].items():
        for bound, value in _bounds(schema):
            body = {**base, field: value}
            if field == "top_logprobs":
                body["logprobs"] = True
            r = post(http, path, body)
            assert r.status_code == 400, (field, bound, value, r.text)
            assert r.json()["error"]["param"] in (field, "max_tokens"), r.text
            checked.add(field)
    integers = {"max_tokens", "max_completion_tokens", "seed", "n", "top_k"}
    assert checked >= integers | {"temperature", "top_p"} | ({"top_logprobs"} if "chat" in path else {"logprobs"})


# ---- 7: errors that say what is wrong ----
def test_a_turn_without_content_is_refused_unless_it_is_an_assistants_calls(served):
    """(Tool turns on this template are rendered in the generic format: tests/server/test_serve_tools.py.)"""
    http, model = served
    err = refused(post(http, "/v1/chat/completions", {"model": model, "messages": [{"role": "user"}]}))
    assert err["message"] == "messages.0.content: a user turn needs content"


def test_65_prompts_are_refused_as_more_than_64(served):
    http, model = served
    err = refused(post(http, "/v1/completions", {"model": model, "prompt": ["hi"] * 65, "max_tokens": 1}), "prompt")
    assert "65 prompts" in err["message"] and "at most 64" in err["message"]
    err = refused(post(http, "/v1/completions", {"model": model, "prompt": [[1, 2]] * 65, "max_tokens": 1}))
    assert "at most 64" in err["message"]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_a_number_that_is_not_finite_is_refused_as_such(served, field, value):
    http, model = served
    body = f'{{"model": {json.dumps(model)}, "prompt": "Hi", "max_tokens": 1, "{field}": {value}}}'
    assert refused(post(http, "/v1/completions", body), field)["message"] == f"{field}: must be a finite number"


# ---- 4: token counts that agree (vLLM: the EOS the model generated counts, and has a logprobs entry) ----
def test_chat_usage_counts_every_logprobs_entry_eos_included(served, smollm_native):
    http, model = served
    body = {"model": model, "messages": SAY_OK, "max_tokens": MAX_TOKENS_LIMIT, "temperature": 0, "logprobs": True}
    out = post(http, "/v1/chat/completions", body).json()
    entries = out["choices"][0]["logprobs"]["content"]
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == len(entries)
    eos_texts = {smollm_native.tokenizer.decode([i], skip_special=False) for i in smollm_native.tokenizer.eos_ids}
    assert entries[-1]["token"] in eos_texts and entries[-1]["token"] not in out["choices"][0]["message"]["content"]
    assert "".join(e["token"] for e in entries[:-1]) == out["choices"][0]["message"]["content"]


def test_completions_tokens_join_to_the_text_and_the_eos(served, smollm_native):
    http, model = served
    prompt = smollm_native.tokenizer.render_chat(SAY_OK, add_generation_prompt=True)
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS_LIMIT, "temperature": 0, "logprobs": 1}
    out = post(http, "/v1/completions", body).json()
    choice, usage = out["choices"][0], out["usage"]
    tokens = choice["logprobs"]["tokens"]
    assert choice["finish_reason"] == "stop" and usage["completion_tokens"] == len(tokens)
    eos_texts = {smollm_native.tokenizer.decode([i], skip_special=False) for i in smollm_native.tokenizer.eos_ids}
    assert tokens[-1] in eos_texts and "".join(tokens) == choice["text"] + tokens[-1]
    streamed = post(http, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    usages = [json.loads(x[6:])["usage"] for x in streamed.text.splitlines() if x.startswith("data: {")]
    assert usages[-1]["completion_tokens"] == usage["completion_tokens"]
    without = post(http, "/v1/completions", {**body, "logprobs": None}).json()  # counted without logprobs too
    assert without["usage"]["completion_tokens"] == usage["completion_tokens"]


# ---- 3: metrics that balance per route ----
def _series(http: TestClient, family: str) -> dict[str, float]:
    text = http.get("/metrics").text
    return {labels: float(v) for labels, v in re.findall(rf"^{family}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)}


def test_generation_routes_balance_after_a_mixed_load(served):
    http, model = served
    families = (
        "prefill_received_requests_total",
        "prefill_requests_total",
        "prefill_errors_total",
        "prefill_cancelled_total",
    )
    before = {f: _series(http, f) for f in families}
    good = {"model": model, "prompt": "Hi", "max_tokens": 2}
    load = [
        ("/v1/completions", good),
        ("/v1/chat/completions", {"model": model, "messages": SAY_OK, "max_tokens": 2}),
        ("/v1/completions", {**good, "stream": True}),
        ("/v1/completions", {**good, "max_tokens": "2"}),  # 400 from validation
        ("/v1/chat/completions", {"model": model}),  # 400
        ("/v1/completions", {**good, "model": "gpt-9"}),  # 404
        ("/v1/completions", '{"model": '),  # 400: not JSON
        ("/tokenize", {"prompt": 5}),  # 400, not a generation route
        ("/v1/nothing", {}),  # 404 unknown path
    ]
    for path, body in load:
        post(http, path, body)
    assert http.get("/v1/completions").status_code == 405  # not a received request
    after = {f: _series(http, f) for f in families}
    d = {f: {k: v - before[f].get(k, 0.0) for k, v in after[f].items()} for f in families}
    gen_errors = sum(v for k, v in d["prefill_errors_total"].items() if 'route="/v1/' in k)
    assert sum(d["prefill_received_requests_total"].values()) == 7
    assert sum(d["prefill_requests_total"].values()) + gen_errors + sum(d["prefill_cancelled_total"].values()) == 7
    assert d["prefill_errors_total"]['{route="/v1/completions",status="400"}'] == 2
    assert d["prefill_errors_total"]['{route="/v1/completions",status="404"}'] == 1
    assert d["prefill_errors_total"]['{route="/tokenize",status="400"}'] == 1
    assert d["prefill_errors_total"]['{route="other",status="404"}'] == 1
    assert d["prefill_errors_total"]['{route="other",status="405"}'] == 1


# ---- 8: JSON integers within int64 ----
def test_a_runaway_json_integer_stops_at_int64(served, smollm_native):
    http, model = served
    one = smollm_native.tokenizer.encode("1")
    assert len(one) == 1
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    schema["additionalProperties"] = False  # so the object must close once n is written
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "A number, as JSON"}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS_LIMIT,
        "logit_bias": {str(one[0]): 100},
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }
    choice = post(http, "/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    n = json.loads(choice["message"]["content"])["n"]
    assert -(2**63) <= n < 2**63 and len(str(abs(n))) >= 18  # the bias ran it to the bound, not past


# ---- 6: tool_choice "auto" and tool turns, in the template's own tool format ----
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_FN = {"name": "get_weather", "description": "The weather in a city", "parameters": CITY}
WEATHER = {"type": "function", "function": WEATHER_FN}
# A Hermes-style template (the tool format of Qwen2.5 and Hermes), written for this test: tools in the system turn,
# calls as <tool_call> JSON, results as <tool_response>.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    'Answer a call as <tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call><|im_end|>\n{% endif %}'
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    '{% for c in m.tool_calls or [] %}<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def hermes(smollm_native):
    """The same weights behind a tokenizer whose chat template has a tool format."""
    import dataclasses

    from prefill.engine.llm import Engine

    tok = dataclasses.replace(smollm_native.tokenizer, chat_template=HERMES_TEMPLATE, _template=None)
    engine = Engine(smollm_native.runner, tok, smollm_native.source)
    cfg = ServeConfig(model_id_of(engine), max_tokens_limit=MAX_TOKENS_LIMIT, chunk_size=64, kv_cache_mb=64)
    with TestClient(create_app(engine, cfg)) as http:
        yield http, cfg.model_id, tok


def test_tool_turns_are_rendered_through_a_template_with_a_tool_format(hermes):
    http, model, tok = hermes
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    r = post(
        http,
        "/v1/chat/completions",
        {"model": model, "messages": messages, "tools": [WEATHER], "max_tokens": 8, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    rendered = (  # what the template writes for these turns, spelled out
        '<|im_start|>system\n# Tools\n<tools>\n{"type": "function", "function": {"name": "get_weather", "description": '
        '"The weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, '
        '"required": ["city"]}}}\n</tools>\nAnswer a call as <tool_call>\n{"name": <name>, "arguments": <object>}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n<|im_start|>user\n'
        "<tool_response>\n18 C, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(rendered))


def test_tool_choice_auto_answers_the_same_streamed_and_not(hermes):
    http, model, _ = hermes
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER],
        "tool_choice": "auto",
        "max_tokens": 24,
        "temperature": 0,
    }
    full = post(http, "/v1/chat/completions", body).json()["choices"][0]
    events = post(http, "/v1/chat/completions", {**body, "stream": True}).text.splitlines()
    chunks = [json.loads(x[6:]) for x in events if x.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    streamed = "".join(d.get("content") or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["finish_reason"]
    assert streamed == (full["message"]["content"] or "")
    assert [c["function"] for c in calls] == [c["function"] for c in full["message"].get("tool_calls") or []]
