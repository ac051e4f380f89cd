"""The step's rows as the model sees them: a ForwardBatch (prefill.model.batch) built from block tables.

For each row (a sequence and its T new tokens) this computes, once per forward rather than once per layer, the
slots its new K/V go to and the runs of slots its past lies in, in every layer group; a windowed group's past
starts at the window of the row's first new position.
"""

from __future__ import annotations

import torch

from prefill.engine.kvcache import KVPool, SeqKV
from prefill.model.batch import ForwardBatch, PagedQueries, Row


def forward_batch(pool: KVPool, rows: list[tuple[SeqKV, int]], device, every_token: bool = False) -> ForwardBatch:
    """The batch of rows [(seq, T)]: seq's T new tokens at positions seq.length .. seq.length + T - 1. Every
    seq must hold blocks for them (SeqKV.reserve). The paged kernel answers the decode rows' queries, or with
    `every_token` (the batch-invariant mode) every token's."""
    positions, writes, out, offset = [], [[] for _ in pool.groups], [], 0
    for seq, T in rows:
        start = seq.length
        positions.append(torch.arange(start, start + T))
        past_end = start + 1 if T == 1 else start  # a decode row reads its own new K/V back from the pool
        runs, first, whole = [], [], []
        for g, group in enumerate(pool.groups):
            writes[g].append(seq.slots(g, start, start + T))
            lo = seq.first_held(g) if group.window is None else max(seq.first_held(g), start - group.window + 1)
            runs.append(tuple(seq.runs(g, lo, past_end)) if lo < past_end else ())
            first.append(lo)
            if T > 1 and lo < start:  # a chunk after a past: is the past and the chunk one run of slots?
                one = seq.runs(g, lo, start + T)
                whole.append(one[0] if len(one) == 1 else None)
        out.append(Row(offset, T, start, tuple(runs), tuple(first), tuple(whole)))
        offset += T
    queries = [
        (seq, row, p)
        for (seq, _), row in zip(rows, out, strict=True)
        if every_token or row.paged
        for p in range(row.start, row.start + row.T)
    ]
    return ForwardBatch(
        k=pool.k,
        v=pool.v,
        group_of=pool.group_of,
        windows=[g.window for g in pool.groups],
        positions=torch.cat(positions).to(device),  # [N]
        write=[torch.cat(w).to(device) for w in writes],  # per group [N]
        rows=out,
        paged=_paged_queries(pool, queries, device, every_token) if queries else None,
    )


def _paged_queries(pool: KVPool, queries: list[tuple[SeqKV, Row, int]], device, every_token: bool) -> PagedQueries:
    """Block tables of the queries [(seq, row, position)], one padded [Q, T] table per layer group; a query at
    position p reads first .. p (its window's start in a windowed group)."""
    tables = []
    for g, group in enumerate(pool.groups):
        width = max(len(seq.tables[g]) for seq, _, _ in queries)
        table = torch.full((len(queries), width), -1, dtype=torch.long)
        for i, (seq, _, _) in enumerate(queries):
            table[i, : len(seq.tables[g])] = torch.tensor(seq.tables[g], dtype=torch.long)
        first_block = torch.tensor([seq.first[g] for seq, _, _ in queries])
        lows = [
            seq.first_held(g) if group.window is None else max(seq.first_held(g), p - group.window + 1)
            for seq, _, p in queries
        ]
        end = torch.tensor([p + 1 for _, _, p in queries])
        tables.append((table.to(device), first_block.to(device), torch.tensor(lows).to(device), end.to(device)))
    index = torch.tensor([row.offset + p - row.start for _, row, p in queries], device=device)
    return PagedQueries(index, tables, pool.block_size, every_token)
