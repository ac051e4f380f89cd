"""Block accounting: which of a pool's fixed-size blocks are free, and who holds the rest. No tensors.

The KV pool (prefill.engine.kvcache) owns the tensors; this owns the rules: blocks are reference-counted (the
prefix cache and every request reusing a prefix hold the same block), a block returns to the free list when its
last holder lets go, and a sequence that grows asks for the block right after its last one first, so that its
positions stay contiguous in the pool and attention reads them as one view (prefill.model.attention). The
simulator (prefill.plan.simulate) drives the same scheduling policy over a pool on torch's meta device.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefill.errors import BadInput, PrefillError


class PoolFull(PrefillError):
    """Not enough free blocks right now (the scheduler preempts or waits; a private pool was sized too small)."""


class BlockManager:
    """`n_blocks` blocks with reference counts and a free list that prefers contiguous runs."""

    def __init__(self, n_blocks: int) -> None:
        if n_blocks < 1:
            raise BadInput(f"a KV pool needs at least one block, got {n_blocks}")
        self.n_blocks = n_blocks
        self.refs = [0] * n_blocks
        self._used = bytearray(n_blocks)  # 1 where refs > 0: a run of n free blocks is a find of n zero bytes
        self._n_free = n_blocks
        self._hint = 0  # no free block below this index

    @property
    def free_blocks(self) -> int:
        return self._n_free

    @property
    def used_blocks(self) -> int:
        return self.n_blocks - self._n_free

    def _take(self, b: int) -> int:
        self.refs[b], self._used[b] = 1, 1
        self._n_free -= 1
        return b

    def allocate(self, n: int, after: int | None = None) -> list[int]:
        """`n` fresh blocks with one reference each, PoolFull when fewer are free. Contiguous where possible:
        right after block `after` (a sequence's last block) if those are free, else the lowest free run of n,
        else the lowest free blocks."""
        if n > self._n_free:
            raise PoolFull(f"{n} KV blocks needed, {self._n_free} of {self.n_blocks} free")
        if n == 0:
            return []
        used = self._used
        if after is not None and after + n < self.n_blocks and used.find(1, after + 1, after + 1 + n) < 0:
            return [self._take(b) for b in range(after + 1, after + 1 + n)]
        self._hint = used.find(0, self._hint)  # the lowest free block (one exists: n <= free)
        start = used.find(bytes(n), self._hint)  # the lowest free run of n
        if start >= 0:
            return [self._take(b) for b in range(start, start + n)]
        out, b = [], self._hint
        while len(out) < n:
            out.append(self._take(b))
            b = used.find(0, b + 1)
        return out

    def retain(self, blocks: Sequence[int]) -> None:
        """One more holder of each block (a request reusing a cached prefix, or the prefix cache itself)."""
        for b in blocks:
            if self.refs[b] < 1:
                raise RuntimeError(f"block {b} is free and cannot be shared")
            self.refs[b] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """One holder fewer; a block nobody holds goes back to the free list."""
        for b in blocks:
            if self.refs[b] < 1:
                raise RuntimeError(f"block {b} released more often than held")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self._used[b] = 0
                self._n_free += 1
                self._hint = min(self._hint, b)
