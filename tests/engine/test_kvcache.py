"""The block pool: slots, reference counts, gathered per-layer views and bytes equal to the formula."""

import pytest
import torch

from prefill.costmodel.costs import kv_cache_bytes
from prefill.engine.kvcache import KVBatch, KVPool, PoolFull
from prefill.errors import BadInput


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
    pool = make(L=1, H_kv=1, d=2, n_blocks=20, bs=2)
    a, b, c = pool.new_seq(5), pool.new_seq(4), pool.new_seq(24)
    for seq, n, value in ((a, 3, 1.0), (b, 1, 5.0), (c, 22, 3.0)):
        KVBatch([seq], n).update(0, torch.full((1, 1, n, 2), value), torch.full((1, 1, n, 2), value))
        seq.length = n
    # Similar lengths (4 and 2): one padded read [B, H_kv, S_max, d_head], the mask marking each row's length.
    step = KVBatch([a, b], 1)
    assert step.positions("cpu").tolist() == [[3], [1]]
    kp, _ = step.update(0, torch.tensor([7.0, 9.0]).view(2, 1, 1, 1).expand(2, 1, 1, 2), torch.zeros(2, 1, 1, 2))
    step.advance()
    assert kp.shape == (2, 1, 4, 2) and step.mask[:, 0, 0].tolist() == [[True] * 4, [True, True, False, False]]
    assert kp[0, 0, :, 0].tolist() == [1.0, 1.0, 1.0, 7.0] and kp[1, 0, :2, 0].tolist() == [5.0, 9.0]
    assert (a.length, b.length) == (4, 2)
    # Very different lengths (3, 5 and 23: padding would be over half of the read): each row reads its own.
    step = KVBatch([b, a, c], 1)
    rows = step.update(0, torch.full((3, 1, 1, 2), 8.0), torch.zeros(3, 1, 1, 2))
    assert step.mask is None and [k.shape[2] for k, _ in rows] == [3, 5, 23]
    assert rows[0][0][0, 0, :, 0].tolist() == [5.0, 9.0, 8.0] and rows[2][0][0, 0, -2:, 0].tolist() == [3.0, 8.0]


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
