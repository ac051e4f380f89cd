"""Scoring: the log-probability of every token of a text given the tokens before it, in one prefill.

Generation unembeds the last position only; scoring is the same parallel pass with the unembedding applied to
every position (position j's hidden state predicts token j + 1). The model returns its final-normed hidden states
[1, P, d_model]; they are unembedded and log-softmaxed `slice_size` positions at a time, so at most
[slice_size, vocab] logits exist at once, never [P, vocab]. Long texts are prefilled in chunks against the growing
cache, with the same results.

Perplexity over texts longer than a window follows Hugging Face's "Perplexity of fixed-length models" guide: windows
of `window` tokens every `stride` tokens, each window scoring only the tokens the previous one did not.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from prefill.costmodel import costs
from prefill.engine.kvcache import SeqKV
from prefill.engine.prompt import check_chunk_size, check_prompt
from prefill.engine.scores import SLICE, ScoreAccumulator, Scores
from prefill.errors import BadInput

if TYPE_CHECKING:
    from prefill.engine.kv_tier import StoreTier
    from prefill.engine.runner import ModelRunner


@torch.inference_mode()
def prefill_scored(runner: ModelRunner, ids: list[int], seq: SeqKV, acc: ScoreAccumulator) -> None:
    """Prefill `ids` at positions seq.length.. (one chunk) and hand their hidden states to `acc`."""
    pos0 = seq.length
    x = torch.tensor([ids], dtype=torch.long)  # [1, C]
    h = runner.forward(x, [seq], output="hidden")  # [1, C, d_model]
    acc.add(h[0], pos0)


def check_ids(runner: ModelRunner, ids: list[int], least: int = 1, windowed: bool = False) -> None:
    """Refuse sequences that are too short, too long (unless scored in windows: a hint says so) or hold ids outside
    the vocabulary (prefill.engine.prompt)."""
    if len(ids) < least:
        raise BadInput(f"scoring needs at least {least} tokens, got {len(ids)}")
    try:
        check_prompt(ids, runner.spec, within_context=not windowed)
    except BadInput as e:
        hint = "; use a window (--window) and a stride" if "context length" in str(e) else ""
        raise BadInput(f"{e}{hint}") from None


def score(
    runner: ModelRunner,
    ids: list[int],
    *,
    top_k: int = 0,
    start: int = 1,
    chunk_size: int | None = None,
    slice_size: int = SLICE,
    kv_tier: StoreTier | None = None,
) -> Scores:
    """Score ids [P] in one prefill (or chunks of `chunk_size` against the growing cache): for every position
    j >= start, log p(ids[j] | ids[:j]), whether ids[j] was the argmax, and the top_k alternatives. With a KV
    store (`kv_tier`), the context before start - 1 (whose hidden states no score needs) may be loaded from it,
    and the sequence's whole blocks are stored afterwards."""
    ids = [int(i) for i in ids]
    check_ids(runner, ids)
    check_chunk_size(chunk_size)
    acc = ScoreAccumulator(ids, runner.model, top_k, start, slice_size)
    t0 = time.perf_counter()
    cache = runner.new_cache(len(ids))
    if kv_tier is not None:
        kv_tier.load(ids, cache, chunk_size, limit=start - 1)
    done = cache.length
    for s, e in costs.prefill_chunks(len(ids) - done, chunk_size):
        prefill_scored(runner, ids[done + s : done + e], cache, acc)
    runner.sync()
    if kv_tier is not None:
        kv_tier.save_seq(ids, cache)
    return acc.result(time.perf_counter() - t0)


@dataclass(frozen=True)
class Window:
    """One window of a sliding-window evaluation: tokens [begin, end), of which the last `new` are targets."""

    begin: int
    end: int
    new: int  # the guide's trg_len: end - previous end


@dataclass(frozen=True)
class Perplexity:
    """Sliding-window perplexity as Hugging Face's guide computes it, with every scored token's log-probability."""

    ppl: float
    nll: float  # the guide's average negative log-likelihood per token (nats): log(ppl)
    tokens: int  # the guide's n_tokens: sum over windows of (new - 1)
    logprobs: list[float | None]  # [P]: log p of each token in the window that scored it; None for token 0
    windows: list[Window]
    seconds: float  # all windows' prefills, measured
    window: int
    stride: int


def windows(P: int, window: int, stride: int) -> list[Window]:
    """The guide's loop: begin = 0, stride, 2*stride, ...; end = min(begin + window, P); stop once end == P."""
    if window < 1 or stride < 1:
        raise BadInput(f"window and stride must be >= 1, got {window} and {stride}")
    if stride > window:
        raise BadInput(f"stride {stride} is larger than the window {window}: tokens between windows would be skipped")
    out, prev_end = [], 0
    for begin in range(0, P, stride):
        end = min(begin + window, P)
        out.append(Window(begin, end, end - prev_end))
        prev_end = end
        if end == P:
            break
    return out


def perplexity(
    runner: ModelRunner,
    ids: list[int],
    window: int | None = None,
    stride: int | None = None,
    chunk_size: int | None = None,
    kv_tier: StoreTier | None = None,
) -> Perplexity:
    """Perplexity of ids with windows of `window` tokens (default: the whole text, up to the context length) every
    `stride` tokens (default: the window).

    Exactly the guide's arithmetic: each window's mean NLL over its targets (its last `new` tokens, the first token of
    the first window excepted) is weighted by new - 1 (the guide's num_valid_tokens - batch_size), and
    ppl = exp(sum of weighted means / sum of weights). For one window, or windows that do not overlap, that is the
    plain mean over every token but the first; for overlapping windows the guide weights each later window by one
    token less than it scores, and so do we, so that the numbers match.
    """
    ids = [int(i) for i in ids]
    ctx = runner.spec.context_length
    window = window or min(len(ids), ctx)
    stride = stride or window
    if window > ctx:
        raise BadInput(f"window {window} is larger than the model's context length {ctx}")
    check_ids(runner, ids, least=2, windowed=True)
    logprobs: list[float | None] = [None] * len(ids)
    nll_sum, n_tokens, seconds = 0.0, 0, 0.0
    plan = windows(len(ids), window, stride)
    for w in plan:
        first = max(1, (w.end - w.begin) - w.new)  # first target, within the window
        if first >= w.end - w.begin:
            continue  # a one-token window scores nothing (the guide would add 0 x NaN)
        s = score(runner, ids[w.begin : w.end], start=first, chunk_size=chunk_size, kv_tier=kv_tier)
        seconds += s.seconds
        lp = s.logprobs.double()
        logprobs[w.begin + first : w.end] = lp.tolist()
        nll_sum += float(-lp.mean()) * (w.new - 1)
        n_tokens += w.new - 1
    if n_tokens == 0:
        raise BadInput("nothing to score: the text needs at least 2 tokens")
    nll = nll_sum / n_tokens
    return Perplexity(math.exp(nll), nll, n_tokens, logprobs, plan, seconds, window, stride)
