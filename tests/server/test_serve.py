"""The server end to end on the real embedded model: the official `openai` client and raw HTTP against a server
on a free loopback port. One model load for the module; short prompts and max_tokens keep it quick."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine(smollm_native):
    return smollm_native  # the session's load on the GGUF's own blocks (conftest): what is served, in less time


@pytest.fixture(scope="module")
def server(engine):
    cfg = ServeConfig(
        model_id_of(engine), chunk_size=16, max_body_bytes=256 * 1024, max_tokens_limit=512, kv_cache_mb=256
    )
    with BackgroundServer(create_app(engine, cfg)) as url:
        yield url, cfg.model_id


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def wait_idle(url: str) -> None:
    for _ in range(200):  # bounded: 10 s at most
        if metric(url, "prefill_running_requests") == 0 and metric(url, "prefill_queued_requests") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the scheduler did not become idle")


def test_models_health_and_greedy_answer(server, client, engine):
    url, model = server
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok"
    # what the engine runs in, for `loadtest --predict` (load_prediction.served_as)
    assert (health["dtype"], health["weights"]) == ("float32", "native")  # the fixture: the GGUF's own blocks
    assert (health["activations"], health["kv_dtype"]) == (engine.activations, engine.kv_dtype_name)
    assert [m.id for m in client.models.list().data] == [model]
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12, temperature=0)
    # The scheduler's chunked prefill (chunk 16 < P = 37) and step-wise decode give the engine's own answer.
    assert r.choices[0].message.content == engine.complete("What is the capital of France?", max_new_tokens=12).text
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == 37 and r.usage.completion_tokens == 8  # 7 of text and the EOS (as vLLM counts)
    timings = r.model_extra["timings"]
    assert set(timings) >= {"queue_s", "tokenize_s", "prefill_s", "ttft_s"}
    assert 0 < timings["prefill_s"] <= timings["ttft_s"] <= timings["total_s"]
    assert timings["predicted_ttft_s"] >= timings["predicted_prefill_s"] > 0 and timings["predicted_itl_s"] > 0


def test_stop_string_ends_the_answer_the_same_way_streamed(server, client):
    _, model = server
    kw = dict(model=model, messages=QUESTION, max_tokens=12, temperature=0, stop=[" Paris", "zzz"])
    full = client.chat.completions.create(**kw)
    assert full.choices[0].message.content == "The capital of France is"
    assert full.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The capital of France is"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stream_equals_non_stream_for_the_same_seed(server, client):
    _, model = server
    kw = dict(model=model, max_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    full = client.chat.completions.create(messages=QUESTION, **kw)
    parts, usage = [], None
    for chunk in client.chat.completions.create(
        messages=QUESTION, stream=True, stream_options={"include_usage": True}, **kw
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(parts) == full.choices[0].message.content
    assert usage.completion_tokens == full.usage.completion_tokens
    completion = dict(model=model, prompt="Once upon a time", max_tokens=10, temperature=0.8, seed=7)
    text = client.completions.create(**completion).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **completion) if c.choices)
    assert streamed == text and text


def test_sixteen_concurrent_streams_complete(server):
    url, model = server
    aclient = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)

    async def one(i: int) -> tuple[str, str]:
        stream = await aclient.completions.create(
            model=model, prompt=f"Item {i}: the number {i} is", max_tokens=6, temperature=0, stream=True
        )
        text, finish = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def all_of() -> list:
        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            await aclient.close()

    results = asyncio.run(all_of())
    assert len(results) == 16 and all(finish in ("stop", "length") for _, finish in results)
    assert sum(bool(text) for text, _ in results) >= 15  # an immediate EOS gives an empty text, rarely
    wait_idle(url)


def test_disconnect_mid_stream_frees_the_cache(server):
    url, model = server
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    body = {"model": model, "messages": story, "max_tokens": 200, "temperature": 0, "stream": True}
    # Once without disconnecting, so the prompt's blocks are in the prefix cache before we measure.
    httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 1}, timeout=120)
    wait_idle(url)
    kv0, prefix0 = metric(url, "prefill_kv_cache_bytes"), metric(url, "prefill_prefix_cache_bytes")
    done0 = metric(url, "prefill_generated_tokens_count")
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data:")
            if chunks == 3:
                assert metric(url, "prefill_kv_cache_bytes") > kv0  # the request holds its cache now
                break  # leaving the block closes the connection mid-stream
    wait_idle(url)
    assert metric(url, "prefill_kv_cache_bytes") == kv0 == 0
    assert metric(url, "prefill_prefix_cache_bytes") == prefix0
    assert metric(url, "prefill_generated_tokens_count") == done0  # dropped, never finished
    assert httpx.get(f"{url}/health").status_code == 200


def test_repeated_system_prompt_reuses_the_prefix(server, client):
    _, model = server
    system = "You are a geography tutor. " + " ".join(f"Fact {i}: capitals are cities." for i in range(10))
    messages = [{"role": "system", "content": system}, *QUESTION]
    a = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0)
    b = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens > 100
    assert b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 16  # all but a partial block
    assert b.usage.prompt_tokens_details.cached_tokens > a.usage.prompt_tokens_details.cached_tokens
    assert b.choices[0].message.content == a.choices[0].message.content


def test_a_cache_salt_shares_the_prefix_only_with_the_same_salt(server, client):
    """vLLM's cache_salt: the lesson page's switch to prefill without the prefix cache sends a new salt."""
    _, model = server
    system = "You are a history tutor. " + " ".join(f"Date {i}: kings had castles." for i in range(10))
    messages = [{"role": "system", "content": system}, *QUESTION]

    def cached(salt: str | None) -> tuple[int, int]:
        extra = {"cache_salt": salt} if salt is not None else {}
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=2, extra_body=extra)
        return r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens

    first, P = cached("one")
    assert first == 0 and P > 100
    assert cached("one")[0] >= P - 16  # all but a partial block
    assert cached("two")[0] == 0 and cached(None)[0] == 0  # another salt, and none: nothing shared
    assert cached(None)[0] >= P - 16


def test_a_new_servers_first_prefill_of_a_length_is_labelled_cold(engine):
    """A fresh server's worker has run no forward: its first prefill of a length is cold, the same length again
    is not (the page and the benchmarks leave cold ones out of warm figures)."""
    cfg = ServeConfig(model_id_of(engine), kv_cache_mb=64)
    with BackgroundServer(create_app(engine, cfg)) as url:
        body = {"model": cfg.model_id, "prompt": [300 + i for i in range(9)], "max_tokens": 2}
        cold = [_post(url, "/v1/completions", json=body).json()["timings"]["cold"] for _ in range(2)]
    assert cold == [True, False]


def _post(url, path, **kw):
    return httpx.post(f"{url}{path}", timeout=60, **kw)


@pytest.mark.parametrize(
    "case,status,code",
    [
        ("malformed JSON", 400, "invalid_json"),
        ("wrong type", 400, "invalid_value"),
        ("missing field", 400, "invalid_value"),
        ("unknown model", 404, "model_not_found"),
        ("prompt over context", 400, "context_length_exceeded"),
        ("max_tokens over limit", 400, "context_length_exceeded"),
        ("empty cache salt", 400, "invalid_value"),
        ("body over size limit", 413, "request_too_large"),
        ("unknown route", 404, "not_found"),
    ],
)
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(server, case, status, code):
    url, model = server
    ok = {"model": model, "prompt": "hi", "max_tokens": 2}
    requests = {
        "malformed JSON": lambda: _post(
            url, "/v1/completions", content=b'{"model": ', headers={"content-type": "application/json"}
        ),
        "wrong type": lambda: _post(url, "/v1/completions", json={**ok, "max_tokens": "2"}),
        "missing field": lambda: _post(url, "/v1/chat/completions", json={"model": model}),
        "unknown model": lambda: _post(url, "/v1/completions", json={**ok, "model": "gpt-9"}),
        "prompt over context": lambda: _post(url, "/v1/completions", json={**ok, "prompt": [1] * 8200}),
        "max_tokens over limit": lambda: _post(url, "/v1/completions", json={**ok, "max_tokens": 100_000}),
        "empty cache salt": lambda: _post(url, "/v1/completions", json={**ok, "cache_salt": ""}),
        "body over size limit": lambda: _post(url, "/v1/completions", json={**ok, "prompt": "x" * 300_000}),
        "unknown route": lambda: httpx.get(f"{url}/v1/nothing"),
    }
    r = requests[case]()
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["message"]
    assert httpx.get(f"{url}/health").status_code == 200


def test_openai_client_raises_its_own_errors(server, client):
    _, model = server
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="hi", max_tokens=100_000)
    assert e.value.code == "context_length_exceeded"


def test_full_queue_answers_429(engine):
    # One request runs, one waits, the rest are refused (--max-running 1 + --max-queue 1 places). Made
    # deterministic: A streams, so it runs once its first chunk arrives (and ignore_eos keeps it running); the
    # worker is then held between two steps (Worker.call) while B is queued and four more arrive; then A is closed
    # (cancelled) and B runs.
    cfg = ServeConfig(model_id_of(engine), max_queue=1, max_running=1, kv_cache_mb=256)
    app = create_app(engine, cfg)
    body = {"model": cfg.model_id, "prompt": " ".join(["history"] * 200), "max_tokens": 8, "temperature": 0}
    long = {"model": cfg.model_id, "prompt": "Count: 1, 2,", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    gate = threading.Event()
    with BackgroundServer(app) as url, httpx.Client(timeout=120) as http, ThreadPoolExecutor(1) as pool:
        with http.stream("POST", f"{url}/v1/completions", json=long) as a:
            lines = a.iter_lines()  # held: a line iterator let go closes the connection, and A would give its place up
            assert a.status_code == 200 and next(line for line in lines if line.startswith("data: "))
            held = app.state.server.worker.call(gate.wait)  # A decodes at most one more step, then waits
            b = pool.submit(http.post, f"{url}/v1/completions", json=body)
            for _ in range(600):  # bounded: 30 s
                if metric(url, "prefill_queued_requests") == 1:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("B was not queued")
            refused = [http.post(f"{url}/v1/completions", json=body, timeout=30) for _ in range(4)]  # a 429 at once
            gate.set()
        assert held.result(60) and b.result(120).status_code == 200
        assert [r.status_code for r in refused] == [429] * 4
        assert all(r.json()["error"]["code"] == "queue_full" for r in refused)
        assert all(r.headers["Retry-After"] == "1" for r in refused)  # seconds (RFC 9110)
        assert httpx.get(f"{url}/health").status_code == 200
        assert metric(url, 'prefill_errors_total{route="/v1/completions",status="429"}') == 4


def test_responses_never_read_the_calibration_file(server, monkeypatch):
    """The calibration is read once when the server starts, never again on the event loop for a response."""
    from prefill.costmodel import hardware

    url, model = server

    def read_again():
        raise AssertionError("the calibration file was read for a response")

    monkeypatch.setattr(hardware, "load_calibration", read_again)
    body = {"model": model, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["timings"]["predicted_by"], r.text


def test_the_machine_profile_is_read_before_the_server_starts(engine):
    """The time model's profile (probed once, or read from the cache) is loaded when the app is built, so no
    response's timings wait on a probe."""
    from prefill.engine.llm import Engine

    fresh = Engine(engine.runner, engine.tokenizer, engine.source)  # the same weights, nothing read yet
    assert not fresh._profiles
    create_app(fresh, ServeConfig(model_id_of(fresh), kv_cache_mb=16))
    assert fresh._profiles and fresh.profile().peak_flops_per_s > 0


def test_metrics_count_requests_and_tokens(server):
    url, _ = server
    text = httpx.get(f"{url}/metrics").text
    for name in (
        "prefill_ttft_seconds_bucket",
        "prefill_queue_seconds_count",
        "prefill_prefill_seconds_sum",
        "prefill_inter_token_latency_seconds_count",
        "prefill_prompt_tokens_count",
        "prefill_generated_tokens_sum",
        "prefill_requests_total",
        "prefill_errors_total",
        "prefill_cached_prompt_tokens_total",
    ):
        assert name in text
    assert metric(url, "prefill_cached_prompt_tokens_total") > 0
    assert metric(url, "prefill_ttft_seconds_count") >= 1


def test_loadtest_against_our_server(server, tmp_path):
    from prefill.loadtest.client import LoadTestConfig, PromptLengths, run_load_test
    from prefill.loadtest.report import summarize, write_json

    url, model = server
    cfg = LoadTestConfig(
        url, concurrency=2, duration_s=120, max_requests=4, prompt_lengths=PromptLengths(8, 24), max_tokens=6
    )
    records, wall, model_id = asyncio.run(run_load_test(cfg))
    assert model_id == model
    assert all(r.ok for r in records), [r.error for r in records]
    for r in records:
        assert 1 <= r.n_out <= 6 and r.usage_prompt_tokens >= 8
        assert 0 < r.first_content - r.start <= r.end - r.start
    s = summarize(records, wall, slo_ttft_s=1e3, slo_tpot_s=1e3)
    assert s["successful"] == 4 and s["output_tokens"] == sum(r.n_out for r in records)
    assert s["throughput_output_tok_per_s"] > 0 and s["goodput_req_per_s"] == pytest.approx(4 / wall)
    write_json(tmp_path / "lt.json", {"url": url}, s, records)
    assert json.loads((tmp_path / "lt.json").read_text())["summary"]["requests"] == 4
