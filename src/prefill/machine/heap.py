"""glibc's malloc, told to keep what a forward frees for the next forward instead of handing it back to the kernel.

torch's CPU tensors come from malloc. A thread other than the main one (the server's worker) allocates from an
arena of 64 MiB heaps, and glibc deletes a heap as soon as everything in it is free. Once the arena's first heap
is full, each larger activation of a forward (a prefill's MLP rows, ~470 KB at 150 tokens of SmolLM2, bfloat16)
can land alone in a heap of its own: mmap 128 MiB, trim it to 64 MiB, fault its pages in, compute, free, munmap,
twelve times a layer. Traced on the Xeon VM (2 cores, bfloat16, `strace -e trace=memory` on `prefill serve`):
360 mmap and 1,080 munmap calls for one 150-token prefill in that state, each munmap a TLB shootdown across both
cores, and the step took 1.45x its prediction instead of 1.1x; the state came and went with the arena's
fragmentation (tens of seconds to minutes after a load), so a loaded server's TTFT tail missed its prediction by
up to a quarter in runs that hit it.

`keep_freed_memory()` sets glibc's top pad to a heap's size (glibc 2.36 deletes a heap that became free only when
its predecessor has less than the pad free at its end: no heap is deleted), the trim threshold above a heap's size
(no heap is shrunk, and the main heap keeps up to 128 MiB free at its top), and the mmap threshold at glibc's
largest, 32 MiB (below it, memory comes from the arenas and is reused; above it, a buffer is mapped for itself as
before). The process's memory then stays at its peak instead of following each forward up and down. The pad is
address space asked for ahead, not memory: pages count only once touched. No-op where libc is not glibc.
"""

from __future__ import annotations

import ctypes
import functools
import logging

log = logging.getLogger("prefill.machine")

M_TRIM_THRESHOLD = -1  # mallopt's parameters, from glibc's malloc.h
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 128 << 20  # above HEAP_MAX_SIZE (64 MiB on 64-bit): an arena's heaps are never trimmed
TOP_PAD = 64 << 20  # HEAP_MAX_SIZE: a freed heap is kept for the next forward
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit; a larger value is refused


@functools.cache
def glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc (it has mallopt and says its version), else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:  # no C library to open by name (Windows)
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


@functools.cache
def keep_freed_memory() -> bool:
    """Hold freed memory in the process (once per process). True when glibc took all three settings."""
    libc = glibc()
    if libc is None:  # not glibc (musl, macOS, Windows): their allocators are left alone
        return False
    mallopt, version = libc.mallopt, libc.gnu_get_libc_version
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    version.restype = ctypes.c_char_p
    settings = ((M_TOP_PAD, TOP_PAD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    done = all(mallopt(param, value) == 1 for param, value in settings)
    if not done:
        log.debug("glibc %s refused mallopt", version().decode())
    return done
