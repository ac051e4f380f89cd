"""What one forward needs to know of the KV cache: where each new token's K/V goes and where each row's past lies.

A forward runs N tokens flattened from R rows: row r's T_r new tokens continue its sequence at positions
start_r .. start_r + T_r - 1 (a prefill chunk, or T_r = 1 for a decode step), so the projections and the MLP
are one GEMM over all N tokens whatever mix of prefill and decode the step holds. Attention is per row, over
that row's past read where it lies in the pool (`Row.runs`: runs of consecutive slots, each read as a view, no
copy) and, for a chunk of several tokens, its own new K/V under the causal mask. The engine builds the batch
from its block tables (prefill.engine.batch); the model only reads it, so it knows nothing of blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from prefill.model import kv_quant

# Query-key pairs up to which a chunk after a past goes to the paged kernel. On the 2-core Zen 3 (float32, 2
# threads), 3 tokens after 240: 34.2 ms through one masked causal call per layer, 15.5 ms for 1 token paged.
PAGED_PAIRS = 4096


@dataclass(frozen=True)
class Row:
    """One row of a forward: its tokens offset .. offset + T - 1 of the batch, at positions start .. start + T - 1.

    runs[g]: for layer group g, the past this row's queries may read, as runs of pool slots [(slot, slot_end)]
    covering positions first[g] .. past_end - 1 in order; past_end is start + 1 for a decode row (its own new
    K/V is read from the pool after it is written) and start for a chunk (its own K/V comes fresh).
    whole[g]: for a chunk after a past, the slots (slot, slot_end) of positions first[g] .. start + T - 1 when they
    are one run of the pool (its past and, once stored, its own K/V: one view), else None.
    """

    offset: int
    T: int
    start: int
    runs: tuple[tuple[tuple[int, int], ...], ...]
    first: tuple[int, ...]
    whole: tuple[tuple[int, int] | None, ...] = ()

    @property
    def decode(self) -> bool:
        return self.T == 1

    @property
    def paged(self) -> bool:
        """Answered by the paged kernel, query by query, each reading its past where it lies: a decode row, or a
        chunk after a past with few query-key pairs (PAGED_PAIRS), where a causal call's fixed cost per layer
        outweighs reading the past once per query."""
        return self.decode or (self.start > 0 and self.T * (self.start + self.T) <= PAGED_PAIRS)


@dataclass(frozen=True)
class PagedQueries:
    """Queries the paged attention kernel answers (prefill.model.kernels): every decode row's, or in the
    batch-invariant mode every token's. Which of the N tokens they are, and per layer group each query's block
    table and the positions it reads."""

    index: torch.Tensor  # [Q] long: the queries' tokens in the batch
    tables: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]  # per group: table [Q, T]
    # (block ids, -1 padded), first_block [Q], first [Q] and end [Q] positions
    block_size: int
    every_token: bool  # all N tokens (the batch-invariant mode), not only the decode rows


@dataclass
class ForwardBatch:
    """The cache as one forward sees it: pool tensors, where to write, and each row's reads."""

    k: list[torch.Tensor]  # per layer [H_kv, n_slots, d_head] (uint8 q8_0 rows: [H_kv, n_slots, d_head / 32 * 34])
    v: list[torch.Tensor]
    group_of: list[int]  # layer -> group
    windows: list[int | None]  # group -> its window
    positions: torch.Tensor  # [N] long: each new token's position
    write: list[torch.Tensor]  # per group [N] long: each new token's slot
    rows: list[Row]
    paged: PagedQueries | None = None
    last: torch.Tensor = field(init=False)  # [R] long: each row's last token in the batch

    def __post_init__(self) -> None:
        self.last = torch.tensor([r.offset + r.T - 1 for r in self.rows], device=self.positions.device)

    @property
    def N(self) -> int:
        return int(self.positions.shape[0])

    @property
    def fresh(self) -> bool:
        """One row and nothing cached before it: attention needs only the new K/V."""
        return len(self.rows) == 1 and self.rows[0].start == 0

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens' k, v [1, H_kv, N, d_head] to their slots in the pool; returns them as stored, in
        k's dtype (rounded to a 16-bit pool's, or q8_0's values), so that a query reads the same K/V fresh or
        from the pool."""
        slots, pool_k, pool_v = self.write[self.group_of[layer]], self.k[layer], self.v[layer]
        if pool_k.dtype == torch.uint8:  # q8_0 rows [1, H_kv, N, d_head / 32 * 34]
            ks, vs = kv_quant.quantize(k), kv_quant.quantize(v)
            pool_k.index_copy_(1, slots, ks[0])
            pool_v.index_copy_(1, slots, vs[0])
            return kv_quant.dequantize(ks, k.dtype), kv_quant.dequantize(vs, v.dtype)
        ks, vs = k.to(pool_k.dtype), v.to(pool_k.dtype)  # 16-bit K/V: rounded once here, to nearest even
        pool_k.index_copy_(1, slots, ks[0])
        pool_v.index_copy_(1, slots, vs[0])
        return ks.to(k.dtype), vs.to(v.dtype)

    def run(self, layer: int, a: int, b: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of pool slots a..b-1 in `layer` in `dtype`: [1, H_kv, b - a, d_head] each (views when the
        pool holds that dtype, else widened or dequantized copies)."""
        k, v = self.k[layer][None, :, a:b], self.v[layer][None, :, a:b]
        if k.dtype == torch.uint8:
            return kv_quant.dequantize(k, dtype), kv_quant.dequantize(v, dtype)
        return k.to(dtype), v.to(dtype)

    def past(self, layer: int, row: Row, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """The row's past in `layer` from the pool, in `dtype`: [(K [1, H_kv, S, d_head], V, first position)]."""
        g, out = self.group_of[layer], []
        pos = row.first[g]
        for a, b in row.runs[g]:
            out.append((*self.run(layer, a, b, dtype), pos))
            pos += b - a
        return out
