"""A chunk after a cached past is answered by the paged kernel query by query when it has few query-key pairs;
else it reads its past and its own K/V as one view of the pool when they lie in one run of slots (one causal
call), else as pieces merged by log-sum-exp. All three give a one-pass prefill's logits within the rounding
tolerance, and each case takes the path it should."""

from __future__ import annotations

import torch

from prefill.engine.batch import forward_batch
from prefill.engine.proofs import rounding_tolerance

PAST, NEW = 40, 9


def chunk_after_past(engine, ids, fragmented: bool):
    """Prefill ids[:PAST], then ids[PAST:] as a chunk; with `fragmented`, another sequence takes a block between
    each of ours, so no two of our blocks are neighbours. Returns (last logits [1, vocab], the chunk's Row)."""
    pool = engine.new_pool(8 * 16)
    seq, other = pool.new_seq(), pool.new_seq()
    for end in range(16, 16 * 4 + 1, 16):
        seq.reserve(end)
        if fragmented:
            other.reserve(end)
    with torch.inference_mode():
        engine.prefill(ids[:PAST], seq)
        row = forward_batch(pool, [(seq, NEW)], "cpu").rows[0]
        logits, _ = engine.prefill(ids[PAST:], seq)
    return logits, row


def test_a_chunk_after_its_past_equals_one_pass_on_every_path(smollm, monkeypatch):
    import prefill.model.batch as model_batch

    ids = smollm.encode_prompt("The river runs under seven bridges; each has a name and a story. " * 4, chat=False)
    ids = ids[: PAST + NEW]
    with torch.inference_mode():
        one_pass, _ = smollm.prefill(ids)
    tol = rounding_tolerance(float(one_pass.abs().max()), smollm.spec, smollm.dtype)
    paged, row = chunk_after_past(smollm, ids, fragmented=False)
    assert row.paged  # 9 x 49 query-key pairs
    monkeypatch.setattr(model_batch, "PAGED_PAIRS", 0)
    view, row = chunk_after_past(smollm, ids, fragmented=False)
    assert not row.paged and row.whole == ((0, PAST + NEW),)  # blocks 0..3 in a row: one view from slot 0
    pieces, row = chunk_after_past(smollm, ids, fragmented=True)
    assert not row.paged and row.whole == (None,)
    for logits in (paged, view, pieces):
        assert (logits - one_pass).abs().max().item() <= tol
