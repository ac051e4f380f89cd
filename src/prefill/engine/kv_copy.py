"""K/V between stored blocks and a sequence's pool slots: into the pool after a load, out of it for a write.

A stored block is [n_layers, 2, H_kv, block_size, d_head]. A model without windows keeps every layer in one
group, so a run of n blocks goes in or out as one strided copy per run of consecutive pool blocks
(copy_into, copy_out); a model with windowed layers moves each block's layers into or out of the groups that
hold it (copy_layers_into, copy_layers_out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from prefill.engine.kv_store import KVBlock
    from prefill.engine.kvcache import SeqKV


def copy_into(
    seq: SeqKV, start: int, kv: torch.Tensor, copy: Callable[[torch.Tensor, torch.Tensor], None] | None = None
) -> None:
    """Write kv [n, L, 2, H_kv, bs, d_head] (n blocks of all layers, any strides) into seq's pool slots of
    positions start .. start + n * bs - 1 (blocks reserved already; `start` a block boundary; one layer group
    holding every layer, as the store requires): one strided copy of every layer's K and V per run of
    consecutive pool blocks (a fresh sequence has one run)."""
    if not len(kv):
        return
    pool, bs = seq.pool, seq.pool.block_size
    whole = pool.kv[0]  # [L, 2, H_kv, n_slots, d_head]
    kv = kv.to(whole.device)
    first = 0  # the first block of kv the next run takes
    for slot, end in seq.runs(0, start, start + len(kv) * bs):
        n = (end - slot) // bs
        into = whole[:, :, :, slot:end].unflatten(3, (n, bs))  # [L, 2, H_kv, n, bs, d_head] of the pool
        src = kv[first : first + n].permute(1, 2, 3, 0, 4, 5)
        if copy is None:
            into.copy_(src)
        else:
            copy(into, src)
        first += n


def copy_layers_into(seq: SeqKV, start: int, blocks: list[KVBlock]) -> None:
    """Write each block's layers into seq's pool slots of its positions (block i: start + i * bs ...), in every
    layer group that holds that block (a windowed group's table may begin later: open_windows_at); a group
    holding a block must find each of its layers in it (the store's lookup checked)."""
    pool, bs = seq.pool, seq.pool.block_size
    for g, group in enumerate(pool.groups):
        for i, block in enumerate(blocks):
            pos = start + i * bs
            if pos < seq.first_held(g):
                continue
            slot = seq.tables[g][pos // bs - seq.first[g]] * bs
            row = {layer: j for j, layer in enumerate(block.layers)}
            for r, layer in enumerate(group.layers):
                pool.kv[g][r, :, :, slot : slot + bs].copy_(block.kv[row[layer]])  # [2, H_kv, bs, d_head]


def copy_layers_out(seq: SeqKV, block: int, layers: tuple[int, ...]) -> torch.Tensor:
    """A copy of block `block`'s K/V in `layers` (each held by its group: copy_layers_into's inverse):
    [len(layers), 2, H_kv, bs, d_head]."""
    pool, bs, rows = seq.pool, seq.pool.block_size, []
    for layer in layers:
        g = pool.group_of[layer]
        slot = seq.tables[g][block - seq.first[g]] * bs
        rows.append(torch.stack([pool.k[layer][:, slot : slot + bs], pool.v[layer][:, slot : slot + bs]]))
    return torch.stack(rows)


def copy_out(seq: SeqKV, start: int, end: int) -> torch.Tensor:
    """A copy of K/V of positions start .. end - 1, every layer: [L, 2, H_kv, end - start, d_head], on the pool's
    device (the writer thread moves it to the CPU, so a GPU's copy back is not on the loop's path either)."""
    pool = seq.pool
    slots = seq.slots(0, start, end).to(pool.k[0].device)
    out = torch.empty((pool.L, 2, pool.H_kv, end - start, pool.d_head), dtype=pool.dtype, device=pool.k[0].device)
    for layer in range(pool.L):
        torch.index_select(pool.k[layer], 1, slots, out=out[layer, 0])
        torch.index_select(pool.v[layer], 1, slots, out=out[layer, 1])
    return out
