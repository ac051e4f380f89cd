"""OpenMP's thread pools, one per thread that ran a parallel region, and why a process that computes on one thread
should keep only that thread's.

torch's CPU kernels run their parallel regions on libgomp. Every thread that starts one gets a pool of helper
threads of its own, kept for as long as that thread lives. Between two regions the helpers spin, ready for the
next; but once libgomp manages more threads than the process may use CPUs, it cuts the spin to about a hundred
iterations, so every region waits for its helpers to wake from a futex (hundreds of regions a decode step).
A server loads and warms its model on the main thread and computes on its worker thread: two pools, four threads on
two cores. Measured on a 2-core Zen 3, float32 SmolLM2, in-process step loop, with one more thread alive that had
run one matrix product: ITL 50.6 -> 58.0 ms at 1 stream and 68.2 -> 85.0 ms at 8. The server's ITL was exactly
that much above the engine's.

`release_thread_pool()` frees the calling thread's pool (OpenMP 5.0's omp_pause_resource_all): the thread that
hands the model to another calls it, and the pool comes back by itself if that thread runs a region again.
"""

from __future__ import annotations

import ctypes
import functools
import logging

log = logging.getLogger("prefill.machine")
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: threads freed, the runtime's state kept


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """The libgomp this process has loaded (torch's own copy), or None (another runtime, or none loaded)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line and "/" in line}
    except OSError:  # not Linux: nothing to do
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)  # the loaded object again, not a second copy: dlopen matches its path
        except OSError:
            continue
        if hasattr(lib, "omp_pause_resource_all"):
            lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            return lib
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP helper threads. True when libgomp did; False where there is no libgomp
    with OpenMP 5.0's pause (the call is then a no-op)."""
    lib = _libgomp()
    if lib is None:
        return False
    done = lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
    if not done:
        log.debug("omp_pause_resource_all refused (inside a parallel region?)")
    return done
