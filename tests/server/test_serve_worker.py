"""The worker and its step loop, without HTTP: admission up to --max-running + --max-queue requests not ended,
`call(fn)` runs fn on the worker thread between two steps (no model needed), and on the real model chunked
prefill of a long prompt interleaves with the batched decode steps of running streams (an ordering of events,
not a timing), and the pool's blocks all come back."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from prefill.costmodel.specs import ModelSpec
from prefill.engine.kvcache import KVPool
from prefill.engine.loop import StepLoop
from prefill.engine.prefix_cache import RadixPrefixCache
from prefill.engine.request import Generation, Request, TokenEvent
from prefill.engine.sampling import SamplingParams
from prefill.errors import BadInput
from prefill.server.metrics import ServerMetrics
from prefill.server.worker import QueueFull, Worker

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(smollm_native):
    return smollm_native  # the session's load on the GGUF's own blocks (conftest): what is served, in less time


def worker_of(engine, pool_tokens: int, chunk_size: int = 16, prefix_mb: float = 0.0) -> Worker:
    pool = KVPool.for_tokens(engine.spec, pool_tokens, engine.dtype, engine.device)
    loop = StepLoop(engine.runner, pool, RadixPrefixCache(pool, int(prefix_mb * 1024**2)), chunk_size)
    return Worker(loop, ServerMetrics())


def idle_worker() -> Worker:
    """A worker over a step loop with no model: enough for calls, never for a request."""
    pool = KVPool.for_tokens(ModelSpec.from_preset("smollm2-135m"), 16, torch.float32, "cpu")
    return Worker(StepLoop(None, pool), ServerMetrics())


def refuse():
    raise BadInput("no such layer")


def test_admission_holds_max_running_plus_max_queue_requests_not_ended():
    """--max-running 2 + --max-queue 2 places, whether a request waits in the inbox, the waiting line or runs:
    here a worker not started, so all four sit in its inbox and none has started. A fifth is refused; a place
    comes back once a request ends, whichever way (cancelled: its client went away; failed; finished), once."""
    spec = ModelSpec.from_preset("smollm2-135m")
    pool = KVPool.for_tokens(spec, 64, torch.float32, "cpu")
    worker = Worker(StepLoop(SimpleNamespace(spec=spec), pool, max_running=2), ServerMetrics(), max_queue=2)
    reqs = [Request([1, 2, 3], 4, GREEDY, None, lambda ev: None) for _ in range(8)]
    for req in reqs[:4]:
        worker.submit(req)
    with pytest.raises(QueueFull, match=r"4 requests are running or queued \(--max-running 2 \+ --max-queue 2\)"):
        worker.submit(reqs[4])
    reqs[0].cancelled = True  # ServerState.settle: answered, disconnected or not read
    reqs[1].fail(RuntimeError("a step failed"))
    reqs[2].finish("length")
    reqs[2].finish("length")  # a second end frees nothing more
    for req in reqs[4:7]:
        worker.submit(req)
    with pytest.raises(QueueFull):
        worker.submit(reqs[7])
    assert len(worker._inbox) == 7  # the ended ones stay there until the worker's thread drops them


def test_call_runs_on_the_worker_thread_and_hands_back_result_and_exception():
    worker = idle_worker()
    early = worker.call(lambda: threading.current_thread().name)  # queued before the thread starts
    worker.start()
    try:
        assert early.result(10) == "prefill-worker"
        assert worker.call(lambda: 6 * 7).result(10) == 42
        with pytest.raises(BadInput, match="no such layer"):
            worker.call(refuse).result(10)
        assert worker.alive()  # a call's failure is the caller's, never the worker's
    finally:
        worker.stop()
    with pytest.raises(RuntimeError, match="worker is not running"):
        worker.call(lambda: 1).result(10)


@pytest.mark.slow
def test_a_call_runs_between_two_steps_of_a_running_stream(engine):
    worker = worker_of(engine, 512)
    step, in_step, seen = worker.loop.step, threading.Event(), []

    def watched_step():
        in_step.set()
        try:
            step()
        finally:
            in_step.clear()
        seen.append(("step", threading.get_ident()))

    worker.loop.step = watched_step
    tok, first = engine.tokenizer, threading.Event()
    done = threading.Event()

    def emit(ev):
        if isinstance(ev, TokenEvent):
            first.set()
        if isinstance(ev, Generation):
            done.set()

    worker.start()
    try:
        worker.submit(Request(tok.encode("Count to fifty: 1, 2, 3,"), 40, GREEDY, tok, emit))
        assert first.wait(120)  # decoding now
        during = worker.call(lambda: (in_step.is_set(), threading.get_ident(), done.is_set())).result(60)
        assert done.wait(120)
    finally:
        worker.stop()
    stepped_in, thread, finished = during
    assert not stepped_in and not finished  # between two steps of the stream, not after it
    assert {t for _, t in seen} == {thread}  # every step and the call: one thread


@pytest.mark.slow
def test_long_prefill_is_chunked_between_decode_steps(engine):
    tok = engine.tokenizer
    worker = worker_of(engine, 2048)
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
    worker.start()
    try:
        worker.submit(Request(story, 60, GREEDY, tok, on_event("A")))
        assert a_started.wait(120)
        log.append(("B submitted", None))
        worker.submit(Request(long_prompt, 2, GREEDY, tok, on_event("B")))
        assert done.wait(300)
    finally:
        worker.stop()
    start = log.index(("B submitted", None))
    first_b = next(i for i, (name, ev) in enumerate(log) if name == "B")
    a_tokens_during_b_prefill = sum(1 for name, ev in log[start:first_b] if name == "A" and isinstance(ev, TokenEvent))
    # B's prompt takes >= 16 chunks of 16 tokens; A decodes once per chunk instead of waiting for all of them.
    assert a_tokens_during_b_prefill >= 8
    finished_b = next(ev for name, ev in log if name == "B" and isinstance(ev, Generation))
    assert len(long_prompt) == finished_b.P and finished_b.cached_tokens == 0


@pytest.mark.slow
def test_a_request_waits_for_blocks_then_completes_and_the_pool_empties(engine):
    """Two requests that each need most of the pool: the second waits in the queue (not refused, no OOM) until
    the first gives its blocks back; afterwards only the prefix cache's share is in use."""
    tok = engine.tokenizer
    worker = worker_of(engine, 160, chunk_size=64, prefix_mb=1.0)  # 10 blocks of 16 tokens
    loop = worker.loop
    ids = tok.encode(" ".join(["river"] * 90))[:90]
    finished: list[Generation] = []
    both = threading.Event()

    def emit(ev):
        if isinstance(ev, Generation):
            finished.append(ev)
            if len(finished) == 2:
                both.set()

    worker.start()
    try:
        worker.submit(Request(ids, 30, GREEDY, tok, emit))  # 119 positions: 8 of the 10 blocks
        worker.submit(Request(list(reversed(ids)), 30, GREEDY, tok, emit))  # cannot be admitted beside it
        with pytest.raises(BadInput, match="KV pool holds 160"):
            worker.submit(Request(ids * 2, 10, GREEDY, tok, emit))  # can never fit: refused, not queued
        assert both.wait(300)
    finally:
        worker.stop()
    assert all(g.P == 90 and g.finish_reason in ("stop", "length") for g in finished)
    assert finished[1].queue_s > finished[0].queue_s  # the second one waited for blocks
    assert loop.pool.used_blocks == loop.prefix_cache.n_blocks  # every request's own blocks came back
