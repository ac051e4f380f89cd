"""The step's rows as the model sees them: a ForwardBatch (prefill.model.batch) built from block tables.

For each row (a sequence and its T new tokens) this computes, once per forward rather than once per layer, the
slots its new K/V go to and the runs of slots its past lies in, in every layer group; a windowed group's past
starts at the window of the row's first new position.
"""

from __future__ import annotations

import torch

from prefill.engine.kvcache import KVPool, SeqKV
from prefill.model.batch import ForwardBatch, Row


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
    return ForwardBatch(
        k=pool.k,
        v=pool.v,
        group_of=pool.group_of,
        windows=[g.window for g in pool.groups],
        positions=torch.cat(positions).to(device),  # [N]
        write=[torch.cat(w).to(device) for w in writes],  # per group [N]
        rows=out,
    )
