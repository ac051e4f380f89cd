"""The attention probe agrees with the model: its K is what a prefill writes into the cache, A @ V is the
model's attention output, and A is a causal softmax (upper triangle exactly 0, rows summing to 1)."""

from __future__ import annotations

import pytest
import torch

from prefill.errors import BadInput
from prefill.lesson.probe import MAX_P, attention_weights, layer_qkv
from prefill.model.attention import causal_attention

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompt(smollm):
    return smollm.encode_prompt("The quick brown fox jumps over the lazy dog.", chat=False)


@pytest.mark.parametrize("layer", [0, 13, 29])
def test_keys_equal_what_prefill_writes_into_the_cache(smollm, prompt, layer):
    P = len(prompt)
    _, cache = smollm.prefill(prompt)
    got = layer_qkv(smollm.model, prompt, layer)
    assert got.k.shape == (1, smollm.spec.H_kv, P, smollm.spec.d_head)
    assert cache.length == P
    torch.testing.assert_close(got.k, cache.k(layer), rtol=1e-5, atol=1e-5)  # [1, H_kv, P, d_head]
    torch.testing.assert_close(got.v, cache.v(layer), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer,head", [(0, 0), (7, 4), (29, 8)])
def test_weights_are_a_causal_softmax_that_reproduces_the_attention_output(smollm, prompt, layer, head):
    P = len(prompt)
    A = attention_weights(smollm.model, prompt, layer, head)  # [P, P]
    assert A.shape == (P, P)
    assert torch.all(A.triu(1) == 0)  # the masked future: exactly zero
    torch.testing.assert_close(A.sum(-1), torch.ones(P), rtol=0, atol=1e-5)
    assert torch.all(A[torch.ones(P, P, dtype=torch.bool).tril()] > 0)  # every allowed pair gets some weight
    t = layer_qkv(smollm.model, prompt, layer)
    group = smollm.spec.H_q // smollm.spec.H_kv
    o = causal_attention(t.q, t.k, t.v, 0)[0, head]  # [P, d_head]: the model's own attention output
    torch.testing.assert_close(A @ t.v[0, head // group].float(), o.float(), rtol=1e-4, atol=1e-4)


def test_first_token_attends_only_to_itself(smollm, prompt):
    A = attention_weights(smollm.model, prompt, 5, 2)
    assert A[0, 0].item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    "layer,head,n,match",
    [
        (30, 0, 3, "layer must be in"),
        (-1, 0, 3, "layer must be in"),
        (0, 9, 3, "head must be in"),
        (0, 0, MAX_P + 1, "prompts of 1..64 tokens"),
        (0, 0, 0, "prompts of 1..64 tokens"),
    ],
)
def test_bad_layer_head_or_length_is_refused(smollm, layer, head, n, match):
    with pytest.raises(BadInput, match=match):
        attention_weights(smollm.model, list(range(1, n + 1)), layer, head)
