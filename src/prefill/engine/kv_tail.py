"""Both from opposite ends (Cake, ICML'25): the tail of a stored prefix is read on a background thread while
the step loop computes its head, and the request's prefill waits at the split until the tail is in.

    pending = loader.start(tier, keys, seq, at, length)   # at: the split; length: seq.length once loaded
    pending.done()                                        # the tail is in (or failed)
    pending.apply(seq)                                    # seq.length jumps from `at` to what was loaded

The thread copies with numpy, not torch: a torch copy on a second thread opens a second OpenMP team beside the
engine's, whose threads spin between copies on the cores the engine computes on (prefill.machine.openmp). The
head and the tail are different positions of the same reserved pool blocks, so the forward and the copies never
touch the same memory.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from prefill.costmodel.kv_store import LoadDecision

if TYPE_CHECKING:
    from prefill.engine.kv_store import BlockKey
    from prefill.engine.kvcache import SeqKV


class BlockSource(Protocol):
    """Where a tail's blocks come from (prefill.engine.kv_tier.StoreTier): its block size and its one read."""

    block_size: int

    def load_blocks(self, keys, seq, at, staging, copy) -> tuple[int, bytearray | None]: ...


log = logging.getLogger("prefill.kv_store")


@dataclass
class PendingLoad:
    """A tail being loaded: blocks `keys` into positions `at` ..; the sequence holds `length` positions once they
    are all in (the positions after the prompt's reusable ones are recomputed)."""

    at: int
    length: int
    keys: tuple[BlockKey, ...]
    sizes: tuple[int, ...]  # bytes of each key's block file
    block_size: int
    future: Future = field(repr=False)
    t0: float = 0.0
    seconds: float = 0.0  # measured on the thread: reading, verifying and copying the tail

    def done(self) -> bool:
        return self.future.done()

    def wait(self) -> int:
        """Blocks loaded, once the thread is through (0 when it failed: one warning)."""
        try:
            return self.future.result()
        except Exception as e:  # noqa: BLE001 - a failed load is a miss; the head is computed on
            log.warning("kv store: loading a stored tail failed (%s); computing it", e)
            return 0

    def apply(self, seq: SeqKV) -> int:
        """Extend seq (computed up to `at`) by the tail's loaded blocks; returns the positions it gained."""
        loaded = self.wait()
        if seq.length != self.at or not loaded:
            return 0
        seq.length = min(self.length, self.at + loaded * self.block_size)
        return seq.length - self.at


def numpy_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[...] = src on the CPU without torch's thread pool (any strides)."""
    np.copyto(dst.numpy(), src.numpy())


class TailLoader:
    """One background thread that loads tails for a StoreTier (any BlockSource), with its own staging buffer."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kv-store-loader")
        self._staging: bytearray | None = None

    def start(
        self, tier: BlockSource, keys: tuple[BlockKey, ...], sizes: tuple[int, ...], seq: SeqKV, at: int, length: int
    ) -> PendingLoad:
        """Start loading `keys` (block files of `sizes` bytes) into seq's reserved blocks from position `at` (a
        block boundary); the sequence will hold `length` positions once they are in."""
        pending = PendingLoad(at, length, keys, sizes, tier.block_size, Future(), time.perf_counter())

        def run() -> int:
            copy = numpy_copy if seq.pool.kv[0].device.type == "cpu" else None
            loaded, self._staging = tier.load_blocks(keys, seq, at, self._staging, copy)
            pending.seconds = time.perf_counter() - pending.t0
            return loaded

        pending.future = self._pool.submit(run)
        return pending

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass
class StoreUse:
    """What the store did for one request: the cost model's decision, and what was loaded (measured)."""

    decision: LoadDecision
    loaded_tokens: int = 0
    loaded_bytes: int = 0
    load_s: float = 0.0  # measured: reading, verifying and copying into the pool
    bad_blocks: int = 0  # stored blocks rejected on the way (checksum, fingerprint, truncation...)
    resident_share: float | None = None  # of the loaded files' pages in the page cache before the read (Linux)
    pending: PendingLoad | None = None  # "both": the tail still loading (prefill.engine.kv_tail)

    @property
    def saved_s(self) -> float:
        """The decision's predicted saving, in the share of its planned load that happened (a bad block can cut
        it short)."""
        d = self.decision
        planned = d.n_tokens - (d.split if d.choice == "both" else 0)
        return d.saved_s * self.loaded_tokens / planned if planned else 0.0

    def as_dict(self) -> dict:
        return {
            **self.decision.as_dict(),
            "loaded_tokens": self.loaded_tokens,
            "loaded_bytes": self.loaded_bytes,
            "load_s": self.load_s,
            "bad_blocks": self.bad_blocks,
            "resident_share": self.resident_share,
        }
