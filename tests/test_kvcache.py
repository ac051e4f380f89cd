"""The block pool: slots, reference counts, gathered per-layer views and bytes equal to the formula."""

import pytest
import torch

from prefill.costs import kv_cache_bytes
from prefill.errors import BadInput
from prefill.kvcache import KVBatch, KVPool, PoolFull


def make(L=3, H_kv=4, d=8, n_blocks=8, bs=4, dtype=torch.float32):
    return KVPool(L, H_kv, d, n_blocks, dtype, "cpu", block_size=bs)


def test_pool_shape_and_bytes():
    pool = make()
    assert len(pool.k) == len(pool.v) == 3
    assert pool.k[0].shape == (4, 8 * 4, 8)  # [H_kv, n_blocks * block_size, d_head]
    assert pool.allocated_bytes() == kv_cache_bytes(3, 4, 8, 32, 4)
    assert pool.bytes_per_block == kv_cache_bytes(3, 4, 8, 4, 4)


@pytest.mark.parametrize("dtype,b", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_written_positions_read_back_and_bytes_equal_formula(dtype, b):
    pool = make(dtype=dtype)
    seq = pool.new_seq(capacity=10)  # 3 blocks of 4
    assert len(seq.blocks) == 3 and pool.free_blocks == 5
    batch = KVBatch([seq], 5)
    k = torch.arange(4 * 5 * 8, dtype=dtype).view(1, 4, 5, 8)  # [B, H_kv, T, d_head]
    for layer in range(3):
        assert batch.update(layer, k, -k) is None  # nothing was cached: attention reads the new k, v
    batch.advance()
    assert seq.length == 5 and seq.shape() == (1, 4, 5, 8)
    assert torch.equal(seq.k(2), k) and torch.equal(seq.v(0), -k)
    assert seq.nbytes() == kv_cache_bytes(3, 4, 8, 5, b) == 2 * 3 * 4 * 5 * 8 * b


def test_rows_of_different_lengths_append_at_their_own_positions():
    pool = make(L=1, H_kv=1, d=2, n_blocks=6, bs=2)
    a, b = pool.new_seq(5), pool.new_seq(4)
    KVBatch([a], 3).update(0, torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    a.length = 3
    KVBatch([b], 1).update(0, torch.full((1, 1, 1, 2), 5.0), torch.full((1, 1, 1, 2), 5.0))
    b.length = 1
    step = KVBatch([a, b], 1)
    assert step.positions("cpu").tolist() == [[3], [1]]
    rows = step.update(0, torch.tensor([7.0, 9.0]).view(2, 1, 1, 1).expand(2, 1, 1, 2), torch.zeros(2, 1, 1, 2))
    step.advance()
    ka, kb = rows[0][0], rows[1][0]
    assert ka.shape == (1, 1, 4, 2) and kb.shape == (1, 1, 2, 2)
    assert ka[0, 0, :, 0].tolist() == [1.0, 1.0, 1.0, 7.0]
    assert kb[0, 0, :, 0].tolist() == [5.0, 9.0]
    assert (a.length, b.length) == (4, 2)


def test_refcounts_share_blocks_and_free_them_once():
    pool = make(n_blocks=4)
    a = pool.new_seq(8)  # 2 blocks
    b = pool.new_seq(12, prefix=a.blocks, prefix_tokens=8)  # shares a's 2 blocks, owns 1 more
    assert b.blocks[:2] == a.blocks and pool.used_blocks == 3
    assert [pool.refs[i] for i in a.blocks] == [2, 2]
    a.free()
    assert pool.used_blocks == 3  # b still holds the shared blocks
    b.free()
    assert pool.used_blocks == 0 and pool.free_blocks == 4


def test_full_pool_and_overflow_are_refused():
    pool = make(n_blocks=2)
    seq = pool.new_seq(8)
    with pytest.raises(PoolFull):
        pool.new_seq(1)
    with pytest.raises(BadInput, match="holds 8 tokens"):
        KVBatch([seq], 9)
    with pytest.raises(BadInput):
        seq.truncate(1)  # nothing filled yet
