"""The store's background writer: one thread, jobs in order, a queue bounded in bytes that never blocks.

A request's critical path only hands over references to tensors; serialising, checksumming and writing happen
here. When the queued jobs already hold `max_bytes` of blocks, a new job is refused on the spot (the store
counts it as dropped): a slow disk loses cache entries, never a request's time.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger("prefill.kv_store")
_STOP = object()


class BackgroundWriter:
    """Runs submitted callables on one daemon thread, in submission order."""

    def __init__(self, max_bytes: int, name: str = "kv-store-writer") -> None:
        self.max_bytes = max_bytes
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0  # bytes held by queued jobs
        self._lock = threading.Lock()
        self._closed = False
        self.cpu_s = 0.0  # CPU seconds the thread has spent in jobs (time.thread_time): what it took from the cores
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def pending_bytes(self) -> int:
        return self._pending

    def submit(self, job: Callable[[], None], nbytes: int = 0) -> bool:
        """Queue `job` (holding `nbytes` of block data) unless that would pass max_bytes; never blocks.
        Returns False when refused (or after close)."""
        with self._lock:
            if self._closed or (nbytes and self._pending + nbytes > self.max_bytes):
                return False
            self._pending += nbytes
            self._queue.put((job, nbytes))  # unbounded queue: never blocks, so safe under the lock
        return True

    def flush(self) -> None:
        """Wait until every job queued so far has run."""
        if self._thread.is_alive():
            self._queue.join()

    def close(self) -> None:
        """Run what is queued, then stop the thread. Safe to call twice."""
        with self._lock:
            closed, self._closed = self._closed, True
            if not closed:
                self._queue.put((_STOP, 0))
        if not closed:
            self._thread.join()

    def _run(self) -> None:
        while True:
            job, nbytes = self._queue.get()
            try:
                if job is _STOP:
                    return
                t0 = time.thread_time()
                try:
                    job()
                finally:
                    self.cpu_s += time.thread_time() - t0
            except Exception:  # a bug in a job must not kill the writer; the store handles OSError itself
                log.exception("kv store: a background write failed")
            finally:
                with self._lock:
                    self._pending -= nbytes
                self._queue.task_done()
