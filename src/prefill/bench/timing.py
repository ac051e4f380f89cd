"""Wall-clock timing and peak memory of one call, the way the benchmark reads them.

Every engine is timed the same way: the whole call, with CUDA synchronized before each clock read, the first
(cold) call kept apart from the warm repeats, and the median and p90 of the warm repeats reported.
Peak memory is a separate, untimed call: the process's peak RSS on CPU (Linux `VmHWM`, reset through
`/proc/self/clear_refs`), `torch.cuda.max_memory_allocated` on CUDA.
"""

from __future__ import annotations

import contextlib
import ctypes
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from prefill.errors import BadInput

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


@dataclass(frozen=True)
class Timing:
    """Seconds of one benchmarked call: the first (cold) call and the warm repeats after the warm-up."""

    cold_s: float
    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        """Median of the warm repeats, seconds."""
        return statistics.median(self.samples_s)

    @property
    def p90_s(self) -> float:
        """90th percentile of the warm repeats (linear interpolation), seconds."""
        return percentile(self.samples_s, 90.0)


@dataclass(frozen=True)
class PeakMemory:
    """Memory of one call, bytes: the peak while it ran, and how far that peak rose above the level before it."""

    peak_bytes: int
    delta_bytes: int
    kind: str  # "rss" (CPU process resident set) or "cuda_allocated"


class SelfTimed(float):
    """Seconds a call measured itself (a peer in a child process, prefill.bench.peer_process): the timers here
    take them instead of their own clock, which would add the pipe's round trip."""


def percentile(samples: tuple[float, ...] | list[float], q: float) -> float:
    """The q-th percentile (0..100) of `samples`, linearly interpolated between order statistics."""
    if not samples:
        raise BadInput("percentile of no samples: run at least one repeat")
    if not 0.0 <= q <= 100.0:
        raise BadInput(f"percentile q must lie in 0..100, got {q}")
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def synchronize(device: str) -> None:
    """Wait for queued GPU work so the clock reads the end of the call, not the end of its launch."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_call(fn: Callable[[], object], *, repeats: int, warmup: int = 1, device: str = "cpu") -> Timing:
    """Time `fn()`: one cold call, `warmup` untimed calls, then `repeats` timed warm calls (seconds each)."""
    if repeats < 1:
        raise BadInput(f"--repeats must be at least 1, got {repeats}")
    if warmup < 0:
        raise BadInput(f"warm-up count must be >= 0, got {warmup}")
    cold = _timed(fn, device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = tuple(_timed(fn, device) for _ in range(repeats))
    return Timing(cold_s=cold, samples_s=samples)


def time_interleaved(
    fns: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 1, device: str = "cpu"
) -> dict[str, Timing]:
    """Time several engines on one point, their repeats interleaved (a, b, c, a, b, c, ...).

    A burst of other load on the machine then lands on every engine alike instead of on whichever ran
    during it. Each engine still gets its own cold call first and `warmup` untimed calls.
    """
    if repeats < 1:
        raise BadInput(f"--repeats must be at least 1, got {repeats}")
    cold = {name: _timed(fn, device) for name, fn in fns.items()}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(_timed(fn, device))
    return {name: Timing(cold_s=cold[name], samples_s=tuple(samples[name])) for name in fns}


def _timed(fn: Callable[[], object], device: str) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return float(out) if isinstance(out, SelfTimed) else time.perf_counter() - t0


def measure_peak_memory(fn: Callable[[], object], device: str = "cpu") -> PeakMemory:
    """Run `fn()` once, untimed, and return its peak memory (bytes) and its rise above the level before it; a
    call that runs in another process (a peer's, prefill.bench.peer_process.PeerRun) measures it there."""
    if (in_child := getattr(fn, "peak_memory", None)) is not None:
        return in_child()
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        return PeakMemory(peak_bytes=peak, delta_bytes=max(0, peak - before), kind="cuda_allocated")
    _release_free_heap()
    before = _status_kib("VmRSS") * 1024
    _reset_peak_rss()
    fn()
    peak = _status_kib("VmHWM") * 1024
    return PeakMemory(peak_bytes=peak, delta_bytes=max(0, peak - before), kind="rss")


def _status_kib(field: str) -> int:
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    import psutil  # not Linux /proc: fall back to the current RSS (no peak tracking)

    return psutil.Process().memory_info().rss // 1024


def _reset_peak_rss() -> None:
    # Writing "5" resets VmHWM to the current RSS (Linux >= 4.0); elsewhere the peak is the lifetime peak.
    with contextlib.suppress(OSError), open(_CLEAR_REFS, "w") as f:
        f.write("5")


def _release_free_heap() -> None:
    # glibc keeps freed pages of earlier calls; trim them so the "before" level is the live memory.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def cpu_ns(pid: int) -> int | None:
    """CPU nanoseconds every thread of process `pid` has run (Linux /proc/PID/task/*/schedstat), None elsewhere."""
    from pathlib import Path

    total = 0
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(path.read_text().split()[0])
    return total or None


def settle(pid: int | None, window_s: float = 0.005, timeout_s: float = 1.0) -> None:
    """Wait (at most `timeout_s`) until the threads of process `pid` stop running (None: nothing to wait for):
    after its call an engine's thread pool spins a while for more work (ggml's threadpool polls, OpenMP's workers
    spin), and the next engine timed must not share the cores with it. Measured on a Zen 4 (2 threads, one
    process): our 1-token prefill timed right after llama.cpp's ran in 15.4 ms, once its threads had stopped in
    10.8 ms. Quiet: less than a tenth of one core over `window_s`."""
    deadline = time.monotonic() + timeout_s
    last = None if pid is None else cpu_ns(pid)
    while last is not None and time.monotonic() < deadline:
        time.sleep(window_s)
        now = cpu_ns(pid)
        if now is None or now - last < 0.1 * window_s * 1e9:
            return
        last = now


def measure_read_bandwidth(threads: int, n_bytes: int = 256 * 2**20, repeats: int = 5, clock: str = "wall") -> float:
    """Bytes/s of reading an `n_bytes` float32 array once (a sum) with `threads` threads: the stream a decode
    step's weights take, more than any cache holds (the best of `repeats`, on `clock`)."""
    import torch

    a = torch.ones(n_bytes // 4)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a.sum()
        best = min(call_seconds(a.sum, clock) for _ in range(repeats))
    finally:
        torch.set_num_threads(old)
    return n_bytes / best


def call_seconds(fn: Callable[[], object], clock: str = "wall") -> float:
    """Seconds of one call of fn on `clock` ("wall", or "cpu": this thread's CPU time); a SelfTimed result is
    the seconds a peer's child measured itself."""
    now = time.thread_time if clock == "cpu" else time.perf_counter
    t = now()
    out = fn()
    return float(out) if isinstance(out, SelfTimed) else now() - t  # a peer's child timed itself
