"""The scheduler and its step loop on the real model, without HTTP: chunked prefill of a long prompt interleaves
with the batched decode steps of running streams (an ordering of events, not a timing), and the pool's
blocks all come back."""

from __future__ import annotations

import threading

import pytest

from prefill.engine.kvcache import KVPool
from prefill.engine.loop import StepLoop
from prefill.engine.prefix_cache import RadixPrefixCache
from prefill.engine.request import Generation, Request, TokenEvent
from prefill.engine.sampling import SamplingParams
from prefill.errors import BadInput
from prefill.server.metrics import ServerMetrics
from prefill.server.worker import Scheduler

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(smollm):
    return smollm


def scheduler_of(engine, pool_tokens: int, chunk_size: int = 16, prefix_mb: float = 0.0) -> Scheduler:
    pool = KVPool.for_tokens(engine.spec, pool_tokens, engine.dtype, engine.device)
    loop = StepLoop(engine.runner, pool, RadixPrefixCache(pool, int(prefix_mb * 1024**2)), chunk_size)
    return Scheduler(loop, ServerMetrics())


def test_long_prefill_is_chunked_between_decode_steps(engine):
    tok = engine.tokenizer
    scheduler = scheduler_of(engine, 2048)
    log: list[tuple[str, object]] = []  # appended by the worker thread only, so in event order
    a_started, done = threading.Event(), threading.Event()

    def on_event(name):
        def handle(ev):
            log.append((name, ev))
            if name == "A" and isinstance(ev, TokenEvent):
                a_started.set()
            if isinstance(ev, Generation) and name == "B":
                done.set()

        return handle

    story = tok.encode(tok.render_chat([{"role": "user", "content": "Write a long story about a dragon."}]))
    long_prompt = tok.encode(" ".join(["The library opens at nine and closes at five."] * 30))  # ~300 tokens
    assert len(long_prompt) >= 250
    scheduler.start()
    try:
        scheduler.submit(Request(story, 60, GREEDY, tok, on_event("A")))
        assert a_started.wait(120)
        log.append(("B submitted", None))
        scheduler.submit(Request(long_prompt, 2, GREEDY, tok, on_event("B")))
        assert done.wait(300)
    finally:
        scheduler.stop()
    start = log.index(("B submitted", None))
    first_b = next(i for i, (name, ev) in enumerate(log) if name == "B")
    a_tokens_during_b_prefill = sum(1 for name, ev in log[start:first_b] if name == "A" and isinstance(ev, TokenEvent))
    # B's prompt takes >= 16 chunks of 16 tokens; A decodes once per chunk instead of waiting for all of them.
    assert a_tokens_during_b_prefill >= 8
    finished_b = next(ev for name, ev in log if name == "B" and isinstance(ev, Generation))
    assert len(long_prompt) == finished_b.P and finished_b.cached_tokens == 0


def test_a_request_waits_for_blocks_then_completes_and_the_pool_empties(engine):
    """Two requests that each need most of the pool: the second waits in the queue (not refused, no OOM) until
    the first gives its blocks back; afterwards only the prefix cache's share is in use."""
    tok = engine.tokenizer
    scheduler = scheduler_of(engine, 160, chunk_size=64, prefix_mb=1.0)  # 10 blocks of 16 tokens
    loop = scheduler.loop
    ids = tok.encode(" ".join(["river"] * 90))[:90]
    finished: list[Generation] = []
    both = threading.Event()

    def emit(ev):
        if isinstance(ev, Generation):
            finished.append(ev)
            if len(finished) == 2:
                both.set()

    scheduler.start()
    try:
        scheduler.submit(Request(ids, 30, GREEDY, tok, emit))  # 119 positions: 8 of the 10 blocks
        scheduler.submit(Request(list(reversed(ids)), 30, GREEDY, tok, emit))  # cannot be admitted beside it
        with pytest.raises(BadInput, match="KV pool holds 160"):
            scheduler.submit(Request(ids * 2, 10, GREEDY, tok, emit))  # can never fit: refused, not queued
        assert both.wait(300)
    finally:
        scheduler.stop()
    assert all(g.P == 90 and g.finish_reason in ("stop", "length") for g in finished)
    assert finished[1].queue_s > finished[0].queue_s  # the second one waited for blocks
    assert loop.pool.used_blocks == loop.prefix_cache.n_blocks  # every request's own blocks came back
