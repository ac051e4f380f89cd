"""The server's worker: a bounded queue in front of the step loop, and the one thread that runs it.

HTTP handlers `submit` requests (prefill.engine.request.Request) from the event loop, up to --max-running +
--max-queue accepted and not ended at once (the rest get QueueFull, HTTP 429); the worker thread moves them
into the step loop (prefill.engine.loop.StepLoop: admission against the shared KV pool, one forward a step for
every running stream's decode row and the next prefill chunks) and steps it while there is work. Anything else
that computes on the model (the lesson page's attention probe, the GEMM-rate and bandwidth probes) is handed over
with `call(fn)` and runs on the same thread between two steps, so no two forwards ever share the model or the
CPU's cores. The step loop's observer sees every request's event on its way out, for the metrics.

The worker cannot die of a request: the step loop fails the requests a step touched, and anything that still
escapes a step fails every running request and the worker goes on. `alive()` and `last_step_at` let a
supervisor notice a worker that died or stalls anyway.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import torch

from prefill.engine.kv_tail import StoreUse
from prefill.engine.loop import StepLoop
from prefill.engine.request import Event, Generation, Request, TokenEvent
from prefill.errors import PrefillError
from prefill.machine import openmp
from prefill.server.metrics import ServerMetrics
from prefill.server.openai_schema import completion_tokens

log = logging.getLogger("prefill.serve")
T = TypeVar("T")


class QueueFull(PrefillError):
    """--max-running + --max-queue requests are accepted and not ended; the client should retry later (HTTP
    429)."""


class Worker:
    """Owns the model while running: every forward happens on its thread."""

    def __init__(self, loop: StepLoop, metrics: ServerMetrics, max_queue: int = 64) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        self.loop, self.metrics, self.max_queue = loop, metrics, max_queue
        loop.observer = self._observe  # every request's events pass the metrics on their way out
        self._inbox: collections.deque[Request] = collections.deque()
        self._accepted: set[Request] = set()  # accepted and maybe not ended yet (see _held)
        self._calls: collections.deque[tuple[Callable[[], object], Future]] = collections.deque()
        self._cond = threading.Condition()
        self._stop = False
        self._closed = False  # the thread has ended: calls are refused
        self.last_step_at = time.monotonic()  # moves on every loop turn, idle or not
        self.died: str | None = None  # why the worker thread ended, if it did on its own
        self._thread = threading.Thread(target=self._run, name="prefill-worker", daemon=True)

    # ---- the HTTP side ----
    def start(self) -> None:
        """Start the worker thread. The caller (which loaded the model) gives up its OpenMP helper threads: a
        second pool beside the worker's would make libgomp stop spinning both between regions (see
        prefill.machine.openmp; +15% ITL at 1 stream on 2 cores)."""
        openmp.release_thread_pool()
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the worker: running and queued requests get a final error, waiting calls an exception."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=timeout_s)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.died is None

    def submit(self, req: Request) -> None:
        """Accept a request; QueueFull when --max-running + --max-queue requests are already accepted and not
        ended, BadInput when it can never fit."""
        self.loop.check(req)
        with self._cond:
            if (held := self._held()) >= self.places:
                raise QueueFull(
                    f"{held} requests are running or queued (--max-running {self.loop.scheduler.max_running} "
                    f"+ --max-queue {self.max_queue}); retry later"
                )
            req.enqueued = time.perf_counter()  # queue_s counts from here, not from the HTTP arrival
            self._accepted.add(req)
            self._inbox.append(req)
            self.metrics.queued.set(len(self._inbox) + len(self.loop.waiting))
            self._cond.notify()

    @property
    def places(self) -> int:
        """How many requests may be accepted and not ended at once: the running slots, then the queue."""
        return self.loop.scheduler.max_running + self.max_queue

    def _held(self) -> int:
        """Requests accepted and not ended (call under the lock). One count wherever a request is (the inbox,
        the step loop's waiting line, its running set, between them on the worker's thread), so a burst fills
        the free running slots before the queue. A request gives its place back when it is done (finished or
        failed: Request.finish / fail) or cancelled (its client went away or was answered: ServerState.settle),
        at once, even if the step loop lets go of it only at its next step."""
        self._accepted = {r for r in self._accepted if not (r.done or r.cancelled)}
        return len(self._accepted)

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn()` on the worker thread between two steps (before the next one); its result, or the exception
        it raised, comes back in the future. Await it from the event loop with asyncio.wrap_future."""
        future: Future[T] = Future()
        with self._cond:
            if self._closed or self._stop:
                future.set_exception(RuntimeError("the server's worker is not running"))
                return future
            self._calls.append((fn, future))
            self._cond.notify()
        return future

    def pool_state(self) -> dict:
        """How full the shared KV pool is: blocks and bytes (reserved, and filled by running requests)."""
        pool, prefix = self.loop.pool, self.loop.prefix_cache
        running = list(self.loop.running)
        return {
            "kv_blocks_total": pool.n_blocks,
            "kv_blocks_used": pool.used_blocks,
            "kv_block_tokens": pool.block_size,
            "kv_pool_bytes": pool.allocated_bytes(),
            "kv_used_bytes": pool.used_bytes(),
            "kv_held_bytes": sum(r.seq.nbytes() for r in running if r.seq is not None and r.seq.blocks),
            "prefix_cache_bytes": prefix.nbytes if prefix is not None else 0,
            "running": len(running),
            "queued": len(self._inbox) + len(self.loop.waiting),
            "preemptions": self.loop.scheduler.preemptions,
        }

    def update_gauges(self) -> None:
        """Set the gauges of /metrics from the pool's state now."""
        s, m = self.pool_state(), self.metrics
        m.queued.set(s["queued"])
        m.running.set(s["running"])
        m.kv_bytes.set(s["kv_held_bytes"])
        m.kv_used_bytes.set(s["kv_used_bytes"])
        m.kv_pool_bytes.set(s["kv_pool_bytes"])
        m.prefix_bytes.set(s["prefix_cache_bytes"])
        m.preemptions.set(s["preemptions"])

    # ---- the worker thread ----
    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while self._turn():
                    pass
        except BaseException as e:  # noqa: BLE001 - recorded for /health, then the thread ends
            self.died = f"{type(e).__name__}: {e}"
            log.exception("the server's worker died")
        finally:
            with self._cond:
                self._closed = True
                calls = list(self._calls)
                self._calls.clear()
            for _, future in calls:
                future.set_exception(RuntimeError("the server's worker is not running"))
            self.loop.close()

    def _turn(self) -> bool:
        with self._cond:
            while not self._stop and not self._inbox and not self._calls and not self.loop.busy:
                self.last_step_at = time.monotonic()
                self._cond.wait(timeout=1.0)
            if self._stop:
                return False
            while self._inbox:
                self._add(self._inbox.popleft())
            calls = list(self._calls)
            self._calls.clear()
        for fn, future in calls:
            _run_call(fn, future)
        if self.loop.busy:
            self._step()
        self.last_step_at = time.monotonic()
        self.update_gauges()
        return True

    def _add(self, req: Request) -> None:
        try:
            self.loop.add(req)  # checked again: the step loop's one way in
        except Exception as e:  # noqa: BLE001 - this request's failure, not the worker's
            req.fail(e)

    def _step(self) -> None:
        try:
            self.loop.step()
        except Exception as e:  # noqa: BLE001 - a bug in a step: fail what it touched, keep serving
            log.exception("a step failed")
            for req in list(self.loop.running):
                req.fail(e)

    def _observe(self, req: Request, ev: Event) -> None:
        m = self.metrics
        if isinstance(ev, TokenEvent):
            if ev.token_id >= 0 and req.gen.itl_s:
                m.itl.observe(req.gen.itl_s[-1])
        elif isinstance(ev, Generation):
            m.queue.observe(ev.queue_s)
            if ev.ttft_s:
                m.ttft.observe(ev.ttft_s)
            m.prefill.observe(ev.prefill_s)
            m.prompt_tokens.observe(ev.P)
            m.generated_tokens.observe(completion_tokens(ev))  # as usage counts them: the ending EOS too
            m.cached_tokens.inc(ev.cached_tokens)
            if (use := ev.kv_store) is not None:
                self._observe_store(use)
            if ev.prompt_scores is not None:
                m.scored_tokens.inc(ev.P)

    def _observe_store(self, use: StoreUse) -> None:
        m = self.metrics
        m.kv_store_bad_blocks.inc(use.bad_blocks)
        if use.loaded_tokens:
            m.kv_store_hits.inc()
            m.kv_store_bytes_loaded.inc(use.loaded_bytes)
            m.kv_store_seconds_saved.inc(use.saved_s)


def _run_call(fn: Callable[[], object], future: Future) -> None:
    if not future.set_running_or_notify_cancel():
        return  # cancelled while it waited
    try:
        future.set_result(fn())
    except Exception as e:  # noqa: BLE001 - the caller's failure, handed back to the caller
        future.set_exception(e)
