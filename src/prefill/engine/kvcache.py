"""The KV cache: a pool of fixed-size blocks shared by every sequence, and each sequence's block tables.

K/V are stored as the pool's dtype (costs.KV_DTYPES): float32, bfloat16, float16, or q8_0 rows (uint8,
prefill.model.kv_quant); attention reads them widened to float32 (prefill.model.attention).

Layers are grouped by their attention window (prefill.costmodel.families): one group for full attention, one
per sliding window (Gemma 3's local layers). Each group has its own blocks (prefill.engine.blocks) and, per
layer, K and V as [H_kv, n_slots, d_head] with n_slots = n_blocks * block_size: slot b * block_size + i is
position i of block b. A sequence (`SeqKV`) has one block table per group and a length. Blocks are allocated
as tokens arrive (`reserve`), preferring the block after the sequence's last so that its positions stay
contiguous and attention reads them in place as a view (no copy); a windowed group gives back the blocks that
left its window (`trim`), so its storage stops growing at the window, as vLLM's hybrid KV cache manager does.

Blocks are reference-counted, so a prompt prefix is shared without a copy: the prefix cache and every request
whose prompt starts with that prefix hold the same block ids (vLLM's and nano-vllm's block managers work this
way). A forward reaches the cache through a `ForwardBatch` (prefill.engine.batch).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prefill.costmodel import costs
from prefill.engine.blocks import BlockManager, PoolFull
from prefill.engine.pages import populate
from prefill.errors import BadInput
from prefill.model import kv_quant

BLOCK_SIZE = 16  # tokens per block: also the prefix cache's unit of sharing

__all__ = ["BLOCK_SIZE", "KVPool", "LayerGroup", "PoolFull", "SeqKV", "kv_dtype_name", "kv_torch_dtype", "layer_groups"]


def kv_torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """The torch dtype of the pool's K/V tensors for a K/V dtype of costs.KV_DTYPES (BadInput for others): uint8
    holds q8_0 rows (prefill.model.kv_quant)."""
    if name == torch.uint8:
        return name
    kv = costs.kv_dtype_name(str(name))
    return torch.uint8 if kv == "q8_0" else getattr(torch, kv)


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The K/V dtype (costs.KV_DTYPES) a pool tensor of `dtype` holds."""
    return "q8_0" if dtype == torch.uint8 else str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class LayerGroup:
    """Layers that share one attention window (None: full attention), and so one block table per sequence."""

    window: int | None
    layers: tuple[int, ...]


def layer_groups(windows: Sequence[int | None]) -> list[LayerGroup]:
    """The layers grouped by window, full attention first, in layer order within a group."""
    keys = sorted(set(windows), key=lambda w: -1 if w is None else w)
    return [LayerGroup(w, tuple(i for i, x in enumerate(windows) if x == w)) for w in keys]


class KVPool:
    """K and V of every layer, in blocks of `block_size` tokens per layer group, with reference counts."""

    def __init__(
        self,
        L: int,
        H_kv: int,
        d_head: int,
        n_blocks: int | Sequence[int],
        dtype: torch.dtype,
        device,
        block_size: int = BLOCK_SIZE,
        windows: Sequence[int | None] = (),
    ) -> None:
        if block_size < 1:
            raise BadInput(f"a KV pool block needs at least one token, got {block_size}")
        self.groups = layer_groups(tuple(windows) or (None,) * L)
        counts = [n_blocks] * len(self.groups) if isinstance(n_blocks, int) else list(n_blocks)
        self.managers = [BlockManager(n) for n in counts]
        self.group_of = [0] * L  # layer -> its group's index
        for g, group in enumerate(self.groups):
            for layer in group.layers:
                self.group_of[layer] = g
        # Uninitialised: memory is touched only as blocks are written, and only written slots are ever read.
        # One tensor per group, [n_layers, 2, H_kv, n_slots, d_head]; each layer's K and V are views of it. A q8_0
        # pool (uint8) holds each slot's d_head values as one q8_0 row of d_head / 32 * 34 bytes instead.
        width = kv_quant.row_bytes(d_head) if dtype == torch.uint8 else d_head
        self.kv = [
            torch.empty((len(g.layers), 2, H_kv, n * block_size, width), dtype=dtype, device=device)
            for g, n in zip(self.groups, counts, strict=True)
        ]
        row = {layer: (g, i) for g, group in enumerate(self.groups) for i, layer in enumerate(group.layers)}
        self.k = [self.kv[row[i][0]][row[i][1], 0] for i in range(L)]  # L x [H_kv, n_slots, d_head]
        self.v = [self.kv[row[i][0]][row[i][1], 1] for i in range(L)]  # L x [H_kv, n_slots, d_head]
        self.L, self.H_kv, self.d_head, self.dtype, self.block_size = L, H_kv, d_head, dtype, block_size

    @classmethod
    def for_tokens(cls, spec, tokens: int, dtype: torch.dtype, device, block_size: int = BLOCK_SIZE) -> KVPool:
        """A pool big enough for one sequence of `tokens` positions of the model `spec`, in every group."""
        n_blocks = max(1, math.ceil(tokens / block_size))
        return cls(spec.L, spec.H_kv, spec.d_head, n_blocks, dtype, device, block_size, spec.windows)

    @classmethod
    def for_bytes(cls, spec, nbytes: int, dtype: torch.dtype, device, block_size: int = BLOCK_SIZE) -> KVPool:
        """A pool of about `nbytes`, split between the layer groups so that each holds as many sequences of the
        model's context length as the others (a windowed group needs only its window's blocks per sequence)."""
        groups = layer_groups(spec.windows)
        ctx_blocks = math.ceil(spec.context_length / block_size)
        # Blocks one long sequence holds per group: all of them, or its window's (with kv_window_start's one
        # block of slack) plus a 256-token chunk's.
        need = [
            ctx_blocks if g.window is None else min(ctx_blocks, math.ceil((g.window + 256) / block_size) + 2)
            for g in groups
        ]
        per_token = 2 * spec.H_kv * spec.d_head * costs.kv_bytes_per_element(kv_dtype_name(dtype))  # one layer
        per_seq = sum(n * len(g.layers) * per_token * block_size for n, g in zip(need, groups, strict=True))
        seqs = max(1e-9, nbytes / per_seq)
        counts = [max(1, int(n * seqs)) for n in need]
        return cls(spec.L, spec.H_kv, spec.d_head, counts, dtype, device, block_size, spec.windows)

    # ---- accounting ----
    def bytes_per_block(self, group: int = 0) -> int:
        """K and V of one block of one group's layers."""
        one = self.k[self.groups[group].layers[0]]
        return 2 * len(self.groups[group].layers) * one.shape[0] * self.block_size * one.shape[2] * one.element_size()

    @functools.cached_property
    def bytes_per_token(self) -> int:
        """K and V of one position, all layers: 2 * L * H_kv * d_head * bytes per element (of a slot's row)."""
        return 2 * self.L * self.H_kv * self.k[0].shape[2] * self.k[0].element_size()

    @functools.cached_property
    def group_position_bytes(self) -> list[int]:
        """K and V of one position in each group's layers (every token's accept asks SeqKV.nbytes)."""
        return [self.bytes_per_token // self.L * len(group.layers) for group in self.groups]

    @property
    def n_blocks(self) -> int:
        return sum(m.n_blocks for m in self.managers)

    @property
    def free_blocks(self) -> int:
        return sum(m.free_blocks for m in self.managers)

    @property
    def used_blocks(self) -> int:
        return sum(m.used_blocks for m in self.managers)

    def used_bytes(self) -> int:
        """Bytes of the blocks some sequence or the prefix cache holds."""
        return sum(m.used_blocks * self.bytes_per_block(g) for g, m in enumerate(self.managers))

    def allocated_bytes(self) -> int:
        """Bytes the pool's tensors take (all blocks, used or not)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def populate(self) -> int:
        """Make every K/V tensor's pages resident now (prefill.engine.pages: contents unchanged), so that no
        request pays first-touch page faults; a server does this once at its start. Returns the bytes."""
        return sum(populate(t) for t in self.kv)

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def max_tokens(self) -> int:
        """The longest sequence the pool could ever hold (in its full-attention group, or any, if all windowed)."""
        full = [m for g, m in zip(self.groups, self.managers, strict=True) if g.window is None]
        return min(m.n_blocks for m in full or self.managers) * self.block_size

    def new_seq(self, prefix: Sequence[Sequence[int]] = (), prefix_tokens: int = 0) -> SeqKV:
        """An empty sequence, or one that starts with `prefix_tokens` cached positions held in the `prefix`
        blocks (one list per group: the full group's from position 0, a windowed group's the last blocks of the
        prefix); they are shared, not copied."""
        tables = [list(p) for p in prefix] or [[] for _ in self.groups]
        for manager, table in zip(self.managers, tables, strict=True):
            manager.retain(table)
        first = [self.blocks_for(prefix_tokens) - len(t) for t in tables]
        return SeqKV(self, tables, first, prefix_tokens)


class SeqKV:
    """One sequence's cache: per layer group, a block table (block j of the table holds positions
    (first + j) * block_size ...); and the number of positions filled."""

    def __init__(self, pool: KVPool, tables: list[list[int]], first: list[int], length: int) -> None:
        self.pool, self.tables, self.first, self.length = pool, tables, first, length

    @property
    def blocks(self) -> list[int]:
        """The full-attention group's block table (all of the sequence's positions; the prefix cache's unit)."""
        return self.tables[0]

    # ---- growing and shrinking ----
    def reserve(self, end: int) -> None:
        """Blocks for every position up to `end` - 1 in every group, allocated now; PoolFull (and nothing
        allocated) when a group has too few free blocks."""
        fresh = []
        try:
            for g, (manager, need) in enumerate(zip(self.pool.managers, self.reserve_needs(end), strict=True)):
                if need > 0:
                    last = self.tables[g][-1] if self.tables[g] else None
                    fresh.append((g, manager.allocate(need, after=last)))
        except PoolFull:
            for g, blocks in fresh:
                self.pool.managers[g].release(blocks)
            raise
        for g, blocks in fresh:
            self.tables[g].extend(blocks)

    def reserve_needs(self, end: int) -> list[int]:
        """Fresh blocks each group would need for positions up to `end` - 1 (what `reserve(end)` allocates)."""
        blocks = -(-end // self.pool.block_size)  # ceil: each running row asks at every step
        return [max(0, blocks - first - len(t)) for first, t in zip(self.first, self.tables, strict=True)]

    def trim(self) -> None:
        """Give back the blocks of windowed groups that no later query can see, nor a continuation of a stored
        copy of the cache (costs.kv_window_start: the next position, `length`, sees length - W + 1 .. length in
        a layer with a window of W; a reload continues from the last block boundary at the latest)."""
        bs = self.pool.block_size
        for g, group in enumerate(self.pool.groups):
            if group.window is None:
                continue
            dead = costs.kv_window_start(self.length, group.window, bs) // bs - self.first[g]  # wholly before it
            if dead > 0:
                self.pool.managers[g].release(self.tables[g][:dead])
                del self.tables[g][:dead]
                self.first[g] += dead

    def open_windows_at(self, length: int) -> None:
        """An empty sequence about to receive `length` positions at once (loaded, not computed): each windowed
        group's table starts at the block holding length - W + 1, the first position the continuation from
        `length` reads, so that reserve() allocates no block the window has left (or whose K/V was not loaded)."""
        if self.length or any(self.tables):
            raise BadInput("only an empty sequence opens its windows at a later position")
        bs = self.pool.block_size
        for g, group in enumerate(self.pool.groups):
            if group.window is not None:
                self.first[g] = max(0, length - group.window + 1) // bs

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on (the next write overwrites them; blocks stay)."""
        if not 0 <= length <= self.length:
            raise BadInput(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length

    def free(self) -> None:
        """Give the blocks back (shared ones stay with their other holders). Safe to call twice."""
        for manager, table in zip(self.pool.managers, self.tables, strict=True):
            manager.release(table)
        self.tables = [[] for _ in self.tables]
        self.first = [0] * len(self.tables)
        self.length = 0

    # ---- where positions live ----
    def first_held(self, group: int) -> int:
        """The first position whose block this group still holds (0 for full attention)."""
        return self.first[group] * self.pool.block_size

    def slots(self, group: int, start: int, end: int) -> torch.Tensor:
        """Pool slots [end - start] (long) of positions start..end-1 in one group's layers."""
        bs = self.pool.block_size
        table = torch.tensor(self.tables[group], dtype=torch.long)
        pos = torch.arange(start, end) - self.first[group] * bs
        return table[pos // bs] * bs + pos % bs

    def runs(self, group: int, start: int, end: int) -> list[tuple[int, int]]:
        """Positions start..end-1 of one group as runs of consecutive pool slots [(slot, slot_end), ...]: each run
        is read as one view of the pool's tensors. A sequence whose blocks are contiguous has one run."""
        bs, table, out = self.pool.block_size, self.tables[group], []
        pos = start
        while pos < end:
            j = pos // bs - self.first[group]
            slot = table[j] * bs + pos % bs
            stop = min(end, (pos // bs + 1) * bs)
            while stop < end and table[j + 1] == table[j] + 1:  # the next block follows this one in the pool
                j += 1
                stop = min(end, stop + bs)
            out.append((slot, slot + stop - pos))
            pos = stop
        return out

    # ---- what it holds ----
    def held_positions(self, layer: int) -> int:
        """Filled positions whose blocks `layer` still holds (all of them in a full-attention layer)."""
        return self.held_in_group(self.pool.group_of[layer])

    def held_in_group(self, group: int) -> int:
        """Filled positions whose blocks each layer of `group` still holds."""
        return self.length - min(self.length, self.first_held(group))

    def nbytes(self) -> int:
        """Bytes of K and V of the filled positions the sequence still holds, all layers (sizes read off the
        pool's tensors): every position in a full-attention layer; in a windowed layer, those of the blocks not
        yet trimmed (prefill.costmodel.costs.kv_cache_bytes_held is the formula)."""
        return sum(b * self.held_in_group(g) for g, b in enumerate(self.pool.group_position_bytes))

    def reserved_bytes(self) -> int:
        """Bytes of the blocks this sequence holds (filled or not)."""
        return sum(len(t) * self.pool.bytes_per_block(g) for g, t in enumerate(self.tables))

    def shape(self) -> tuple[int, int, int, int]:
        """[B, H_kv, P, d_head] of one full-attention layer's K (or V) as filled."""
        return (1, self.pool.H_kv, self.length, self.pool.d_head)

    def k(self, layer: int) -> torch.Tensor:
        """Keys of the positions `layer` holds, gathered: [1, H_kv, held_positions(layer), d_head] (a q8_0 pool's
        dequantized to float32)."""
        return self._gather(self.pool.k[layer], layer)

    def v(self, layer: int) -> torch.Tensor:
        """Values of the positions `layer` holds, gathered: [1, H_kv, held_positions(layer), d_head]."""
        return self._gather(self.pool.v[layer], layer)

    def _gather(self, t: torch.Tensor, layer: int) -> torch.Tensor:
        g = self.pool.group_of[layer]
        start = self.length - self.held_positions(layer)
        rows = t.index_select(1, self.slots(g, start, self.length).to(t.device))[None]
        return kv_quant.dequantize(rows) if rows.dtype == torch.uint8 else rows
