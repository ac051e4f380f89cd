"""Chaos: 16 concurrent clients send a random mix of valid and invalid requests (bounded in count and time), a
few disconnecting mid-stream. Afterwards every valid request completed, KV bytes in use are back to zero, the
worker is alive, and the counters add up: received = requests + errors + cancelled."""

from __future__ import annotations

import asyncio
import json
import random
import re

import httpx
import pytest

from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = pytest.mark.slow
CLIENTS, PER_CLIENT = 16, 5
# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
PERSON = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}
# fmt: on


def totals(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    out = {}
    for family in ("received_requests", "requests", "errors", "cancelled"):
        name = f"prefill_{family}_total"
        out[family] = sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE))
    for gauge in ("kv_cache_bytes", "running_requests", "queued_requests"):
        out[gauge] = float(re.search(rf"^prefill_{gauge} (\S+)$", text, re.MULTILINE).group(1))
    return out


def valid(model: str, rng: random.Random) -> tuple[str, dict]:
    n = rng.randint(1, 6)
    return rng.choice(
        [
            ("/v1/completions", {"model": model, "prompt": f"Number {n} is", "max_tokens": n, "temperature": 0}),
            (
                "/v1/completions",
                {"model": model, "prompt": "Once", "max_tokens": n, "temperature": 0.7, "seed": n, "stream": True},
            ),
            (
                "/v1/chat/completions",
                {
                    "model": model,
                    "messages": [{"role": "user", "content": f"Say {n}"}],
                    "max_tokens": n,
                    "stream": rng.random() < 0.5,
                    "temperature": 1e-45,
                },
            ),
            (
                "/v1/chat/completions",
                {
                    "model": model,
                    "messages": [{"role": "user", "content": "Is water wet?"}],
                    "max_tokens": 12,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "a", "schema": PERSON, "strict": True},
                    },
                },
            ),
            (
                "/v1/completions",
                {
                    "model": model,
                    "prompt": "The sky is",
                    "max_tokens": n,
                    "logit_bias": {"198": -100},
                    "top_p": 1e-300,
                    "temperature": 1,
                },
            ),
        ]
    )


def invalid(model: str, rng: random.Random) -> tuple[str, dict | str]:
    ok = {"model": model, "prompt": "Hi", "max_tokens": 2}
    return rng.choice(
        [
            ("/v1/completions", {**ok, "seed": 18446744073709551616, "temperature": 1}),
            ("/v1/completions", json.dumps(ok).replace('"Hi"', '"Hi \\ud800"')),
            ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "x"}], "echo": True}),
            ("/v1/completions", {**ok, "max_tokens": "2"}),
            ("/v1/completions", {**ok, "model": "gpt-9"}),
            ("/v1/completions", {**ok, "max_tokens": 100_000}),
            ("/v1/completions", '{"model": '),
            ("/v1/completions", {**ok, "logprobs": 21}),
            (
                "/v1/chat/completions",
                {
                    "model": model,
                    "messages": [{"role": "user", "content": "x"}],
                    "tool_choice": "required",  # a call demanded, and no tool to call
                },
            ),
        ]
    )


async def send(http: httpx.AsyncClient, url: str, path: str, body) -> httpx.Response:
    if isinstance(body, str):
        return await http.post(url + path, content=body.encode(), headers={"content-type": "application/json"})
    return await http.post(url + path, json=body)


async def disconnect(http: httpx.AsyncClient, url: str, model: str) -> None:
    body = {"model": model, "prompt": "Write a long story:", "max_tokens": 60, "temperature": 0, "stream": True}
    async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200
        seen = 0
        async for line in r.aiter_lines():
            seen += line.startswith("data: ")
            if seen == 2:
                return  # leaving the block closes the connection mid-stream


async def client(i: int, url: str, model: str, log: list) -> None:
    rng = random.Random(1000 + i)
    async with httpx.AsyncClient(timeout=240) as http:
        for _ in range(PER_CLIENT):
            roll = rng.random()
            if roll < 0.08:
                await disconnect(http, url, model)
                log.append(("disconnect", None))
            elif roll < 0.5:
                path, body = invalid(model, rng)
                log.append(("invalid", await send(http, url, path, body)))
            else:
                path, body = valid(model, rng)
                log.append(("valid", await send(http, url, path, body)))


def test_chaos_leaves_the_server_serving_and_the_books_balanced(smollm):
    engine = smollm
    cfg = ServeConfig(
        model_id_of(engine), chunk_size=32, max_tokens_limit=64, max_running=8, max_queue=128, kv_cache_mb=256
    )
    app = create_app(engine, cfg)
    with BackgroundServer(app) as url:
        before = totals(url)
        log: list = []

        async def all_clients():
            await asyncio.wait_for(asyncio.gather(*(client(i, url, cfg.model_id, log) for i in range(CLIENTS))), 600)

        asyncio.run(all_clients())
        kinds = [k for k, _ in log]
        assert len(log) == CLIENTS * PER_CLIENT and kinds.count("disconnect") >= 2 and kinds.count("invalid") >= 10
        for kind, r in log:
            if kind == "valid":
                assert r.status_code == 200, r.text
                if r.headers["content-type"].startswith("text/event-stream"):
                    events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
                    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"]
                else:
                    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
            elif kind == "invalid":
                assert 400 <= r.status_code < 500 and r.json()["error"]["message"], r.text
        for _ in range(200):  # bounded: 20 s for the last disconnects to be noticed and dropped
            after = totals(url)
            if after["running_requests"] == after["queued_requests"] == 0 and after["received_requests"] == (
                after["requests"] + after["errors"] + after["cancelled"]
            ):
                break
            asyncio.run(asyncio.sleep(0.1))
        d = {k: after[k] - before[k] for k in ("received_requests", "requests", "errors", "cancelled")}
        assert d["received_requests"] == len(log)
        assert d["received_requests"] == d["requests"] + d["errors"] + d["cancelled"]
        assert d["errors"] == kinds.count("invalid")
        assert d["requests"] + d["cancelled"] == kinds.count("valid") + kinds.count("disconnect")
        assert d["requests"] >= kinds.count("valid")
        assert after["kv_cache_bytes"] == 0
        assert app.state.server.worker.alive() and httpx.get(f"{url}/health").status_code == 200
