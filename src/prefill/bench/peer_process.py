"""A peer engine in a child process: llama.cpp's native build crashed with a segmentation fault on its first eval
on an AMX Xeon, and loaded into the benchmark's own process it took the whole benchmark down with it. In a
child, a crash is the child's exit status: the proxy raises PeerCrashed ("crashed (signal 11)", with the tail
of the child's log) and the benchmark goes on without that peer.

The child builds its peer with `factory(**kwargs)` (a module-level function, so the spawned child can import it)
and answers calls over a pipe. It times each call itself, on the clock asked for, so the pipe's round trip is
not counted: a timed call returns SelfTimed seconds, which the benchmark's timers take instead of their own
(prefill.bench.timing). Its stdout and stderr (llama.cpp's C logs too) go to a log file.

    peer = PeerProcess(load_llamacpp_child, {"path": ..., "n_ctx": 512, "threads": 2}, "llamacpp", "gguf")
    peer.prefill(ids)        # SelfTimed seconds of one whole prefill, measured in the child
    peer.call("peak", ids)   # its PeakMemory, measured in the child
    peer.close()
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefill.bench.timing import SelfTimed
from prefill.errors import PrefillError

LOG_TAIL_CHARS = 2000  # of the child's log, kept with a crash
LOAD_TIMEOUT_S = 600.0  # loading a large model in the child, at most


class PeerCrashed(PrefillError):
    """A peer's child process died: `reason` ("crashed (signal 11)", "exited with status 3"), `log` its tail."""

    def __init__(self, name: str, reason: str, log: str, log_path: str) -> None:
        super().__init__(f"{name} {reason}; its log: {log_path}")
        self.name, self.reason, self.log, self.log_path = name, reason, log, log_path


class PeerFailed(PrefillError):
    """A peer raised a Python exception in its child (the child lives on): the message and its traceback."""


class PeerProcess:
    """A peer built by `factory(**kwargs)` in a spawned child; `name` and `dtype` as the benchmark labels it."""

    def __init__(self, factory: Callable[..., Any], kwargs: dict, name: str, dtype: str) -> None:
        self.name, self.dtype = name, dtype
        fd, self.log_path = tempfile.mkstemp(prefix=f"prefill-peer-{name}-", suffix=".log")
        os.close(fd)
        ctx = multiprocessing.get_context("spawn")  # a fork would share torch's and OpenMP's threads and locks
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child_conn, factory, kwargs, self.log_path), daemon=True)
        self._proc.start()
        child_conn.close()
        self.version = str(self._receive(LOAD_TIMEOUT_S))  # the child says "ready" with its peer's version

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """`method(*args)` on the peer in the child: its result; PeerCrashed if the child died, PeerFailed if the
        method raised there."""
        try:
            self._conn.send((method, args))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._crashed()
        return self._receive(timeout_s)

    def prefill(self, ids: list[int], clock: str = "wall") -> SelfTimed:
        """One whole prefill of `ids` from an empty cache; its seconds on `clock` ("wall" or "cpu": the child's
        thread CPU time), measured in the child."""
        return SelfTimed(self.call("timed", "prefill", (list(ids),), clock))

    def close(self) -> None:
        """Stop the child (politely, then by force)."""
        if self._proc.is_alive():
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError, OSError):
                self._conn.send(("exit", ()))
            self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()

    def _receive(self, timeout_s: float | None) -> Any:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._conn.poll(0.1):
            if not self._proc.is_alive():
                self._crashed()
            if deadline is not None and time.monotonic() > deadline:
                self._proc.kill()
                self._proc.join(5)
                raise PeerCrashed(self.name, f"timed out after {timeout_s:.0f} s", self.log_tail(), self.log_path)
        try:
            status, value = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            self._crashed()
        if status == "error":
            raise PeerFailed(f"{self.name}: {value}")
        return value

    def _crashed(self):
        self._proc.join(5)
        code = self._proc.exitcode
        if code is not None and code < 0:
            reason = f"crashed (signal {-code}{_signal_name(-code)})"
        else:
            reason = f"exited with status {code}"
        raise PeerCrashed(self.name, reason, self.log_tail(), self.log_path)

    def log_tail(self) -> str:
        """The last LOG_TAIL_CHARS of the child's log."""
        try:
            return Path(self.log_path).read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""


def _signal_name(number: int) -> str:
    try:
        return f", {signal.Signals(number).name}"
    except ValueError:
        return ""


def _serve(conn, factory: Callable[..., Any], kwargs: dict, log_path: str) -> None:
    """The child: its output to the log, the peer built, then calls answered until "exit" (or the pipe closes)."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        peer = factory(**kwargs)
    except Exception as e:  # the parent sees it as a load error, with the traceback in the log
        traceback.print_exc()
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ok", getattr(peer, "version", "")))
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        if method == "exit":
            return
        try:
            conn.send(("ok", _timed(peer, *args) if method == "timed" else getattr(peer, method)(*args)))
        except Exception as e:
            traceback.print_exc()
            conn.send(("error", f"{type(e).__name__}: {e}"))


def _timed(peer: Any, method: str, args: tuple, clock: str) -> float:
    now = time.thread_time if clock == "cpu" else time.perf_counter
    t = now()
    getattr(peer, method)(*args)
    return now() - t


class PeerRun:
    """One point of a sweep for a peer in a child: calling it runs a prefill of `ids` there (SelfTimed seconds);
    peak_memory() measures its PeakMemory there (prefill.bench.timing.measure_peak_memory asks for it)."""

    def __init__(self, peer: PeerProcess, ids: list[int]) -> None:
        self.peer, self.ids = peer, list(ids)

    def __call__(self) -> SelfTimed:
        return self.peer.prefill(self.ids)

    def peak_memory(self):
        return self.peer.call("peak", self.ids)
