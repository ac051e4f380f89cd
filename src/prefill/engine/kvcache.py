"""The KV cache: one pool of fixed-size blocks shared by every sequence, and each sequence's block table.

Per layer the pool holds K and V as [H_kv, n_slots, d_head], n_slots = n_blocks * block_size: slot
b * block_size + i is position i of block b. A sequence (`SeqKV`) owns a list of block ids and a length; its
position p lives in slot blocks[p // block_size] * block_size + p % block_size. Gathering its slots gives the
familiar per-layer view [1, H_kv, P, d_head] (`seq.k(layer)`), which the proofs compare with transformers.

Blocks are reference-counted so that a prompt prefix can be shared without a copy: the prefix cache and every
request whose prompt starts with that prefix hold the same block ids; a block returns to the free list when
its last holder releases it (vLLM's PagedAttention block manager and nano-vllm's BlockManager work this way).
A forward pass reaches the cache only through `KVBatch.update`, which writes the new K/V of every row at that
row's positions and returns what attention may read.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import torch

from prefill.errors import BadInput, PrefillError

BLOCK_SIZE = 16  # tokens per block: also the prefix cache's unit of sharing


class PoolFull(PrefillError):
    """Not enough free blocks right now (a request waits, or a private pool was sized too small)."""


class KVPool:
    """K and V of every layer for `n_blocks` blocks of `block_size` tokens, with reference counts."""

    def __init__(self, L: int, H_kv: int, d_head: int, n_blocks: int, dtype: torch.dtype, device,
                 block_size: int = BLOCK_SIZE, windows: Sequence[int | None] = ()) -> None:  # fmt: skip
        if n_blocks < 1 or block_size < 1:
            raise BadInput(f"a KV pool needs at least one block of at least one token (got {n_blocks} x {block_size})")
        shape = (H_kv, n_blocks * block_size, d_head)
        # Uninitialised: memory is touched only as blocks are written, and only written slots are ever read.
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(L)]  # L x [H_kv, n_slots, d_head]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(L)]  # L x [H_kv, n_slots, d_head]
        self.L, self.H_kv, self.d_head, self.dtype = L, H_kv, d_head, dtype
        self.n_blocks, self.block_size = n_blocks, block_size
        self.refs = [0] * n_blocks
        self.windows = tuple(windows) or (None,) * L  # per layer: the sliding window, or None (full attention)
        self._free = collections.deque(range(n_blocks))

    @classmethod
    def for_tokens(cls, spec, tokens: int, dtype: torch.dtype, device, block_size: int = BLOCK_SIZE) -> KVPool:
        """A pool big enough for `tokens` positions of one sequence of the model `spec`."""
        n_blocks = max(1, math.ceil(tokens / block_size))
        return cls(spec.L, spec.H_kv, spec.d_head, n_blocks, dtype, device, block_size, spec.windows)

    @classmethod
    def for_bytes(cls, spec, nbytes: int, dtype: torch.dtype, device, block_size: int = BLOCK_SIZE) -> KVPool:
        """A pool of as many blocks as fit in `nbytes` (at least one)."""
        per_block = 2 * spec.L * spec.H_kv * block_size * spec.d_head * torch.tensor([], dtype=dtype).element_size()
        return cls(spec.L, spec.H_kv, spec.d_head, max(1, nbytes // per_block), dtype, device, block_size, spec.windows)

    # ---- accounting ----
    @property
    def bytes_per_token(self) -> int:
        """K and V of one position, all layers: 2 * L * H_kv * d_head * bytes per element."""
        return 2 * self.L * self.H_kv * self.d_head * self.k[0].element_size()

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.n_blocks - len(self._free)

    def allocated_bytes(self) -> int:
        """Bytes the pool's tensors take (all blocks, used or not)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    # ---- blocks ----
    def allocate(self, n: int) -> list[int]:
        """`n` fresh blocks with one reference each; PoolFull when fewer are free."""
        if n > len(self._free):
            raise PoolFull(f"{n} KV blocks needed, {len(self._free)} of {self.n_blocks} free")
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self.refs[b] = 1
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
                self._free.append(b)

    def new_seq(self, capacity: int, prefix: Sequence[int] = (), prefix_tokens: int = 0) -> SeqKV:
        """A sequence that may grow to `capacity` tokens: it shares the `prefix` blocks (holding
        `prefix_tokens` positions, whole blocks) and owns fresh blocks for the rest, all reserved now."""
        fresh = self.allocate(max(0, self.blocks_for(capacity) - len(prefix)))
        self.retain(prefix)
        return SeqKV(self, list(prefix) + fresh, prefix_tokens, capacity)


class SeqKV:
    """One sequence's cache: block ids in a pool and the number of positions filled."""

    def __init__(self, pool: KVPool, blocks: list[int], length: int, capacity: int) -> None:
        self.pool, self.blocks, self.length, self.capacity = pool, blocks, length, capacity

    def slots(self, start: int, end: int) -> torch.Tensor:
        """Pool slots of positions start..end-1 [end - start] (long)."""
        bs = self.pool.block_size
        table = torch.tensor(self.blocks, dtype=torch.long)
        pos = torch.arange(start, end)
        return (table[pos // bs] * bs + pos % bs).to(self.pool.k[0].device)

    def k(self, layer: int) -> torch.Tensor:
        """Keys of positions 0..length-1 of `layer`, gathered: [1, H_kv, length, d_head]."""
        return self.pool.k[layer].index_select(1, self.slots(0, self.length))[None]

    def v(self, layer: int) -> torch.Tensor:
        """Values of positions 0..length-1 of `layer`, gathered: [1, H_kv, length, d_head]."""
        return self.pool.v[layer].index_select(1, self.slots(0, self.length))[None]

    def shape(self) -> tuple[int, int, int, int]:
        """[B, H_kv, P, d_head] of one layer's K (or V) as filled."""
        return (1, self.pool.H_kv, self.length, self.pool.d_head)

    def nbytes(self) -> int:
        """Bytes of K and V held for the filled positions that attention may still read, all layers (sizes
        read off the pool's tensors): every position of a full-attention layer, the last W of a layer with a
        sliding window of W. A windowed layer's older positions are dead; their slots stay in their blocks
        until the sequence is freed, because a block holds one range of positions for all layers
        (reserved_bytes counts those)."""
        one = self.pool.k[0]
        per_layer = 2 * one.shape[0] * one.shape[2] * one.element_size()  # K and V of one position
        return per_layer * sum(self.length if w is None else min(self.length, w) for w in self.pool.windows)

    def reserved_bytes(self) -> int:
        """Bytes of the blocks this sequence holds (filled or not)."""
        return len(self.blocks) * self.pool.bytes_per_block

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on (the next write overwrites them)."""
        if not 0 <= length <= self.length:
            raise BadInput(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length

    def free(self) -> None:
        """Give the blocks back (shared ones stay with their other holders). Safe to call twice."""
        self.pool.release(self.blocks)
        self.blocks, self.length, self.capacity = [], 0, 0


class KVBatch:
    """The rows of one forward pass: each row's sequence and the positions of its T new tokens.

    Built once per forward; the slot indices are computed here, not in every layer.
    """

    def __init__(self, seqs: Sequence[SeqKV], T: int) -> None:
        self.seqs = list(seqs)
        self.starts = [s.length for s in self.seqs]  # row b's new tokens sit at positions starts[b]..+T-1
        for s in self.seqs:
            if s.length + T > s.capacity:
                raise BadInput(f"KV cache holds {s.capacity} tokens; {s.length + T} needed (raise the capacity)")
        self.T = T
        self.fresh = all(st == 0 for st in self.starts)  # nothing cached: attention needs only the new K/V
        self._write = torch.cat([s.slots(st, st + T) for s, st in zip(self.seqs, self.starts, strict=True)])
        self._read = None if self.fresh else [s.slots(0, st + T) for s, st in zip(self.seqs, self.starts, strict=True)]
        self.mask = None  # [B, 1, 1, S_max] when the rows are read padded to one length (see padded())
        ends = [st + T for st in self.starts]
        if not self.fresh and T == 1 and len(ends) > 1 and len(ends) * max(ends) <= 2 * sum(ends):
            # Decode rows of similar lengths: one gather and one attention call for all of them, padded to the
            # longest (at most half of what is read is padding); rows of very different lengths read their own.
            S, dev = max(ends), self._write.device
            # The row's own first slot stands in for its padding (written, so finite; masked out).
            pad = [torch.cat([r, r[:1].expand(S - len(r))]) for r in self._read]
            self._padded = torch.cat(pad)  # [B S]
            self.mask = (torch.arange(S, device=dev)[None, :] < torch.tensor(ends, device=dev)[:, None])[:, None, None]

    def positions(self, device) -> torch.Tensor:
        """[B, T] positions of the new tokens (long)."""
        return torch.tensor(self.starts, device=device)[:, None] + torch.arange(self.T, device=device)

    def read_mask(self, window: int | None = None) -> torch.Tensor:
        """The padded read's mask [B, 1, 1, S_max]; with a window, also False for positions older than each row's
        last `window` (its decode query at end - 1 sees end - window .. end - 1)."""
        if window is None:
            return self.mask
        S = self.mask.shape[-1]
        ends = self.mask.sum(-1, keepdim=True)  # [B, 1, 1, 1]: each row's length
        return self.mask & (torch.arange(S, device=self.mask.device) >= ends - window)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, window: int | None = None):
        """Store k, v [B, H_kv, T, d_head] at each row's positions and return what attention reads:
        - None when every row started empty (the new k, v are all there is to attend to);
        - (K, V) [B, H_kv, S_max, d_head] padded, with `self.mask` saying which positions are real;
        - else a list of each row's (K, V) [1, H_kv, S, d_head] over its last S positions up to start+T-1:
          all of them (S = start + T), or in a layer with a sliding `window` only those its queries may see
          (from start - window + 1 on)."""
        pool = self.seqs[0].pool
        B, H_kv, T, d = k.shape
        flat_k = k.transpose(0, 1).reshape(H_kv, B * T, d)  # [H_kv, B T, d_head]: row-major like the slots
        flat_v = v.transpose(0, 1).reshape(H_kv, B * T, d)
        pool.k[layer].index_copy_(1, self._write, flat_k)
        pool.v[layer].index_copy_(1, self._write, flat_v)
        if self._read is None:
            return None
        if self.mask is not None:
            B, S = self.mask.shape[0], self.mask.shape[-1]
            kp = pool.k[layer].index_select(1, self._padded).view(H_kv, B, S, d).transpose(0, 1)  # [B, H_kv, S, d]
            vp = pool.v[layer].index_select(1, self._padded).view(H_kv, B, S, d).transpose(0, 1)
            return kp, vp
        reads = self._read
        if window is not None:  # a windowed layer reads only the positions its queries may see
            reads = [r[max(0, st - window + 1) :] for r, st in zip(reads, self.starts, strict=True)]
        return [(pool.k[layer].index_select(1, r)[None], pool.v[layer].index_select(1, r)[None]) for r in reads]

    def advance(self) -> None:
        """After the forward: every row's length grows by T."""
        for s in self.seqs:
            s.length += self.T
