"""Scoring on the real embedded model against transformers (float32): every position's log-probability, chunked
equals one pass, and sliding-window perplexity computed by the loop of Hugging Face's perplexity guide."""

from __future__ import annotations

import math

import pytest
import torch

from prefill.engine import scoring
from prefill.errors import BadInput

pytestmark = pytest.mark.slow

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin is the capital of Germany. Rome is the capital of",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Zebras quietly juggle seventeen purple umbrellas beneath the volcanic observatory.",
]
LONG = " ".join(
    f"Chapter {i}. The river rose in the spring of year {1900 + i}, and the village moved its market uphill."
    for i in range(6)
)


def reference_logprobs(reference, ids: list[int]) -> torch.Tensor:
    """transformers: log_softmax of its logits at every position, gathered at the next token: [P - 1]."""
    with torch.inference_mode():
        logits = reference(torch.tensor([ids])).logits[0].float()  # [P, vocab]
    return torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def guide_perplexity(reference, ids: list[int], max_length: int, stride: int) -> float:
    """The loop of Hugging Face's "Perplexity of fixed-length models" guide, verbatim in its arithmetic."""
    encodings = torch.tensor([ids])
    seq_len = encodings.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = encodings[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            neg_log_likelihood = reference(input_ids, labels=target_ids).loss
        num_loss_tokens = (target_ids != -100).sum().item() - target_ids.size(0)
        nll_sum += neg_log_likelihood * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return float(torch.exp(nll_sum / n_tokens))


@pytest.mark.parametrize("text", TEXTS)
def test_every_position_logprob_equals_transformers(smollm, smollm_reference, text):
    ids = smollm.tokenizer.encode(text, add_special_tokens=True)
    s = scoring.score(smollm, ids, top_k=5)
    ref = reference_logprobs(smollm_reference, ids)
    assert s.logprobs.shape == ref.shape == (len(ids) - 1,)
    assert float((s.logprobs - ref).abs().max()) <= 1e-4
    # The top-k alternatives are sorted, the first is the argmax, and the actual token is among them iff it ranks.
    assert torch.all(s.top_logprobs[:, :-1] >= s.top_logprobs[:, 1:])
    assert torch.equal(s.is_argmax, s.top_ids[:, 0] == torch.tensor(ids[1:]))
    assert torch.all(s.top_logprobs[:, 0] >= s.logprobs - 1e-6)
    assert s.nll == pytest.approx(-float(ref.double().sum()), abs=1e-3)


def test_chunked_and_sliced_scoring_equals_one_pass(smollm):
    ids = smollm.tokenizer.encode(LONG)
    one = scoring.score(smollm, ids, top_k=3)
    one_pass = {len(ids): one, 40: scoring.score(smollm, ids[:40], top_k=3)}
    for chunk, slice_size, n in ((1, 256, 40), (16, 5, len(ids)), (100, 64, len(ids))):  # a token a forward: 40
        s, one = scoring.score(smollm, ids[:n], top_k=3, chunk_size=chunk, slice_size=slice_size), one_pass[n]
        assert float((s.logprobs - one.logprobs).abs().max()) <= 1e-4
        assert torch.equal(s.top_ids, one.top_ids) and torch.equal(s.is_argmax, one.is_argmax)
        assert float((s.next_logits - one.next_logits).abs().max()) <= 1e-4


def test_scoring_from_a_later_position_scores_only_the_tail(smollm):
    ids = smollm.tokenizer.encode(TEXTS[1])
    full, tail = scoring.score(smollm, ids), scoring.score(smollm, ids, start=len(ids) - 3)
    assert tail.logprobs.shape == (3,)
    assert float((tail.logprobs - full.logprobs[-3:]).abs().max()) <= 1e-5


def test_next_logits_equal_the_generation_prefill(smollm):
    ids = smollm.encode_prompt("What is the capital of France?")
    logits, _ = smollm.prefill(ids)
    assert float((scoring.score(smollm, ids).next_logits - logits[0]).abs().max()) <= 1e-4


@pytest.mark.parametrize("window,stride", [(None, None), (64, 64), (64, 29)])
def test_perplexity_equals_the_guide_loop_on_transformers(smollm, smollm_reference, window, stride):
    ids = smollm.tokenizer.encode(LONG)
    assert len(ids) > 150
    ours = scoring.perplexity(smollm, ids, window=window, stride=stride)
    ref = guide_perplexity(smollm_reference, ids, window or len(ids), stride or window or len(ids))
    assert ours.ppl == pytest.approx(ref, rel=1e-4)
    assert ours.nll == pytest.approx(math.log(ours.ppl))
    scored = [j for j, lp in enumerate(ours.logprobs) if lp is not None]
    if stride is None or stride < window:  # overlapping windows: every token but the first, once
        assert scored == list(range(1, len(ids)))
    else:  # windows side by side: a window's first token has no context in it and is not scored
        assert scored == [j for j in range(1, len(ids)) if j % window]
    if window is None:
        assert ours.tokens == len(ids) - 1 and len(ours.windows) == 1


def test_windows_follow_the_guide():
    ws = scoring.windows(10, 4, 3)
    assert [(w.begin, w.end, w.new) for w in ws] == [(0, 4, 4), (3, 7, 3), (6, 10, 3)]
    assert [(w.begin, w.end, w.new) for w in scoring.windows(5, 5, 5)] == [(0, 5, 5)]
    with pytest.raises(BadInput, match="larger than the window"):
        scoring.windows(10, 4, 5)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda e: scoring.score(e, []), "at least 1"),
        (lambda e: scoring.score(e, [1, 2, 10**6]), "token ids"),
        (lambda e: scoring.score(e, [1] * 9000), "context length"),
        (lambda e: scoring.score(e, [1, 2, 3], chunk_size=0), "chunk size"),
        (lambda e: scoring.perplexity(e, [5]), "at least 2"),
        (lambda e: scoring.perplexity(e, [1, 2, 3], window=9000), "context length"),
        (lambda e: scoring.perplexity(e, [1, 2, 3], window=2, stride=3), "larger than the window"),
    ],
)
def test_bad_input_is_refused(smollm, call, match):
    with pytest.raises(BadInput, match=match):
        call(smollm)


def test_a_scoring_request_runs_in_the_step_loop_beside_a_generation(smollm):
    """The server's path without HTTP: a scoring request (prompt_logprobs, max_tokens 0) and a generation share one
    step loop and KV pool; its chunked, all-position scores equal scoring.score and the pool empties."""
    from prefill.engine.kvcache import KVPool
    from prefill.engine.loop import StepLoop
    from prefill.engine.prefix_cache import RadixPrefixCache
    from prefill.engine.request import Generation, Request
    from prefill.engine.sampling import SamplingParams

    pool = KVPool.for_tokens(smollm.spec, 1024, smollm.dtype, smollm.device)
    loop = StepLoop(smollm.runner, pool, RadixPrefixCache(pool, 0), chunk_size=7)
    ids = smollm.tokenizer.encode(TEXTS[1])
    done: list[Generation] = []
    keep = lambda ev: done.append(ev) if isinstance(ev, Generation) else None  # noqa: E731
    greedy = SamplingParams(temperature=0.0)
    scoring_req = Request(ids, 0, greedy, smollm.tokenizer, keep, prompt_logprobs=3)
    chat = Request(smollm.encode_prompt("Name a colour."), 4, greedy, smollm.tokenizer, keep, logprobs=2)
    loop.add(chat)
    loop.add(scoring_req)
    while loop.busy:
        loop.step()
    scored = next(g for g in done if g.prompt_scores is not None)
    direct = scoring.score(smollm, ids, top_k=3)
    assert scored.token_ids == [] and scored.finish_reason == "length"
    assert float((scored.prompt_scores.logprobs - direct.logprobs).abs().max()) <= 1e-4
    assert torch.equal(scored.prompt_scores.top_ids, direct.top_ids)
    generated = next(g for g in done if g is not scored)
    assert len(generated.logprobs) >= len(generated.token_ids) >= 1  # each token's logprob (and EOS's, if it came)
    assert all(len(ev.top_logprobs) == 2 and ev.top_logprobs[0][1] >= ev.logprob for ev in generated.logprobs)
    assert pool.used_blocks == 0
