"""Decode rows of a bfloat16 pool (`prefill serve`'s dtype on AMX CPUs) go to the paged kernel in one call, each
row reading its past where it lies, however its blocks interleave with other rows' (the serving core allocates
them in turn): attention over each row's keys within one bfloat16 rounding of the output, and the same as the
row-by-row path over each run of the pool."""

from __future__ import annotations

import pytest
import torch

from prefill.engine.batch import forward_batch
from prefill.engine.kvcache import KVPool
from prefill.model import attention, kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the C++ kernels are not built (no compiler)")
H_q, H_kv, D, BS = 9, 3, 64, 16
LENGTHS = (70, 33, 120)  # three rows whose blocks interleave: block j of row r is the pool's (j x 3 + r)


def interleaved_batch():
    """A one-layer bfloat16 pool whose three sequences took their blocks in turn, random K/V written, and the
    decode batch of their next tokens (each row's own new K/V at its position)."""
    torch.manual_seed(5)
    pool = KVPool(1, H_kv, D, 40, torch.bfloat16, "cpu", block_size=BS)
    seqs = [pool.new_seq() for _ in LENGTHS]
    for end in range(BS, max(LENGTHS) + 1 + BS, BS):
        for seq, n in zip(seqs, LENGTHS, strict=True):
            seq.reserve(min(end, n + 1))
    pool.k[0].copy_(torch.randn_like(pool.k[0], dtype=torch.float32))  # every slot: K/V of magnitude ~1
    pool.v[0].copy_(torch.randn_like(pool.v[0], dtype=torch.float32))
    for seq, n in zip(seqs, LENGTHS, strict=True):
        seq.length = n
    batch = forward_batch(pool, [(seq, 1) for seq in seqs], "cpu")
    assert all(len(row.runs[0]) > 1 for row in batch.rows)  # every row's past lies in several runs
    q = torch.randn(1, H_q, len(seqs), D).bfloat16()  # [1, H_q, N, d_head]
    k_new = torch.randn(1, H_kv, len(seqs), D).bfloat16()
    return pool, seqs, batch, q, k_new


def test_bf16_decode_rows_over_interleaved_blocks_are_attention_over_their_keys(monkeypatch):
    pool, seqs, batch, q, k_new = interleaved_batch()
    calls = []
    real = kernels.paged_attention
    monkeypatch.setattr(kernels, "paged_attention", lambda *a: calls.append(a[1].dtype) or real(*a))
    out = attention.attend(q, k_new, -k_new, batch, 0, None, D**-0.5)  # [1, H_q, N, d_head]
    assert out.dtype == torch.bfloat16 and calls == [torch.bfloat16]  # one call for the three rows
    for r, (seq, n) in enumerate(zip(seqs, LENGTHS, strict=True)):
        slots = torch.tensor([b * BS + p % BS for p in range(n + 1) for b in [seq.blocks[p // BS]]])
        K, V = pool.k[0][:, slots].double(), pool.v[0][:, slots].double()  # [H_kv, n + 1, D], the new K/V last
        qr = q[0, :, r].double().view(H_kv, H_q // H_kv, D)
        ref = (torch.softmax(qr @ K.transpose(-1, -2) * D**-0.5, -1) @ V).reshape(H_q, D)
        # float32 sums, then one rounding to bfloat16 (relative 2^-8 at most) of outputs no larger than max |V|
        bound = 2.0**-8 * float(V.abs().max()) + 1e-5
        assert float((out[0, :, r].double() - ref).abs().max()) <= bound
    monkeypatch.setattr(kernels, "paged_usable", lambda t: False)  # the row-by-row path over each run
    rows = attention.attend(q, k_new, -k_new, batch, 0, None, D**-0.5)
    assert float((rows.float() - out.float()).abs().max()) <= 2 * 2.0**-8 * float(pool.v[0].abs().max())
