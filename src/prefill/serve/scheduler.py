"""The scheduler: a queue of requests and one worker thread that runs one forward at a time.

Each loop of the worker (1) admits waiting requests while fewer than `max_running` run, copying the
longest cached prefix of each prompt into the request's own KVCache; (2) runs one decode step for every
request that is generating; (3) runs one chunk (at most `chunk_size` tokens) of the oldest unfinished
prefill. A long prompt therefore costs the running streams one chunk's latency per token instead of
its whole prefill: chunked prefill, as in vLLM and Sarathi-Serve. A request whose client went away is
dropped at the start of the next loop and its KVCache freed.

Requests are B = 1 each: the CPU has two cores and batching would blur the per-request timings this
package is about.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from prefill.engine import Engine
from prefill.errors import PrefillError
from prefill.kvcache import KVCache
from prefill.sampling import SamplingParams, sample
from prefill.scoring import ScoreAccumulator, prefill_scored
from prefill.serve.logprobs import TokenLogprob, prompt_entries, sampled_entry
from prefill.serve.metrics import ServerMetrics
from prefill.serve.prefix_cache import PrefixCache
from prefill.streaming import TextStream


class QueueFull(PrefillError):
    """The scheduler's queue is at --max-queue; the client should retry later (HTTP 429)."""


@dataclass(frozen=True)
class TextDelta:
    """New text of a request (may be empty when a token only completed part of a character), and the log-probabilities
    of the tokens accepted since the last delta when the request asked for them."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class PromptLogprobs:
    """Every prompt token's log-probability (the first one's is None), sent once the prefill is done."""

    entries: list[TokenLogprob]


@dataclass(frozen=True)
class Finished:
    """The request ended; counts in tokens, timings in seconds measured on the server."""

    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    timings: dict[str, float]


@dataclass(frozen=True)
class Failed:
    message: str


Event = TextDelta | PromptLogprobs | Finished | Failed


@dataclass(eq=False)
class GenRequest:
    """One generation as the scheduler sees it. `on_event` is called from the worker thread."""

    ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    on_event: Callable[[Event], None]
    arrival: float  # time.perf_counter() when the HTTP request arrived
    tokenize_s: float = 0.0
    prompt_logprobs: int | None = None  # k: score every prompt position (a prefill with all-position logits)
    logprobs: int | None = None  # k: record each generated token's log-probability and the k most likely
    cancelled: bool = False  # set by the HTTP side when the client disconnects
    enqueued: float = 0.0


@dataclass(eq=False)
class _Running:
    """A request between admission and its last token."""

    req: GenRequest
    cache: KVCache
    cached_tokens: int
    admitted: float
    generator: torch.Generator | None  # None: greedy, or unseeded sampling from torch's global generator
    prefill_s: float = 0.0
    generated: list[int] = field(default_factory=list)
    stream: TextStream | None = None  # detokenizes, holds back what a stop string may still claim
    first_token_at: float | None = None
    last_token_at: float = 0.0
    scorer: ScoreAccumulator | None = None  # a scoring request's per-position log-probabilities

    @property
    def prefilling(self) -> bool:
        return self.cache.length < len(self.req.ids)


class Scheduler:
    """Owns the engine while running: every forward happens on its worker thread."""

    def __init__(
        self,
        engine: Engine,
        prefix_cache: PrefixCache,
        metrics: ServerMetrics,
        max_queue: int = 64,
        max_running: int = 32,
        chunk_size: int = 256,
    ) -> None:
        if max_queue < 1 or max_running < 1 or chunk_size < 1:
            raise ValueError("max_queue, max_running and chunk_size must be >= 1")
        self.engine = engine
        self.prefix_cache = prefix_cache
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_running = max_running
        self.chunk_size = chunk_size
        self._waiting: collections.deque[GenRequest] = collections.deque()
        self._running: list[_Running] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="prefill-scheduler", daemon=True)

    # ---- the HTTP side ----
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def submit(self, req: GenRequest) -> None:
        """Queue a request; raises QueueFull when --max-queue requests already wait."""
        with self._cond:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are queued (--max-queue); retry later")
            req.enqueued = time.perf_counter()
            self._waiting.append(req)
            self.metrics.queued.set(len(self._waiting))
            self._cond.notify()

    def kv_cache_bytes(self) -> int:
        """Bytes allocated by the running requests' KV caches (their full capacity)."""
        return sum(c.allocated_bytes() for r in list(self._running) if (c := r.cache) is not None)

    # ---- the worker thread ----
    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._stop and not self._waiting and not self._running:
                        self._cond.wait()
                    if self._stop:
                        return
                    admitted = self._take_waiting()
                for req in admitted:
                    self._admit(req)
                self._drop_cancelled()
                for run in [r for r in self._running if not r.prefilling]:
                    self._guard(run, self._decode_step)
                prefilling = [r for r in self._running if r.prefilling]
                if prefilling:
                    self._guard(prefilling[0], self._prefill_chunk)
                self._update_gauges()

    def _take_waiting(self) -> list[GenRequest]:
        out = []
        while self._waiting and len(self._running) + len(out) < self.max_running:
            req = self._waiting.popleft()
            if not req.cancelled:
                out.append(req)
        self.metrics.queued.set(len(self._waiting))
        return out

    def _admit(self, req: GenRequest) -> None:
        now = time.perf_counter()
        t0 = now
        try:
            cache = self.engine.new_cache(len(req.ids) + req.max_tokens)
            # Match all but the last prompt token: the last one must be prefilled to get the logits. A scoring
            # request reuses nothing: every position's hidden state must be computed to be unembedded.
            match = self.prefix_cache.match_prefix(req.ids[: -1 if req.prompt_logprobs is None else 0])
            match.copy_into(cache)
            k = req.prompt_logprobs
            scorer = None if k is None else ScoreAccumulator(req.ids, self.engine.model.unembed_weight(), k)
        except Exception as e:  # noqa: BLE001 - any failure is this request's, not the server's
            req.on_event(Failed(f"{type(e).__name__}: {e}"))
            return
        generator = req.sampling.generator(self.engine.device)
        run = _Running(req, cache, match.n_tokens, now, generator, stream=TextStream(self.engine.tokenizer, req.stop),
                       scorer=scorer)  # fmt: skip
        run.prefill_s += time.perf_counter() - t0
        self._running.append(run)
        self.metrics.queue.observe(now - req.enqueued)
        self.metrics.cached_tokens.inc(match.n_tokens)

    def _guard(self, run: _Running, step: Callable[[_Running], None]) -> None:
        try:
            step(run)
        except Exception as e:  # noqa: BLE001
            self._remove(run)
            run.req.on_event(Failed(f"{type(e).__name__}: {e}"))

    def _drop_cancelled(self) -> None:
        for run in [r for r in self._running if r.req.cancelled]:
            self._remove(run)

    def _remove(self, run: _Running) -> None:
        if run in self._running:
            self._running.remove(run)
        run.cache = None  # the request's K/V are freed here (the only reference)

    def _prefill_chunk(self, run: _Running) -> None:
        ids = run.req.ids
        start = run.cache.length
        chunk = ids[start : start + self.chunk_size]
        t0 = time.perf_counter()
        if run.scorer is None:
            logits, _ = self.engine.prefill(chunk, run.cache)  # logits [1, vocab] of the chunk's last position
        else:
            prefill_scored(self.engine, chunk, run.cache, run.scorer)
        run.prefill_s += time.perf_counter() - t0
        if not run.prefilling:
            self.prefix_cache.insert_prefix(ids, run.cache)
            if run.scorer is not None:
                scores = run.scorer.result(run.prefill_s)
                logits = scores.next_logits[None]  # [1, vocab]
                entries = prompt_entries(ids, scores.logprobs, scores.top_ids, scores.top_logprobs)
                run.req.on_event(PromptLogprobs(entries))
                self.metrics.scored_tokens.inc(len(ids))
            if run.req.max_tokens == 0:  # pure scoring: prefill only, no token sampled
                run.first_token_at = time.perf_counter()
                return self._finish(run, "length")
            self._accept(run, logits)

    def _decode_step(self, run: _Running) -> None:
        token = torch.tensor([run.generated[-1]], dtype=torch.long, device=self.engine.device)  # [B=1]
        logits = self.engine.decode_step(token, run.cache)  # [1, vocab]
        self._accept(run, logits)

    def _accept(self, run: _Running, logits: torch.Tensor) -> None:
        """Sample the next token from `logits` [1, vocab], stream its text, finish when due."""
        req = run.req
        token = int(sample(logits, req.sampling, run.generator)[0])  # logits [1, vocab] -> ids [1]
        entry = None if req.logprobs is None else sampled_entry(logits[0], token, req.logprobs)
        now = time.perf_counter()
        if run.first_token_at is None:
            run.first_token_at = now
        else:
            self.metrics.itl.observe(now - run.last_token_at)
        run.last_token_at = now
        if token in self.engine.tokenizer.eos_ids:
            self._send(run, run.stream.flush(), entry)  # text held back for a stop that never came
            return self._finish(run, "stop")
        run.generated.append(token)
        delta, stopped = run.stream.add(token)
        if stopped:
            self._send(run, delta, entry)
            return self._finish(run, "stop")
        if len(run.generated) >= req.max_tokens:
            self._send(run, delta + run.stream.flush(), entry)
            return self._finish(run, "length")
        self._send(run, delta, entry)

    @staticmethod
    def _send(run: _Running, delta: str, entry: TokenLogprob | None = None) -> None:
        if delta or entry is not None:
            run.req.on_event(TextDelta(delta, () if entry is None else (entry,)))

    def _finish(self, run: _Running, reason: str) -> None:
        req = run.req
        self._remove(run)
        timings = {
            "queue_s": run.admitted - req.enqueued,
            "tokenize_s": req.tokenize_s,
            "prefill_s": run.prefill_s,
            "ttft_s": run.first_token_at - req.arrival,
            "total_s": time.perf_counter() - req.arrival,
        }
        m = self.metrics
        m.ttft.observe(timings["ttft_s"])
        m.prefill.observe(run.prefill_s)
        m.prompt_tokens.observe(len(req.ids))
        m.generated_tokens.observe(len(run.generated))
        req.on_event(Finished(reason, len(req.ids), len(run.generated), run.cached_tokens, timings))

    def _update_gauges(self) -> None:
        self.metrics.running.set(len(self._running))
        self.metrics.kv_bytes.set(self.kv_cache_bytes())
        self.metrics.prefix_bytes.set(self.prefix_cache.nbytes)
