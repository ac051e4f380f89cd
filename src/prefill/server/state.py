"""`ServerState`: everything one server's routes read (`request.app.state.server`), built once per app.

Every request the app hands to the worker (one job per prompt) is a `Pending` in `inflight` until it is settled
as exactly one of requests (ok), errors or cancelled in /metrics. The supervisor watches the worker: when it is
dead or stuck, every pending request gets a 503 and the process is asked to exit non-zero (`exit_code`,
`on_fatal`) so an orchestrator restarts it. On SIGTERM / SIGINT the server (prefill.server.server) calls
`begin_shutdown`: pending requests get a 503 (a stream a final error event) and new ones are refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request

from prefill.engine.kvcache import KVPool
from prefill.engine.llm import Engine
from prefill.engine.loop import StepLoop
from prefill.engine.prefix_cache import RadixPrefixCache
from prefill.engine.request import Event, Failed, Generation, TokenEvent
from prefill.engine.request import Request as Job  # fastapi's Request is the HTTP one
from prefill.server.api_errors import ApiError
from prefill.server.config import ServeConfig
from prefill.server.intake import Intake
from prefill.server.metrics import ServerMetrics
from prefill.server.supervisor import Supervisor
from prefill.server.worker import QueueFull, Worker

log = logging.getLogger("prefill.serve")
RETRY_AFTER_S = 1  # a 429's Retry-After: a queued request of a small model on a CPU starts within about a second


@dataclass(frozen=True)
class Aborted:
    """The app ends a pending request itself (shutdown, dead worker): HTTP `status`."""

    status: int
    message: str


@dataclass(eq=False)
class Pending:
    """A request handed to the worker (one job and one event queue per prompt), until it is settled as ok,
    error or cancelled (exactly once)."""

    jobs: list[Job]
    queues: list[asyncio.Queue]
    stream: bool = False
    settled: str | None = None
    open_jobs: int = 0  # jobs whose last event (Generation / Failed) has not arrived: the worker owes them progress

    @property
    def at_worker(self) -> bool:
        return self.open_jobs > 0


@dataclass(eq=False)
class ServerState:
    """The engine, the configuration, and the parts built around them: metrics, the worker over the step loop,
    the intake checks, the supervisor, and the requests in flight."""

    engine: Engine
    cfg: ServeConfig
    metrics: ServerMetrics
    worker: Worker
    intake: Intake
    supervisor: Supervisor = field(init=False)
    inflight: set[Pending] = field(default_factory=set)
    exit_code: int = 0  # 1 once the worker could not serve: the process's exit status
    on_fatal: Callable[[], None] | None = None  # set by prefill.server.server: asks the process to exit

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.supervisor = Supervisor(self.worker, self.busy, cfg.stuck_after_s, cfg.supervise_every_s, self.fatal)

    @classmethod
    def build(cls, engine: Engine, cfg: ServeConfig) -> ServerState:
        """The KV pool, its prefix cache and the step loop over the engine's runner, with a worker to run them.
        The machine profile is read (or probed) here, once, so no response waits on it: probed again when the
        cached one is older than cfg.probe_max_age_s (the machine's speed drifts over minutes)."""
        engine.profile(echo=print, max_age_s=cfg.probe_max_age_s)
        metrics = ServerMetrics()
        pool = KVPool.for_bytes(engine.spec, cfg.kv_pool_bytes(engine), engine.runner.kv_dtype, engine.device)
        if cfg.populate_kv:
            pool.populate()  # the first requests after a (re)start pay no page faults, as later ones
        prefix = RadixPrefixCache(pool, int(cfg.prefix_cache_mb * 1024**2))
        loop = StepLoop(engine.runner, pool, prefix, cfg.chunk_size, cfg.max_running, kv_tier=engine.kv_store)
        return cls(engine, cfg, metrics, Worker(loop, metrics, cfg.max_queue), Intake(engine, cfg))

    # ---- requests in ----
    def refuse_unless_serving(self, model: str) -> None:
        """A 503 while the worker cannot serve (or the server shuts down); a 404 for another model's name."""
        if problem := self.supervisor.problem():
            raise ApiError(503, f"the server cannot take requests: {problem}", "server_error", code="unavailable")
        self.check_model(model)

    def check_model(self, model: str) -> None:
        """A 404 unless `model` names the one model this server serves."""
        if model != self.cfg.model_id:
            raise ApiError(
                404,
                f"model {model!r} does not exist; this server serves {self.cfg.model_id!r}",
                param="model",
                code="model_not_found",
            )

    def submit(self, pending: Pending) -> None:
        """Queue every job of `pending` with the worker, or none: a 429 when the queue is full."""
        pending.open_jobs = len(pending.jobs)
        try:
            for job in pending.jobs:
                self.worker.submit(job)
        except Exception as e:
            for job in pending.jobs:
                job.cancelled = True  # the ones already queued are dropped
            if isinstance(e, QueueFull):
                retry = {"Retry-After": str(RETRY_AFTER_S)}
                raise ApiError(429, str(e), "rate_limit_error", code="queue_full", headers=retry) from e
            raise
        self.inflight.add(pending)

    def deliver(self, pending: Pending, queue: asyncio.Queue, ev: Event) -> None:
        """One job's event, on the event loop: into its queue; a stream its client does not read is cancelled."""
        unread = pending.stream and isinstance(ev, TokenEvent) and queue.qsize() >= self.cfg.max_unread_events
        if pending.settled is None and unread:
            self.settle(pending, "cancelled", reason="unread")  # a client that does not read loses its slot
        pending.open_jobs -= isinstance(ev, Generation | Failed)
        queue.put_nowait(ev)

    def settle(self, p: Pending, outcome: str, **labels) -> None:
        """Count a pending request once: "ok" (requests, by endpoint and finish reason), "error" or "cancelled";
        "raised": an ApiError follows, which its handler counts."""
        if p.settled is not None:
            return
        p.settled = outcome
        self.inflight.discard(p)
        for job in p.jobs:
            job.cancelled = True  # no-op when finished; otherwise the step loop drops it and frees its cache
        if outcome == "ok":
            self.metrics.requests.labels(**labels).inc()
        elif outcome == "error":
            self.metrics.errors.labels(**labels).inc()
        elif outcome == "cancelled":
            self.metrics.cancelled.labels(**labels).inc()

    # ---- the end of serving ----
    def busy(self) -> bool:
        return any(p.at_worker for p in self.inflight)

    def abort_all(self, status: int, message: str) -> None:
        """End every pending request with `status` (called on the event loop)."""
        for p in list(self.inflight):
            for q in p.queues:
                q.put_nowait(Aborted(status, message))

    def begin_shutdown(self) -> None:
        self.supervisor.refuse("the server is shutting down")
        self.abort_all(503, "the server is shutting down; retry on another instance")

    def fatal(self, reason: str) -> None:
        log.error("unrecoverable: %s; exiting with status 1", reason)
        self.exit_code = 1
        self.abort_all(503, f"the server cannot serve: {reason}")
        if self.on_fatal is not None:
            self.on_fatal()


def state_of(request: Request) -> ServerState:
    """The state of the app that serves `request`."""
    return request.app.state.server
