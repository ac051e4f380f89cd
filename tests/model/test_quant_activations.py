"""The 8-bit activation path (prefill.model.quant.activations, csrc/q8.h) on every kernel this CPU runs (AVX-512
VNNI, AVX2, scalar; the others skip with the reason), held to bounds from its arithmetic: the quantiser's
rounding (d_b / 2 an element) plus float32's over nb + 3 steps; the kernels' integer sums make them agree bit
for bit; the portable torch path (no compiler) quantises the same."""

from __future__ import annotations

import pytest
import torch

from prefill.errors import BadInput
from prefill.model.quant import QuantWeight, activations, ops
from prefill.model.quant.activations import dequantize_q8, q8_error_bound, quantize_q8
from quant_blocks import gguf_dequant, random_blocks, runnable, without_kernels

needs_kernels = pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")


def test_quantiser_rounds_each_element_within_half_a_step():
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(3)) * torch.logspace(-3, 3, 256)
    x[1, :32] = 0.0  # a block of zeros: scale 0, q 0
    q, d = quantize_q8(x)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127 and d.shape == (5, 8)
    assert bool((q[1, :32] == 0).all()) and float(d[1, 0]) == 0.0
    step = d.double().repeat_interleave(32, dim=1)  # [5, 256]: each element's d_b
    assert ((x.double() - dequantize_q8(q, d, torch.float64)).abs() <= step * (0.5 + 2.0**-14)).all()
    assert int(q.abs().amax(-1).min()) == 127  # every nonzero block reaches the full range
    for bad in (float("inf"), float("nan"), 1e-35):  # 1e-35: the block's largest |x|, below 2^-100
        y = x.clone()
        y[2, 32:64] = 0.0
        y[2, 40] = bad
        assert quantize_q8(y) is None


def gemm_case(qtype: str, M: int, N: int, K: int, packed: bool):
    w = QuantWeight(random_blocks(qtype, N, K, seed=M + N), qtype, N, K, activations="q8")
    w = w.pack() if packed else w
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(N)) * 3
    return w, x


SHAPES = [(N, M) for N in (8, 16, 19, 24, 50) for M in (1, 2, 5, 8, 9, 13)]  # N = 19, 50: plain rows at the end


@pytest.mark.parametrize("qtype", activations.Q8_TYPES)
@pytest.mark.parametrize("packed", [True, False])
def test_q8_gemm_within_the_quantisation_and_summation_bound(isa, qtype, packed):
    K = 96
    for N, M in SHAPES:
        w, x = gemm_case(qtype, M, N, K, packed)
        ref = gguf_dequant(random_blocks(qtype, N, K, seed=M + N), qtype, N, K).double()  # [N, K]
        t = ops.term_magnitudes(random_blocks(qtype, N, K, seed=M + N), qtype, N, K)
        got = w.matmul(x).double()
        assert ((got - x.double() @ ref.T).abs() <= q8_error_bound(x, ref, t)).all(), (isa, M, N)
        # Against the exact product with the quantised activations only float32's rounding is left: a kernel
        # whose q differed from the quantiser's by one anywhere would be off by |w| d_b, far above it.
        q, d = quantize_q8(x)
        exact_q = dequantize_q8(q, d, torch.float64) @ ref.T
        assert ((got - exact_q).abs() <= q8_error_bound(x, ref, t, quantization=False)).all(), (isa, M, N)
        # and the activations really were rounded (the float32 path is far closer to x W^T on these sizes)
        assert not torch.equal(w.matmul(x), w.with_activations("f32").matmul(x))


@needs_kernels
@pytest.mark.parametrize("qtype", activations.Q8_TYPES)
def test_every_kernel_gives_the_same_bits(qtype):
    isas = runnable()
    if len(isas) < 2:
        pytest.skip("only the scalar kernel runs on this CPU")
    K = 160
    try:
        for N, M in [*SHAPES, (24, 300)]:  # M = 300: two chunks of rows (256 + 44, csrc/q8.cpp ROW_CHUNK)
            w, x = gemm_case(qtype, M, N, K, packed=True)
            outs = {}
            for name in isas:
                ops.set_isa(name)
                outs[name] = w.matmul(x)
            outs["plain"] = QuantWeight(random_blocks(qtype, N, K, seed=M + N), qtype, N, K, activations="q8").matmul(x)
            for name, y in outs.items():
                assert torch.equal(y, outs["scalar"]), (name, M, N)
    finally:
        ops.set_isa("auto")


@needs_kernels
def test_activations_that_cannot_be_quantised_take_the_float32_path():
    w, x = gemm_case("Q4_1", 3, 24, 64, packed=True)
    x[1, 5] = float("inf")
    assert torch.equal(w.matmul(x).isnan(), w.with_activations("f32").matmul(x).isnan())
    torch.testing.assert_close(w.matmul(x), w.with_activations("f32").matmul(x), rtol=0, atol=0, equal_nan=True)


def test_portable_path_quantises_the_same(monkeypatch):
    with without_kernels(monkeypatch):
        N, K = 21, 64
        blocks = random_blocks("Q4_1", N, K)
        x = torch.randn(3, K)
        ref = gguf_dequant(blocks, "Q4_1", N, K).double()
        t = ops.term_magnitudes(blocks, "Q4_1", N, K)
        got = QuantWeight(blocks, "Q4_1", N, K, activations="q8").matmul(x).double()
        assert ((got - x.double() @ ref.T).abs() <= q8_error_bound(x, ref, t, portable=True)).all()
        q, d = quantize_q8(x)
        exact_q = dequantize_q8(q, d, torch.float64) @ ref.T
        assert ((got - exact_q).abs() <= q8_error_bound(x, ref, t, portable=True, quantization=False)).all()


def test_the_environment_variable_sets_the_default_path(monkeypatch):
    blocks = random_blocks("Q4_1", 8, 64)
    assert QuantWeight(blocks, "Q4_1", 8, 64).activations == "f32"
    monkeypatch.setenv(activations.ENV, "q8")
    w = QuantWeight(blocks, "Q4_1", 8, 64)
    assert w.activations == "q8" and w.type_id & ops.ACT_Q8
    assert not QuantWeight(random_blocks("Q6_K", 8, 256), "Q6_K", 8, 256).type_id & ops.ACT_Q8  # no q8 kernel
    monkeypatch.setenv(activations.ENV, "int3")
    with pytest.raises(BadInput, match="activation path 'int3' is not one of f32, q8"):
        QuantWeight(blocks, "Q4_1", 8, 64)


def test_q8_weights_keep_no_float32_copy():
    # From dense_min_m rows a float32-path weight multiplies over a float32 copy (MKL); the q8 kernel is faster
    # there, so a q8 weight never makes one, and its long products stay on 8-bit activations.
    w = QuantWeight(random_blocks("Q4_1", 16, 64), "Q4_1", 16, 64, dense_min_m=4, activations="q8")
    assert not w.uses_dense(8) and w.dense is None
    assert w.with_activations("f32").uses_dense(8)
