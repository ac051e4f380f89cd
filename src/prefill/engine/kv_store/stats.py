"""What a store answers besides blocks: the longest stored prefix of a prompt (StoreMatch) and its counters
(StoreStats)."""

from __future__ import annotations

from dataclasses import dataclass

from prefill.engine.kv_store.keys import BlockKey


@dataclass(frozen=True)
class StoreMatch:
    """The longest stored prefix of a prompt: `n_blocks` blocks (`n_tokens` tokens) under `keys`, whose files
    hold `sizes` bytes each (what a get() reads: fewer for a block that holds fewer layers)."""

    keys: tuple[BlockKey, ...]
    n_tokens: int
    sizes: tuple[int, ...]

    @property
    def n_blocks(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


@dataclass
class StoreStats:
    """Counters since the store was opened (blocks, bytes)."""

    lookups: int = 0  # longest_prefix calls
    hit_blocks: int = 0  # blocks get() returned, verified
    miss_blocks: int = 0  # blocks a lookup did not find, and blocks get() was asked for but did not return
    bytes_loaded: int = 0  # file bytes of the blocks get() returned
    corrupt_blocks: int = 0  # files rejected: checksum, fingerprint, version, key, shape, truncation, I/O error
    written_blocks: int = 0
    written_bytes: int = 0
    dropped_blocks: int = 0  # put() refused: the writer's queue was full, or the store cannot write
    evicted_blocks: int = 0  # files removed to stay under max_bytes (by this process)
    writer_cpu_s: float = 0.0  # CPU seconds the background writer spent (serialising, checksums, writes, evictions)
