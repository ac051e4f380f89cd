"""Issue 13 against the real server and model: no request stops the server from serving others, /health tells the
truth, and no OpenAI field is silently ignored. After each hostile case, a normal request completes and /health is
200."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = pytest.mark.slow
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
KV_MB = 256  # each app's KV pool: the default (up to 2 GiB) fills with a long test and the suite runs in one process


@pytest.fixture(scope="module")
def engine(smollm_native):
    return smollm_native  # the session's load on the GGUF's own blocks (conftest): what is served, in less time


@pytest.fixture(scope="module")
def server(engine):
    # the default 4 MiB body limit, for the ~3.9 MB prompt
    cfg = ServeConfig(model_id_of(engine), chunk_size=64, max_tokens_limit=512, kv_cache_mb=KV_MB)
    with BackgroundServer(create_app(engine, cfg)) as url:
        yield url, cfg.model_id


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def metric(url: str, name: str) -> float:
    """A sample of /metrics (0 when the labelled series does not exist yet)."""
    text = httpx.get(f"{url}/metrics").text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def total(url: str, family: str) -> float:
    """The sum of every labelled series of a counter family, e.g. prefill_errors_total."""
    text = httpx.get(f"{url}/metrics").text
    return sum(float(v) for v in re.findall(rf"^{re.escape(family)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE))


def wait_idle(url: str) -> None:
    for _ in range(400):  # bounded: 20 s
        if metric(url, "prefill_running_requests") == 0 and metric(url, "prefill_queued_requests") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the scheduler did not become idle")


def still_serving(url: str, model: str) -> None:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": "One, two,", "max_tokens": 3, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    h = httpx.get(f"{url}/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"


def raw_post(url: str, path: str, body: str) -> httpx.Response:
    """A body sent as written (json.dumps would escape a lone surrogate the same way; this is explicit)."""
    return httpx.post(f"{url}{path}", content=body.encode(), headers={"content-type": "application/json"}, timeout=60)


def refused(r: httpx.Response, param: str, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["param"] == param and err["message"], err
    return err


@pytest.mark.parametrize("seed", [18446744073709551616, -22500489703941931532288])
@pytest.mark.parametrize("stream", [False, True])
def test_seed_outside_what_torch_accepts_is_400_not_a_dead_worker(server, seed, stream):
    url, model = server
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 1, "seed": seed, "stream": stream}
    refused(httpx.post(f"{url}/v1/completions", json=body, timeout=60), "seed")
    still_serving(url, model)


def test_seeds_at_the_edges_of_the_range_sample(server):
    url, model = server
    for seed in (2**64 - 1, -(2**63)):
        body = {"model": model, "prompt": "Hello", "max_tokens": 3, "temperature": 1, "seed": seed}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/completions", '{"model": "M", "prompt": "abc \\ud800 def", "max_tokens": 3}', "prompt"),
        ("/v1/completions", '{"model": "M", "prompt": ["abc \\udc00"], "max_tokens": 3}', "prompt.0"),
        ("/v1/completions", '{"model": "M", "prompt": ["fine", "abc \\udc00"], "echo": true}', "prompt.1"),
        ("/tokenize", '{"prompt": "abc \\ud800"}', "prompt"),
        (
            "/v1/chat/completions",
            '{"model": "M", "messages": [{"role": "user", "content": "hi \\udfff"}]}',
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            '{"model": "M", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
            "messages.0.content.0.text",
        ),
        ("/v1/completions", '{"model": "M", "prompt": "hi", "stop": "\\ud800"}', "stop"),
    ],
)
def test_lone_surrogates_are_a_json_400_counted_in_errors(server, path, body, param):
    url, model = server
    series = f'prefill_errors_total{{route="{path}",status="400"}}'
    errors0 = metric(url, series)
    err = refused(raw_post(url, path, body.replace('"M"', json.dumps(model))), param)
    assert "surrogate" in err["message"]
    assert metric(url, series) == errors0 + 1
    still_serving(url, model)


def test_tiny_temperature_and_top_p_are_greedy_not_nan(server):
    url, model = server
    base = {"model": model, "prompt": "The capital of France is", "max_tokens": 6}
    greedy = httpx.post(f"{url}/v1/completions", json={**base, "temperature": 0}, timeout=60).json()
    greedy_text = greedy["choices"][0]["text"]
    for extra in ({"temperature": 5e-324}, {"temperature": 1e-45}, {"temperature": 1, "top_p": 1e-300, "seed": 3}):
        r = httpx.post(f"{url}/v1/completions", json={**base, **extra}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy_text, (extra, r.text)
        with httpx.stream("POST", f"{url}/v1/completions", json={**base, **extra, "stream": True}, timeout=60) as s:
            lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and not any('"error"' in ln for ln in lines)
    still_serving(url, model)


def test_a_huge_prompt_is_refused_without_stalling_the_event_loop(server):
    url, model = server
    body = {"model": model, "prompt": "word " * 780_000, "max_tokens": 2}  # ~3.9 MB: refused by its length
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)  # before it is tokenized
    assert refused(r, "prompt")["code"] == "context_length_exceeded"
    # ~560 k characters: under the character bound, so it is tokenized (on a worker thread) before it is refused.
    result: dict = {}

    def big() -> None:
        body = {"model": model, "prompt": "lorem ipsum " * 46_000, "max_tokens": 2}
        result["r"] = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        result["done"] = time.monotonic()

    t = threading.Thread(target=big)
    t.start()
    answered = []
    while t.is_alive():
        h = httpx.get(f"{url}/health", timeout=60)
        answered.append((time.monotonic(), h.status_code))
    t.join()
    assert refused(result["r"], "prompt")["code"] == "context_length_exceeded"
    during = [code for at, code in answered if at < result["done"]]
    assert during and set(during) == {200}  # /health answered while the big request was being tokenized
    still_serving(url, model)


def test_n_as_an_integer_valued_number_and_empty_prompt(server):
    url, model = server
    ok = {"model": model, "prompt": "Hi", "max_tokens": 2}
    assert httpx.post(f"{url}/v1/completions", json={**ok, "n": 1.0}, timeout=60).status_code == 200
    for n in (2, 1.5, 0):
        refused(httpx.post(f"{url}/v1/completions", json={**ok, "n": n}, timeout=60), "n")
    for prompt, param in (("", "prompt"), ([], "prompt"), ([""], "prompt.0")):
        refused(httpx.post(f"{url}/v1/completions", json={**ok, "prompt": prompt}, timeout=60), param)
    still_serving(url, model)


@pytest.mark.parametrize(
    "path,extra,param",
    [
        ("/v1/completions", {"logprobs": 21}, "logprobs"),  # honoured for 0..20 (tests/test_serve_score.py)
        ("/v1/completions", {"echo": "yes"}, "echo"),
        ("/v1/completions", {"prompt": [[1, 2], [10**9]]}, "prompt"),
        ("/v1/completions", {"best_of": 3}, "best_of"),
        ("/v1/completions", {"suffix": "end"}, "suffix"),
        ("/v1/completions", {"frequency_penalty": 0.5}, "frequency_penalty"),
        ("/v1/completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("/v1/completions", {"no_such_field": 1}, "no_such_field"),
        ("/v1/chat/completions", {"logprobs": 1, "top_logprobs": 2}, "logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
        ("/v1/chat/completions", {"presence_penalty": -1}, "presence_penalty"),
        ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
        ("/v1/chat/completions", {"audio": {"voice": "x"}}, "audio"),
        ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
            "response_format",
        ),
        ("/v1/chat/completions", {"logit_bias": {"99999999": 5}}, "logit_bias"),
        ("/v1/chat/completions", {"logit_bias": {"5": -101}}, "logit_bias.5"),
    ],
)
def test_every_field_is_honoured_or_refused_by_name(server, path, extra, param):
    url, model = server
    body = {"model": model, "max_tokens": 2}
    body.update({"prompt": "Hi"} if path == "/v1/completions" else {"messages": FRANCE})
    refused(httpx.post(f"{url}{path}", json={**body, **extra}, timeout=60), param)


def test_fields_at_their_no_op_values_are_accepted(server):
    url, model = server
    noop = {
        "logprobs": None,
        "echo": False,
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "best_of": 1,
        "user": "someone",
        "top_k": 0,
    }
    r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 2, **noop}, timeout=60)
    assert r.status_code == 200, r.text
    chat = {
        "model": model,
        "messages": FRANCE,
        "max_tokens": 2,
        "tool_choice": "none",
        "logprobs": False,
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "text"},
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 200 and "tool_calls" not in r.json()["choices"][0]["message"], r.text


def test_models_retrieve(server, client):
    _, model = server
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


class Capital(BaseModel):
    country: str
    capital: str


def test_parse_into_a_pydantic_model(server, client):
    _, model = server
    messages = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    r = client.chat.completions.parse(
        model=model, messages=messages, response_format=Capital, max_tokens=40, temperature=0
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Capital) and r.choices[0].finish_reason == "stop"
    assert "Paris" in parsed.capital
    r = client.chat.completions.create(
        model=model, messages=messages, max_tokens=40, temperature=0.8, seed=5, response_format={"type": "json_object"}
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
NOTE = {"type": "function", "function": {"name": "take_note", "parameters": {"type": "object", "properties": {
    "text": {"type": "string", "maxLength": 20}}, "required": ["text"], "additionalProperties": False}}}
# fmt: on


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call_comes_back_as_tool_calls(server, client, choice):
    _, model = server
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER, NOTE], tool_choice=choice, max_tokens=80, temperature=0
    )
    choice0 = r.choices[0]
    assert choice0.finish_reason == "tool_calls" and choice0.message.content is None
    (call,) = choice0.message.tool_calls
    assert call.type == "function" and call.id
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    schema = (WEATHER if call.function.name == "get_weather" else NOTE)["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    # Streamed: the same call arrives as one tool_calls delta, then finish_reason "tool_calls".
    kw = dict(model=model, messages=messages, tools=[WEATHER, NOTE], tool_choice=choice, max_tokens=80, temperature=0)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].function.name == call.function.name
    assert json.loads(deltas[0].function.arguments) == json.loads(call.function.arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_forced_tool_call_carries_logprobs_full_and_streamed(server, client):
    _, model = server
    kw = dict(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens  # the EOS that ended the call is counted and has its entry
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token for c in content)  # greedy
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = [
        c.token for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content
    ]
    assert streamed == [c.token for c in content]


def test_a_stop_string_inside_a_forced_call_gives_text_not_a_500(server):
    url, model = server
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 80,
        "temperature": 0,
        "stop": ['"arguments"'],
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"].startswith('{"name": "get_weather"')


def test_logit_bias_minus_100_removes_the_greedy_token(server, client, engine):
    _, model = server
    kw = dict(model=model, prompt="The capital of France is", max_tokens=1, temperature=0)
    first = client.completions.create(**kw).choices[0].text
    (token,) = engine.tokenizer.encode(first)
    again = client.completions.create(**kw, logit_bias={str(token): -100}).choices[0].text
    assert again != first and again
    forced = client.completions.create(**kw, logit_bias={str(token + 1): 100}).choices[0].text
    assert engine.tokenizer.encode(forced) == [token + 1]


def test_disconnect_is_counted_as_cancelled(server):
    url, model = server
    wait_idle(url)
    before = {
        f: total(url, f)
        for f in (
            "prefill_received_requests_total",
            "prefill_requests_total",
            "prefill_errors_total",
            "prefill_cancelled_total",
        )
    }
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        for i, _line in enumerate(r.iter_lines()):
            if i == 4:
                break
    wait_idle(url)
    for _ in range(100):  # the handler notices the disconnect on its next send
        if total(url, "prefill_cancelled_total") > before["prefill_cancelled_total"]:
            break
        time.sleep(0.05)
    after = {f: total(url, f) for f in before}
    d = {f: after[f] - before[f] for f in before}
    assert d["prefill_cancelled_total"] == 1 and d["prefill_received_requests_total"] == 1
    assert d["prefill_requests_total"] == d["prefill_errors_total"] == 0
    assert metric(url, "prefill_kv_cache_bytes") == 0


def test_a_client_gone_before_its_non_streamed_answer_is_cancelled(server):
    url, model = server
    wait_idle(url)
    cancelled0, done0 = total(url, "prefill_cancelled_total"), metric(url, "prefill_generated_tokens_count")
    body = json.dumps({"model": model, "prompt": "Write a long story:", "max_tokens": 400, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        for _ in range(200):  # until it decodes (bounded: 20 s), then hang up
            if metric(url, "prefill_running_requests") == 1:
                break
            time.sleep(0.1)
    for _ in range(200):
        if total(url, "prefill_cancelled_total") == cancelled0 + 1:
            break
        time.sleep(0.1)
    wait_idle(url)
    assert total(url, "prefill_cancelled_total") == cancelled0 + 1
    assert metric(url, "prefill_generated_tokens_count") == done0  # dropped, not decoded to 400 tokens
    assert metric(url, "prefill_kv_cache_bytes") == 0
    still_serving(url, model)


def test_an_unread_stream_is_cancelled_and_counted(engine):
    """Driven through ASGI with a `send` that never returns after the first chunk: a client whose socket is full."""
    cfg = ServeConfig(model_id_of(engine), max_unread_events=8, max_tokens_limit=200, kv_cache_mb=KV_MB)
    app = create_app(engine, cfg)
    body = json.dumps(
        {"model": cfg.model_id, "prompt": "Count: 1, 2, 3,", "max_tokens": 150, "temperature": 0, "stream": True}
    ).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }

    def sample(name: str) -> float:
        m = re.search(rf"^{re.escape(name)} (\S+)$", app.state.server.metrics.render().decode(), re.MULTILINE)
        return float(m.group(1)) if m else 0.0

    async def scenario() -> None:
        sent, blocked = [], asyncio.Event()
        delivered = False

        async def receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client never disconnects either

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body":
                blocked.set()
                await asyncio.Event().wait()  # the socket is full: this send never completes

        async with app.router.lifespan_context(app):
            task = asyncio.create_task(app(scope, receive, send))
            await asyncio.wait_for(blocked.wait(), 60)
            for _ in range(1200):  # bounded: 60 s
                if sample('prefill_cancelled_total{reason="unread"}') == 1 and sample("prefill_running_requests") == 0:
                    break
                await asyncio.sleep(0.05)
            task.cancel()
        assert sent[0]["status"] == 200
        assert sample('prefill_cancelled_total{reason="unread"}') == 1
        assert sample("prefill_generated_tokens_count") == 0  # dropped, never finished
        assert app.state.server.worker.pool_state()["kv_held_bytes"] == 0

    asyncio.run(scenario())


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the fault we inject
def test_a_dead_worker_is_reported_fails_what_waits_and_stops_the_server(engine):
    cfg = ServeConfig(model_id_of(engine), supervise_every_s=0.1, kv_cache_mb=KV_MB)
    app = create_app(engine, cfg)
    server = BackgroundServer(app)
    with server as url:
        still_serving(url, cfg.model_id)
        worker = app.state.server.worker

        class Fault(BaseException):  # escapes every `except Exception` guard
            pass

        def boom():
            raise Fault("injected fault outside every per-request guard")

        stop_server, reported = app.state.server.on_fatal, threading.Event()
        app.state.server.on_fatal = reported.set  # hold the exit until /health has been read
        worker.loop.step = boom  # the worker's next turn raises: the thread ends
        body = {"model": cfg.model_id, "prompt": "Hi", "max_tokens": 3}
        errors0 = total(url, "prefill_errors_total")
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)  # pending when the worker dies
        assert r.status_code in (500, 503) and r.json()["error"]["message"]  # failed by the dying worker or by us
        assert total(url, "prefill_errors_total") == errors0 + 1  # counted once
        assert reported.wait(10)
        h = httpx.get(f"{url}/health")
        assert h.status_code == 503 and "worker" in h.json()["reason"]
        refused(httpx.post(f"{url}/v1/completions", json=body, timeout=60), None, 503)
        stop_server()
        for _ in range(100):
            if not server.running:
                break
            time.sleep(0.1)
        assert not server.running  # the supervisor asked the server to exit
        assert app.state.server.exit_code == 1
        assert "worker" in app.state.server.supervisor.problem()
