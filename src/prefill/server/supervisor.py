"""The supervisor: a task on the event loop that watches the worker thread (prefill.server.worker).

The worker is dead (its thread ended) or stuck (requests wait and its loop has not turned for `stuck_after_s`):
either way nothing will ever answer the pending requests, so the supervisor reports the reason (/health 503),
and calls `on_fatal(reason)` once, which fails what is pending and asks the process to exit non-zero so an
orchestrator restarts it. There is no in-process recovery: a worker that died mid-forward may have left its
requests' caches half written, and a stuck thread cannot be stopped from Python.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Supervisor:
    """Watches `worker.alive()`, `worker.died` (why it ended) and `worker.last_step_at`
    (time.monotonic() of the worker's last turn, idle or not)."""

    def __init__(
        self, worker, busy: Callable[[], bool], stuck_after_s: float, every_s: float, on_fatal: Callable[[str], None]
    ) -> None:
        self.worker, self.busy, self.stuck_after_s, self.every_s = worker, busy, stuck_after_s, every_s
        self.on_fatal = on_fatal
        self.fatal: str | None = None  # set once: the worker cannot serve any more
        self.refusing: str | None = None  # set on shutdown: new requests are refused

    def worker_problem(self) -> str | None:
        """Why the worker cannot serve, or None while it can."""
        if not self.worker.alive():
            died = getattr(self.worker, "died", None)
            return "the scheduler's worker thread is not running" + (f" (it died of {died})" if died else "")
        idle_s = time.monotonic() - self.worker.last_step_at
        if self.busy() and idle_s > self.stuck_after_s:
            return f"the scheduler's worker made no progress for {idle_s:.0f} s with requests pending"
        return None

    def problem(self) -> str | None:
        """What /health reports: the fatal reason, the shutdown, a worker problem seen now, or None."""
        return self.fatal or self.refusing or self.worker_problem()

    def refuse(self, reason: str) -> None:
        self.refusing = self.refusing or reason

    def check(self) -> None:
        """One look at the worker; the first problem found is fatal."""
        if self.fatal is None and self.refusing is None and (reason := self.worker_problem()):
            self.fatal = reason
            self.on_fatal(reason)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            self.check()
