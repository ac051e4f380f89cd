"""The block pool: blocks allocated as tokens arrive, contiguous runs read in place, windows given back, reference
counts, and bytes held equal to the formula."""

import pytest
import torch

from prefill.costmodel.costs import kv_cache_bytes, kv_cache_bytes_held
from prefill.costmodel.specs import ModelSpec
from prefill.engine.batch import forward_batch
from prefill.engine.blocks import BlockManager
from prefill.engine.kvcache import KVPool, PoolFull, layer_groups
from prefill.errors import BadInput


def make(L=3, H_kv=4, d=8, n_blocks=8, bs=4, dtype=torch.float32, windows=()):
    return KVPool(L, H_kv, d, n_blocks, dtype, "cpu", block_size=bs, windows=windows)


def test_pool_shape_and_bytes():
    pool = make()
    assert len(pool.k) == len(pool.v) == 3
    assert pool.k[0].shape == (4, 8 * 4, 8)  # [H_kv, n_blocks * block_size, d_head]
    assert pool.allocated_bytes() == kv_cache_bytes(3, 4, 8, 32, 4)
    assert pool.bytes_per_block(0) == kv_cache_bytes(3, 4, 8, 4, 4)


def test_blocks_are_allocated_as_tokens_arrive_and_given_back():
    pool = make()
    seq = pool.new_seq()
    assert pool.used_blocks == 0
    seq.reserve(5)  # positions 0..4: two blocks of 4
    assert len(seq.blocks) == 2 and pool.free_blocks == 6
    seq.reserve(8)  # still two
    assert len(seq.blocks) == 2
    seq.reserve(9)
    assert seq.blocks == [0, 1, 2]  # the block after the last one: one contiguous run
    seq.free()
    assert pool.free_blocks == 8


def test_block_manager_prefers_contiguous_runs():
    m = BlockManager(10)
    a = m.allocate(3)  # 0, 1, 2
    b = m.allocate(2)  # 3, 4
    assert (a, b) == ([0, 1, 2], [3, 4])
    assert m.allocate(1, after=2) == [5]  # 3 is taken: the lowest free run instead
    m.release([3, 4])
    assert m.allocate(2, after=2) == [3, 4]  # right after block 2 again
    m.release([0, 1])
    assert m.allocate(3) == [6, 7, 8]  # a run of 3 exists above; 0 and 1 are only 2
    assert m.allocate(2) == [0, 1]
    assert m.free_blocks == 1
    with pytest.raises(PoolFull):
        m.allocate(2)


@pytest.mark.parametrize("dtype,b", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_written_positions_read_back_and_bytes_equal_formula(dtype, b):
    pool = make(dtype=dtype)
    seq = pool.new_seq()
    seq.reserve(5)
    batch = forward_batch(pool, [(seq, 5)], "cpu")
    k = torch.arange(4 * 5 * 8, dtype=dtype).view(1, 4, 5, 8)  # [1, H_kv, N, d_head]
    for layer in range(3):
        batch.store(layer, k, -k)
    seq.length += 5
    assert seq.shape() == (1, 4, 5, 8)
    assert torch.equal(seq.k(2), k) and torch.equal(seq.v(0), -k)
    assert seq.nbytes() == kv_cache_bytes(3, 4, 8, 5, b) == 2 * 3 * 4 * 5 * 8 * b
    assert seq.reserved_bytes() == 2 * pool.bytes_per_block(0)


def test_rows_read_their_past_as_runs_of_slots():
    pool = make(L=1, H_kv=1, d=2, n_blocks=20, bs=2)
    a, b = pool.new_seq(), pool.new_seq()
    a.reserve(3)  # blocks 0, 1
    b.reserve(2)  # block 2
    a.length, b.length = 3, 2
    a.reserve(5)  # block 2 is b's: a continues at block 3
    assert a.blocks == [0, 1, 3] and a.runs(0, 0, 5) == [(0, 4), (6, 7)]
    b.reserve(6)  # block 3 is a's now: b's next run starts at block 4
    assert b.blocks == [2, 4, 5]
    batch = forward_batch(pool, [(a, 1), (b, 4)], "cpu")  # a decode row and a 4-token chunk
    assert batch.positions.tolist() == [3, 2, 3, 4, 5]
    ra, rb = batch.rows
    assert (ra.offset, ra.T, ra.start, ra.runs[0]) == (0, 1, 3, ((0, 4),))  # its own position 3 read back
    assert (rb.offset, rb.T, rb.start, rb.runs[0]) == (1, 4, 2, ((4, 6),))  # the past only: 0..1
    assert batch.write[0].tolist() == [3, 8, 9, 10, 11]


def test_windowed_layers_give_back_blocks_and_hold_the_formula():
    spec = ModelSpec(
        name="w",
        arch="gemma3",
        L=3,
        d_model=8,
        H_q=2,
        H_kv=1,
        d_head=4,
        d_ff=8,
        vocab_size=10,
        context_length=4096,
        tied_embeddings=True,
        rope_theta=1e4,
        norm_eps=1e-6,
        windows=(6, 6, None),
    )
    assert [g.window for g in layer_groups(spec.windows)] == [None, 6]
    pool = KVPool(3, 1, 4, 64, torch.float32, "cpu", block_size=4, windows=spec.windows)
    seq = pool.new_seq()
    for P in range(1, 60):
        seq.reserve(P)
        seq.length = P
        seq.trim()
        assert seq.nbytes() == kv_cache_bytes_held(spec, P, 4, block_size=4)
        # the window's 6 positions, read from the last block boundary or the last position, never span more
        # than 4 blocks of 4
        assert len(seq.tables[1]) <= 4
    assert len(seq.tables[0]) == 15  # the full-attention layer keeps all 59 positions
    # 54..58 visible next; a reload of the 14 whole blocks continues at 56 and sees 51..55: from block 12 on
    assert seq.first_held(1) == 48 and seq.held_positions(0) == 11


def test_refcounts_share_blocks_and_free_them_once():
    pool = make(n_blocks=4)
    a = pool.new_seq()
    a.reserve(8)  # 2 blocks
    a.length = 8
    b = pool.new_seq([a.blocks], prefix_tokens=8)  # shares a's 2 blocks
    b.reserve(12)  # and owns 1 more
    assert b.blocks[:2] == a.blocks and pool.used_blocks == 3
    assert [pool.managers[0].refs[i] for i in a.blocks] == [2, 2]
    a.free()
    assert pool.used_blocks == 3  # b still holds the shared blocks
    b.free()
    assert pool.used_blocks == 0 and pool.free_blocks == 4


def test_a_full_pool_refuses_and_allocates_nothing():
    pool = make(n_blocks=2, windows=(None, 2, 2))
    seq = pool.new_seq()
    seq.reserve(8)
    with pytest.raises(PoolFull):
        seq.reserve(9)
    assert [len(t) for t in seq.tables] == [2, 2] and pool.free_blocks == 0
    with pytest.raises(BadInput):
        seq.truncate(1)  # nothing filled yet
