"""K/V stored at fewer bytes (16-bit pools): the paged kernel reads a float16 or bfloat16 pool as its exact
float32 widening on both its paths (AVX2 + F16C, and the scalar one), and attention over rounded K/V stays
within the bound the rounding sets: each K and V element is off by at most u of itself (u = 2^-8 for
bfloat16, 2^-11 for float16), so a score moves by at most eps = u * scale * max_t sum_i |q_i k_ti|, each softmax
weight by a factor within e^(+-2 eps), and the output by (e^(2 eps) - 1) max|V| + u max|V|."""

import math

import pytest
import torch

from prefill.engine.batch import forward_batch
from prefill.engine.kvcache import KVPool
from prefill.model import attention, kernels, kv_quant

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the C++ kernels are not built (no compiler)")
ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}  # relative error of one rounding, bounded
TABLE = torch.tensor([[7, 3, 30, -1], [12, 13, 2, -1], [9, -1, -1, -1]])  # scattered blocks, a window's, one key
FIRST_BLOCK, FIRST, END = torch.tensor([0, 5, 0]), torch.tensor([0, 85, 0]), torch.tensor([41, 100, 1])


def paged(q, k, v, simd: bool, scale: float):
    return torch.ops.prefill_kernels.paged_attention(q, k, v, TABLE, FIRST_BLOCK, FIRST, END, 16, scale, simd)


def bound(q, k32, v32, u: float, scale: float) -> float:
    """The output error rounding K and V by at most u relative can cause (module docstring); q [..., D],
    k32, v32 [..., S, D] (a loose eps: each |q_i| its largest over the queries)."""
    q_max = q.abs().reshape(-1, q.shape[-1]).amax(0)  # [D]
    eps = u * scale * float((q_max * k32.abs()).sum(-1).max())
    return (math.expm1(2 * eps) + u) * float(v32.abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("H_q,H_kv,D", [(9, 3, 64), (8, 1, 128), (8, 2, 12)])
def test_a_16bit_pool_is_read_as_its_exact_widening_within_the_rounding_bound(dtype, simd, H_q, H_kv, D):
    torch.manual_seed(6)
    k32, v32 = torch.randn(H_kv, 40 * 16, D), torch.randn(H_kv, 40 * 16, D)
    k, v = k32.to(dtype), v32.to(dtype)
    q, scale = torch.randn(3, H_q, D), D**-0.5
    ours = paged(q, k, v, simd, scale)
    assert ours.dtype == torch.float32
    assert torch.equal(ours, paged(q, k.float(), v.float(), simd, scale))  # the widening is exact
    err = float((ours - paged(q, k32, v32, simd, scale)).abs().max())
    assert err <= bound(q, k32, v32, ROUNDING[dtype], scale)
    assert err > 0  # the rounding is real: the bound is not met by reading float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("paged_kernel", [True, False])
def test_attention_over_a_16bit_pool_reads_the_kv_as_stored(dtype, paged_kernel, monkeypatch):
    """A float32 model over a 16-bit pool: a prompt, then decode rows (paged kernel, or the torch path without
    it). Every query reads K/V rounded once, fresh or from the pool: the output is attention over the rounded
    K/V (float32 sums, 1e-5), within the rounding bound of attention over float32 K/V."""
    if not paged_kernel:
        monkeypatch.setattr(kernels, "paged_usable", lambda t: False)
    torch.manual_seed(7)
    H_q, H_kv, D, P = 6, 2, 64, 37
    pool = KVPool(1, H_kv, D, 8, dtype, "cpu")
    seq = pool.new_seq()
    q, k, v = torch.randn(1, H_q, P + 1, D), torch.randn(1, H_kv, P + 1, D), torch.randn(1, H_kv, P + 1, D)
    outs = []
    for s, e in ((0, P), (P, P + 1)):  # the prompt, then one decode step
        seq.reserve(e)
        batch = forward_batch(pool, [(seq, e - s)], "cpu")
        outs.append(attention.attend(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], batch, 0, None, D**-0.5))
        seq.length = e
    out = torch.cat(outs, 2)  # [1, H_q, P + 1, D]
    kr, vr = k.to(dtype).float(), v.to(dtype).float()
    ref = attention.sdpa_causal(q, kr, vr, 0, None, D**-0.5)
    assert float((out - ref).abs().max()) < 1e-5
    exact = attention.sdpa_causal(q, k, v, 0, None, D**-0.5)
    scale = D**-0.5
    assert float((out - exact).abs().max()) <= bound(q, k, v, ROUNDING[dtype], scale)


# ---- q8_0 rows ----


def test_q8_0_rows_are_llama_cpps_block_q8_0_within_half_a_step():
    """quantize writes llama.cpp's block_q8_0 (the gguf package reads it back as we do), and each value comes
    back within d / 2 of itself (the rounding to an integer step), plus 127 times d's own float16 rounding."""
    from gguf import GGMLQuantizationType, quants

    torch.manual_seed(8)
    x = torch.randn(5, 3, 128) * torch.rand(5, 3, 1) * 4  # rows of different scales
    x[0, 0, :32] = 0  # an all-zero block: d = 0, q = 0
    rows = kv_quant.quantize(x)
    assert rows.dtype == torch.uint8 and rows.shape == (5, 3, 128 // 32 * 34)
    back = kv_quant.dequantize(rows)
    theirs = quants.dequantize(rows.numpy(), GGMLQuantizationType.Q8_0)
    assert torch.equal(back, torch.from_numpy(theirs).float())
    d = x.view(5, 3, 4, 32).abs().amax(-1, keepdim=True) / 127  # [5, 3, 4, 1]
    err = (back - x).view(5, 3, 4, 32).abs()
    assert bool((err <= d * (0.5 + 128 * 2.0**-11)).all())
    assert float(back[0, 0, :32].abs().max()) == 0


@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("H_q,H_kv,D", [(9, 3, 64), (8, 1, 128), (4, 4, 32)])
def test_a_q8_0_pool_is_read_as_its_exact_dequantization(simd, H_q, H_kv, D):
    """The kernel dequantizes each block of keys as it reads it (q * d, exact in float32): bitwise the same path
    on the dequantized float32 pool, and within the bound of q8_0's error (u = 2^-7 of a block's largest |x|,
    at most 2x a value's own for the values that set the scores' error)."""
    torch.manual_seed(9)
    k32, v32 = torch.randn(H_kv, 40 * 16, D), torch.randn(H_kv, 40 * 16, D)
    k, v = kv_quant.quantize(k32), kv_quant.quantize(v32)
    q, scale = torch.randn(3, H_q, D), D**-0.5
    ours = paged(q, k, v, simd, scale)
    assert torch.equal(ours, paged(q, kv_quant.dequantize(k), kv_quant.dequantize(v), simd, scale))
    err = float((ours - paged(q, k32, v32, simd, scale)).abs().max())
    assert 0 < err <= bound(q, k32.abs().amax(-1, keepdim=True).expand_as(k32), v32, 2.0**-7, scale)


@pytest.mark.parametrize("paged_kernel", [True, False])
def test_attention_over_a_q8_0_pool_reads_the_kv_as_stored(paged_kernel, monkeypatch):
    """As for 16-bit pools: a prompt, then a decode step, over a q8_0 pool is attention over the dequantized
    K/V (float32 sums, 1e-5), on the paged kernel and on the torch path."""
    if not paged_kernel:
        monkeypatch.setattr(kernels, "paged_usable", lambda t: False)
    torch.manual_seed(10)
    H_q, H_kv, D, P = 6, 2, 64, 37
    pool = KVPool(1, H_kv, D, 8, torch.uint8, "cpu")
    assert pool.k[0].shape == (H_kv, 8 * 16, 68) and pool.bytes_per_token == 2 * H_kv * 68
    seq = pool.new_seq()
    q, k, v = torch.randn(1, H_q, P + 1, D), torch.randn(1, H_kv, P + 1, D), torch.randn(1, H_kv, P + 1, D)
    outs = []
    for s, e in ((0, P), (P, P + 1)):
        seq.reserve(e)
        batch = forward_batch(pool, [(seq, e - s)], "cpu")
        outs.append(attention.attend(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], batch, 0, None, D**-0.5))
        seq.length = e
    kr, vr = kv_quant.dequantize(kv_quant.quantize(k)), kv_quant.dequantize(kv_quant.quantize(v))
    ref = attention.sdpa_causal(q, kr, vr, 0, None, D**-0.5)
    assert float((torch.cat(outs, 2) - ref).abs().max()) < 1e-5


def test_measured_kv_bytes_equal_the_formula_for_every_kv_dtype(smollm):
    """`prefill verify`'s proof for each K/V dtype: the cache's bytes, read off the pool's tensors, equal
    2 * L * H_kv * P * d_head * b with b = 4, 2, 2, 34 / 32."""
    from prefill.costmodel.costs import KV_DTYPES
    from prefill.engine.proofs import kv_bytes_match_formula

    for kv in KV_DTYPES:
        check = kv_bytes_match_formula(smollm, 40, kv)
        assert check.ok and check.measured == 0, (kv, check.detail)
    assert kv_bytes_match_formula(smollm, 40, "q8_0").detail.startswith(f"{2 * 30 * 3 * 40 * 68:,} vs")
