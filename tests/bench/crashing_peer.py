"""Peers for the child-process tests: module-level factories (a spawned child imports them by name) of peers that
die by signal 11 as llama.cpp's native build did on an AMX Xeon, at load or at their first long prompt."""

from __future__ import annotations

import os
import signal
import sys


class CrashingPeer:
    """prefill(ids) returns for short prompts and segfaults (signal 11, on purpose) from `crash_from` tokens."""

    version = "0.0-test"

    def __init__(self, crash_from: int) -> None:
        self.crash_from = crash_from

    def prefill(self, ids) -> None:
        if len(ids) >= self.crash_from:
            print(f"about to crash at {len(ids)} tokens", flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)

    def fill(self, ids) -> None:  # LlamaCppPeer's: a context to step after
        self.prefill(ids)

    def step(self) -> None:
        pass

    def peak(self, ids):
        from prefill.bench.timing import measure_peak_memory

        return measure_peak_memory(lambda: self.prefill(ids))

    def fails(self) -> None:
        raise ValueError("a Python error in the child")


def crashing_peer(crash_from: int = 64) -> CrashingPeer:
    return CrashingPeer(crash_from)


def crash_at_load() -> CrashingPeer:
    print("loading, then crashing", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)
    return CrashingPeer(0)


def crashing_llamacpp(path: str, n_ctx: int, threads: int, extra_bufts: bool = True) -> CrashingPeer:
    """In place of prefill.bench.peers.load_llamacpp_child: segfaults at its first prompt of 8 tokens or more,
    with its extra buffer types off too."""
    return CrashingPeer(8)


def repacking_llamacpp(path: str, n_ctx: int, threads: int, extra_bufts: bool = True) -> CrashingPeer:
    """llama.cpp as on an AMX Xeon (llama.cpp#20824): segfaults at its first prompt of 8 tokens or more with its
    extra buffer types (weight repacking) on, runs with them off."""
    return CrashingPeer(8 if extra_bufts else 10**9)
