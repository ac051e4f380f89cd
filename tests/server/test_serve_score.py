"""Scoring and logprobs through the server on the real model: echo + logprobs equal transformers', lists of prompts,
max_tokens 0, chat logprobs, streamed logprobs, the official `openai` client on both endpoints, and clean 400s."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = pytest.mark.slow

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "def add(a, b):\n    return a + b\n",
]


@pytest.fixture(scope="module")
def server(smollm):
    cfg = ServeConfig(model_id_of(smollm), chunk_size=8, max_echo_tokens=200, max_tokens_limit=64)
    with BackgroundServer(create_app(smollm, cfg)) as url:
        yield url, cfg.model_id


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=300)


def reference_logprobs(reference, ids: list[int]) -> list[float]:
    with torch.inference_mode():
        logits = reference(torch.tensor([ids])).logits[0].float()  # [P, vocab]
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def scored_counter(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("prefill_scored_prompt_tokens_total "):
            return float(line.split()[1])
    raise AssertionError("prefill_scored_prompt_tokens_total is not in /metrics")


def test_echo_scoring_equals_transformers_for_a_list_of_prompts(server, smollm, smollm_reference):
    url, model = server
    before = scored_counter(url)
    r = post(url, "/v1/completions", {"model": model, "prompt": TEXTS, "echo": True, "max_tokens": 0, "logprobs": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    total = 0
    for text, choice in zip(TEXTS, body["choices"], strict=True):
        ids = smollm.tokenizer.encode(text, add_special_tokens=True)
        total += len(ids)
        lp = choice["logprobs"]
        assert choice["text"] == text and choice["finish_reason"] == "length"
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids)
        assert "".join(lp["tokens"]) == text and lp["text_offset"][0] == 0
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        ours = lp["token_logprobs"][1:]
        assert max(abs(a - b) for a, b in zip(ours, reference_logprobs(smollm_reference, ids), strict=True)) <= 1e-4
        for token, chosen, top in zip(lp["tokens"][1:], ours, lp["top_logprobs"][1:], strict=True):
            assert top[token] == chosen and 5 <= len(top) <= 6  # the chosen token plus the 5 most likely
    assert body["usage"]["prompt_tokens"] == total and body["usage"]["completion_tokens"] == 0
    assert scored_counter(url) == before + total  # a scoring request is counted in /metrics


def test_token_id_prompt_with_one_generated_token_as_lm_eval_sends_it(server, smollm, smollm_reference):
    url, model = server
    ids = smollm.tokenizer.encode(TEXTS[1])
    r = post(
        url,
        "/v1/completions",
        {"model": model, "prompt": [ids], "echo": True, "max_tokens": 1, "logprobs": 1, "temperature": 0},
    )
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt, then the generated token (lm-eval drops it)
    ref = reference_logprobs(smollm_reference, ids)
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"][1:-1], ref, strict=True)) <= 1e-4
    with torch.inference_mode():
        last = torch.log_softmax(smollm_reference(torch.tensor([ids])).logits[0, -1].float(), -1)  # [vocab]
    assert lp["token_logprobs"][-1] == pytest.approx(float(last.max()), abs=1e-4)  # greedy: the argmax's


def test_stream_carries_the_logprobs_of_each_chunk(server):
    url, model = server
    body = {
        "model": model,
        "prompt": "Once upon a time",
        "echo": True,
        "max_tokens": 5,
        "logprobs": 2,
        "temperature": 0,
    }
    full = post(url, "/v1/completions", body).json()["choices"][0]
    tokens, logprobs, text = [], [], ""
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += choice["text"]
            if choice["logprobs"]:
                tokens += choice["logprobs"]["tokens"]
                logprobs += choice["logprobs"]["token_logprobs"]
    assert text == full["text"] and tokens == full["logprobs"]["tokens"]
    assert logprobs == full["logprobs"]["token_logprobs"]


def test_openai_client_reads_logprobs_from_both_endpoints(server, client):
    _, model = server
    r = client.completions.create(
        model=model, prompt="The capital of France is", echo=True, max_tokens=2, logprobs=3, temperature=0
    )
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith("The capital of France is")
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert len(lp.tokens) == len(lp.text_offset) == r.usage.prompt_tokens + r.usage.completion_tokens
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    for c in content:
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob >= c.logprob
        assert c.top_logprobs[0].token == c.token  # greedy: the chosen token is the most likely
    streamed = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=1, stream=True
    )
    tokens = [
        c.token for ch in streamed if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content
    ]
    assert tokens == [c.token for c in content]


@pytest.mark.parametrize(
    "path,extra,param",
    [
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
        ("/v1/completions", {"logprobs": -1}, "logprobs"),
        ("/v1/completions", {"max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"echo": True, "max_tokens": 0, "logprobs": 1, "prompt": "word " * 250}, "echo"),
        ("/v1/completions", {"prompt": ["a", "b"], "stream": True}, "prompt"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_limits_get_a_clean_400(server, path, extra, param):
    url, model = server
    base = {"model": model, "max_tokens": 2}
    base.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})
    r = post(url, path, {**base, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"] == "invalid_request_error"
    assert httpx.get(f"{url}/health").status_code == 200


def counters(url: str) -> dict[str, float]:
    """Each counter family of /metrics summed over its labels."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("prefill_") and line.split("{")[0].split()[0].endswith("_total"):
            family = line.split("{")[0].split()[0]
            out[family] = out.get(family, 0.0) + float(line.split()[-1])
    return out


def test_a_list_of_prompts_is_one_request_in_the_counters_and_limits_hold_over_the_list(server):
    url, model = server
    before = counters(url)
    r = post(url, "/v1/completions", {"model": model, "prompt": [[1, 2, 3], [4, 5], [6]], "max_tokens": 1})
    assert r.status_code == 200 and [c["index"] for c in r.json()["choices"]] == [0, 1, 2], r.text
    refused = [
        {"prompt": [[1, 2], [10**7]]},  # a token id outside the vocabulary, in the second prompt
        {"prompt": ["fine", ""]},  # an empty prompt in a list
        {"prompt": [[7] * 150, [7] * 150], "echo": True, "logprobs": 0, "max_tokens": 0},  # 300 scored > 200
        {"prompt": ["x"] * 65},  # more prompts than the server takes
    ]
    for extra in refused:
        assert post(url, "/v1/completions", {"model": model, "max_tokens": 1, **extra}).status_code == 400, extra
    after = counters(url)
    d = {
        f: after.get(f, 0) - before.get(f, 0)
        for f in ("prefill_received_requests_total", "prefill_requests_total", "prefill_errors_total")
    }
    assert d == {"prefill_received_requests_total": 5, "prefill_requests_total": 1, "prefill_errors_total": 4}


def test_tokenizer_endpoints(server, smollm):
    url, _ = server
    ids = post(url, "/tokenize", {"prompt": "Hello world", "add_special_tokens": False}).json()["tokens"]
    assert ids == smollm.tokenizer.encode("Hello world")
    assert post(url, "/detokenize", {"tokens": ids}).json()["prompt"] == "Hello world"
    info = httpx.get(f"{url}/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and "im_start" in info["chat_template"]
    assert post(url, "/detokenize", {"tokens": [10**7]}).status_code == 400
