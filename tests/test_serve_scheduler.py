"""The scheduler on the real model, without HTTP: chunked prefill of a long prompt interleaves with the decode
steps of a running stream (an ordering of events, not a timing)."""

from __future__ import annotations

import threading
import time

import pytest

from prefill.sampling import SamplingParams
from prefill.serve.metrics import ServerMetrics
from prefill.serve.prefix_cache import RadixPrefixCache
from prefill.serve.scheduler import Finished, GenRequest, Scheduler, TextDelta

pytestmark = pytest.mark.slow


def test_long_prefill_is_chunked_between_decode_steps():
    from prefill.engine import Engine

    engine = Engine.load(progress=False)
    tok = engine.tokenizer
    scheduler = Scheduler(engine, RadixPrefixCache(0), ServerMetrics(), chunk_size=16)
    log: list[tuple[str, object]] = []  # appended by the worker thread only, so in event order
    a_started, done = threading.Event(), threading.Event()

    def on_event(name):
        def handle(ev):
            log.append((name, ev))
            if name == "A" and isinstance(ev, TextDelta):
                a_started.set()
            if isinstance(ev, Finished) and name == "B":
                done.set()

        return handle

    story = tok.encode(tok.render_chat([{"role": "user", "content": "Write a long story about a dragon."}]))
    long_prompt = tok.encode(" ".join(["The library opens at nine and closes at five."] * 30))  # ~300 tokens
    assert len(long_prompt) >= 250
    greedy = SamplingParams(temperature=0.0)
    scheduler.start()
    try:
        scheduler.submit(GenRequest(story, 60, greedy, (), on_event("A"), time.perf_counter()))
        assert a_started.wait(120)
        log.append(("B submitted", None))
        scheduler.submit(GenRequest(long_prompt, 2, greedy, (), on_event("B"), time.perf_counter()))
        assert done.wait(300)
    finally:
        scheduler.stop()
    start = log.index(("B submitted", None))
    first_b = next(i for i, (name, ev) in enumerate(log) if name == "B")
    a_tokens_during_b_prefill = sum(1 for name, ev in log[start:first_b] if name == "A" and isinstance(ev, TextDelta))
    # B's prompt takes >= 16 chunks of 16 tokens; A decodes once per chunk instead of waiting for all of them.
    assert a_tokens_during_b_prefill >= 8
    finished_b = next(ev for name, ev in log if name == "B" and isinstance(ev, Finished))
    assert finished_b.prompt_tokens == len(long_prompt) and finished_b.cached_tokens == 0
