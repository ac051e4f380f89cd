"""The step's rows as the model sees them: a ForwardBatch (prefill.model.batch) built from block tables.

For each row (a sequence and its T new tokens) this computes, once per forward rather than once per layer, the
slots its new K/V go to and the runs of slots its past lies in, in every layer group; a windowed group's past
starts at the window of the row's first new position.
"""

from __future__ import annotations

import torch

from prefill.engine.kvcache import KVPool, SeqKV
from prefill.model.batch import DecodeRows, ForwardBatch, Row


def forward_batch(pool: KVPool, rows: list[tuple[SeqKV, int]], device) -> ForwardBatch:
    """The batch of rows [(seq, T)]: seq's T new tokens at positions seq.length .. seq.length + T - 1. Every
    seq must hold blocks for them (SeqKV.reserve)."""
    positions, writes, out, offset = [], [[] for _ in pool.groups], [], 0
    for seq, T in rows:
        start = seq.length
        positions.append(torch.arange(start, start + T))
        past_end = start + 1 if T == 1 else start  # a decode row reads its own new K/V back from the pool
        runs, first = [], []
        for g, group in enumerate(pool.groups):
            writes[g].append(seq.slots(g, start, start + T))
            lo = seq.first_held(g) if group.window is None else max(seq.first_held(g), start - group.window + 1)
            runs.append(tuple(seq.runs(g, lo, past_end)) if lo < past_end else ())
            first.append(lo)
        out.append(Row(offset, T, start, tuple(runs), tuple(first)))
        offset += T
    decoding = [(seq, row) for (seq, _), row in zip(rows, out, strict=True) if row.decode]
    return ForwardBatch(
        k=pool.k,
        v=pool.v,
        group_of=pool.group_of,
        windows=[g.window for g in pool.groups],
        positions=torch.cat(positions).to(device),  # [N]
        write=[torch.cat(w).to(device) for w in writes],  # per group [N]
        rows=out,
        decode=_decode_rows(pool, decoding, device) if decoding else None,
    )


def _decode_rows(pool: KVPool, decoding: list[tuple[SeqKV, Row]], device) -> DecodeRows:
    """Block tables of the decode rows, one padded [R_dec, T] table per layer group."""
    tables = []
    for g in range(len(pool.groups)):
        width = max(len(seq.tables[g]) for seq, _ in decoding)
        table = torch.full((len(decoding), width), -1, dtype=torch.long)
        for i, (seq, _) in enumerate(decoding):
            table[i, : len(seq.tables[g])] = torch.tensor(seq.tables[g], dtype=torch.long)
        first_block = torch.tensor([seq.first[g] for seq, _ in decoding])
        first = torch.tensor([row.first[g] for _, row in decoding])
        end = torch.tensor([row.start + 1 for _, row in decoding])
        tables.append((table.to(device), first_block.to(device), first.to(device), end.to(device)))
    index = torch.tensor([row.offset for _, row in decoding], device=device)
    return DecodeRows(index, tables, pool.block_size)
