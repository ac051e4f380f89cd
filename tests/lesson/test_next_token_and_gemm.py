"""The page's additions of issue #53 over HTTP: the first answer token's probabilities (POST /api/next-token)
against the server's own log-probabilities of the same token, prefill's GEMM against decode's (GET /api/gemm) on
the model's shapes, the chat template's words, the KV-store inputs said in the page's units, and why a slow
prefill was slow (regime.slow_words)."""

from __future__ import annotations

import math

import httpx
import pytest

from prefill.lesson.nexttoken import MAX_NEXT_TEXT
from prefill.lesson.regime import slow_words
from prefill.server.app import model_id_of

PARIS = "The capital of France is"


def test_next_token_probabilities_agree_with_the_servers_logprobs(url, smollm):
    r = httpx.post(f"{url}/api/next-token", json={"text": PARIS, "lookup": " Paris", "top": 5}, timeout=120)
    assert r.status_code == 200, r.text
    a = r.json()
    ps = [t["p"] for t in a["top"]]
    assert ps == sorted(ps, reverse=True) and 0 < sum(ps) <= 1 + 1e-6 and a["vocab"] == smollm.spec.vocab_size
    look = a["lookup"]
    assert look["tokens"] == [" Paris"] and look["rank"] == 1 + sum(p > look["p"] for p in ps)
    # The serving path (its KV cache, its fused attention) gives the same distribution: the completion's own
    # log-probabilities of its first token and of its top alternatives. float32 both ways; the two differ only in
    # reduction order, a few ulps of each logit, far below the 1e-4 allowed on a log-probability.
    body = {"model": model_id_of(smollm), "prompt": PARIS, "max_tokens": 1, "temperature": 0, "logprobs": 5}
    served = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]
    assert served["text"] == a["chosen"]["token"]
    top = served["logprobs"]["top_logprobs"][0]
    for t in a["top"]:
        assert top[t["token"]] == pytest.approx(math.log(t["p"]), abs=1e-4), t
    too_long = httpx.post(f"{url}/api/next-token", json={"text": PARIS, "top": 51})
    assert too_long.status_code == 400
    long = httpx.post(f"{url}/api/next-token", json={"text": "x" * (MAX_NEXT_TEXT + 1)})  # over the document's bound
    assert long.status_code == 400 and f"at most {MAX_NEXT_TEXT:,} characters" in long.json()["error"]["message"]


def test_the_gemm_of_prefill_and_of_a_decode_step(url, smollm):
    s = smollm.spec
    n = (s.H_q + 2 * s.H_kv) * s.d_head  # the fused Q, K, V projection's columns
    g = httpx.get(f"{url}/api/gemm", params={"P": 7}, timeout=120).json()
    pre, dec = g["prefill"], g["decode"]
    assert (pre["x"], pre["w"], dec["x"], dec["w"]) == ([7, s.d_model], [s.d_model, n], [1, s.d_model], [s.d_model, n])
    assert pre["flops"] == pytest.approx(2 * 7 * s.d_model * n) and g["flops_ratio"] == pytest.approx(7)
    assert pre["weight_bytes"] == dec["weight_bytes"] == s.d_model * n * 4  # float32 weights, read once a forward
    assert pre["intensity"] > dec["intensity"] and not g["chunked"]
    chunked = httpx.get(f"{url}/api/gemm", params={"P": 300}, timeout=120).json()  # the server's chunks of 256
    assert chunked["chunked"] and chunked["prefill"]["M"] == 256
    for bad in (0, s.context_length + 1):
        assert httpx.get(f"{url}/api/gemm", params={"P": bad}).status_code == 400


def test_the_chat_templates_own_tokens_are_said(url):
    t = httpx.get(f"{url}/api/tokens", params={"text": "AI is fast", "chat": 1}).json()
    raw = httpx.get(f"{url}/api/tokens", params={"text": "AI is fast"}).json()
    tpl = t["template"]
    assert tpl["system"] and "You are a helpful AI assistant" in tpl["before"]
    assert tpl["tokens"] == t["P"] - raw["P"] and raw["template"] is None


@pytest.mark.parametrize(
    "params,words",
    [
        ({"P": -5}, "the stored prefix must be at least 1 token and at most 10,000,000 tokens; you typed -5 tokens"),
        (
            {"rate": 1e18},
            "the read speed must be at least 0.001 GB/s and at most 10,000,000 GB/s; you typed 1,000,000,000 GB/s",
        ),
        ({"P": 10**6}, "the stored prefix must be at most {context:,} tokens, this model's context length; you typed"),
    ],
)
def test_the_kv_store_inputs_are_refused_in_the_pages_units(url, smollm, params, words):
    r = httpx.get(f"{url}/api/compute-or-load/at", params=params)
    said = words.format(context=smollm.spec.context_length)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(said), r.text


def test_a_slow_prefill_names_every_cause_and_only_true_ones():
    cold = slow_words(-0.87, cold=True, computed=1816, itl_error=None)
    assert "8 times slower" in cold and "Being cold is one cause" in cold and "PyTorch's threads wait" in cold
    warm = slow_words(-0.9, cold=False, computed=3, itl_error=-0.8)
    assert "Yet it was warm" in warm and "The decode steps ran 5 times slower" in warm
    for words in (cold, warm):
        assert "switch" not in words and "prediction counts exactly the" in words
    assert slow_words(-0.2, cold=True, computed=3, itl_error=None) == ""
