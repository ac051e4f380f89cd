"""The engine's C++ kernels against their definitions: paged attention over block tables (windows, GQA, partial
blocks), and the batch-invariant GEMM (each element the same whatever the rows around it)."""

import pytest
import torch
import torch.nn.functional as F

from prefill.model import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the C++ kernels are not built (no compiler)")


def reference(q, k, v, table, first_block, first, end, bs, scale):
    out = []
    for r in range(q.shape[0]):
        pos = torch.arange(int(first[r]), int(end[r]))
        slots = table[r][pos // bs - first_block[r]] * bs + pos % bs
        K, V = k[:, slots][None], v[:, slots][None]  # [1, H_kv, S, d]
        out.append(F.scaled_dot_product_attention(q[r][None, :, None], K, V, scale=scale, enable_gqa=True)[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize("H_q,H_kv,D", [(9, 3, 64), (4, 4, 24), (8, 2, 12), (8, 4, 40), (8, 1, 128)])
def test_paged_attention_equals_attention_over_the_gathered_keys(H_q, H_kv, D):
    torch.manual_seed(0)
    bs = 16
    k, v = torch.randn(H_kv, 40 * bs, D), torch.randn(H_kv, 40 * bs, D)
    # Row 0: blocks 7, 3, 30 from position 0 to 40; row 1: a window's table (first block 5) reading 85..99;
    # row 2: one key.
    table = torch.tensor([[7, 3, 30, -1], [12, 13, 2, -1], [9, -1, -1, -1]])
    first_block, first, end = torch.tensor([0, 5, 0]), torch.tensor([0, 85, 0]), torch.tensor([41, 100, 1])
    q = torch.randn(3, H_q, D)
    ours = kernels.paged_attention(q, k, v, table, first_block, first, end, bs, D**-0.5)
    ref = reference(q, k, v, table, first_block, first, end, bs, D**-0.5)
    assert (ours - ref).abs().max() < 1e-5  # float32 sums over <= 41 keys of magnitude ~1 in another order


def test_paged_attention_is_the_same_for_a_query_alone_or_with_others():
    torch.manual_seed(1)
    k, v = torch.randn(3, 64 * 16, 64), torch.randn(3, 64 * 16, 64)
    table = torch.arange(64).view(4, 16)
    q = torch.randn(4, 9, 64)
    z, end = torch.zeros(4, dtype=torch.long), torch.tensor([256, 100, 17, 200])
    together = kernels.paged_attention(q, k, v, table, z, z, end, 16, 0.125)
    for r in range(4):
        alone = kernels.paged_attention(q[r : r + 1], k, v, table[r : r + 1], z[:1], z[:1], end[r : r + 1], 16, 0.125)
        assert torch.equal(alone[0], together[r])


def test_a_long_row_over_scattered_blocks_is_attention_over_all_its_keys():
    """A row of 1,600 keys over blocks the table scatters over the pool (the next block prefetched wherever it
    lies), read in three spans merged by log-sum-exp, with sharp softmaxes whose running maximum moves:
    attention over all the keys, and a row alone is bitwise the row in a batch."""
    torch.manual_seed(3)
    bs, n_blocks = 16, 200
    k, v = torch.randn(3, n_blocks * bs, 64), torch.randn(3, n_blocks * bs, 64)
    table = torch.randperm(n_blocks).view(2, 100)  # two rows of 100 blocks, scattered over the pool
    first_block = torch.tensor([0, 0])
    first, end = torch.tensor([0, 1000]), torch.tensor([1600, 1030])  # 1,600 keys; 30 keys from mid-table
    q = torch.randn(2, 9, 64) * 3  # sharp softmaxes
    ours = kernels.paged_attention(q, k, v, table, first_block, first, end, bs, 0.125)
    ref = reference(q, k, v, table, first_block, first, end, bs, 0.125)
    assert (ours - ref).abs().max() < 1e-5  # outputs ~1 summed over <= 1,600 keys in float32
    alone = kernels.paged_attention(q[:1], k, v, table[:1], first_block[:1], first[:1], end[:1], bs, 0.125)
    assert torch.equal(alone[0], ours[0])


@pytest.mark.parametrize("H_q,H_kv,D", [(9, 3, 64), (8, 2, 12), (8, 1, 128)])
def test_bfloat16_kv_is_read_as_its_exact_float32_widening(H_q, H_kv, D):
    """A bfloat16 pool (`prefill serve`'s dtype on AMX CPUs): each element widened to float32 as it is read (an
    exact conversion), then the float32 path's every sum in its order: bitwise the kernel on the widened pool,
    and attention over the gathered keys. Rows over scattered blocks, a window's table, one key."""
    torch.manual_seed(4)
    bs = 16
    k, v = torch.randn(H_kv, 40 * bs, D).bfloat16(), torch.randn(H_kv, 40 * bs, D).bfloat16()
    table = torch.tensor([[7, 3, 30, -1], [12, 13, 2, -1], [9, -1, -1, -1]])
    first_block, first, end = torch.tensor([0, 5, 0]), torch.tensor([0, 85, 0]), torch.tensor([41, 100, 1])
    q = torch.randn(3, H_q, D)
    ours = kernels.paged_attention(q, k, v, table, first_block, first, end, bs, D**-0.5)
    assert ours.dtype == torch.float32
    assert torch.equal(
        ours, kernels.paged_attention(q, k.float(), v.float(), table, first_block, first, end, bs, D**-0.5)
    )
    ref = reference(q, k.float(), v.float(), table, first_block, first, end, bs, D**-0.5)
    assert (ours - ref).abs().max() < 1e-5  # float32 sums over <= 41 keys of magnitude ~1 in another order


@pytest.mark.parametrize("K,N", [(576, 1728), (1536, 576), (13, 7), (64, 3)])
def test_linear_f32_is_batch_invariant_and_accurate(K, N):
    torch.manual_seed(2)
    w, x = torch.randn(N, K), torch.randn(70, K)
    full = kernels.linear_f32(x, w)
    for M in (1, 2, 3, 5, 8, 17, 33):
        assert torch.equal(kernels.linear_f32(x[:M], w), full[:M])
    assert torch.equal(kernels.linear_f32(x[9:12], w), full[9:12])  # a row's place in the batch does not matter
    exact = x.double() @ w.double().T
    bound = 2.0**-24 * K * (x.abs().double() @ w.abs().double().T)  # |error| <= K u sum |x||w| (any order)
    assert bool(((full.double() - exact).abs() <= bound).all())
    assert torch.equal(torch.ops.prefill_kernels.linear_f32(x, w, False), full)  # the scalar path, bit for bit
