"""The quantized GEMM (prefill.model.quant) against the float32 GEMM on the gguf package's own dequantization
(float64 products), for every block type with a kernel, on every instruction set this CPU runs (the `isa`
fixture of conftest.py: AVX-512, AVX2, scalar; the others skip with the reason) and the torch fallback, at
shapes that do not divide the tiles (4 x 3 register tiles, 16-row panels, 1-4 rows of the few-rows kernels)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from prefill.costmodel.storage import GGUF_BLOCKS
from prefill.model.quant import KERNEL_TYPES, QuantRows, QuantWeight, cat_rows, linear, ops
from quant_blocks import gguf_dequant, random_blocks, runnable, without_kernels


@pytest.mark.parametrize("qtype", KERNEL_TYPES)
def test_dequant_equals_gguf_bitwise(qtype):
    # q * d is exact in float32 for every type (few mantissa bits), so the decoding has one rounding at most,
    # the same as the gguf package's: the weights are bitwise equal, on every path.
    block = GGUF_BLOCKS[qtype][0]
    N, K = 37, 3 * block
    blocks = random_blocks(qtype, N, K)
    ref = gguf_dequant(blocks, qtype, N, K)
    assert torch.equal(ops.dequant_portable(blocks, qtype, N, K), ref)
    try:
        for name in runnable():
            ops.set_isa(name)
            assert torch.equal(ops.dequant(blocks, qtype, N, K), ref), name
    finally:
        if ops.available():
            ops.set_isa("auto")


@pytest.mark.parametrize("qtype", KERNEL_TYPES)
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 13])
def test_gemm_within_float32_summation_bound(qtype, M, isa):
    block = GGUF_BLOCKS[qtype][0]
    for N, K in ((1, block), (50, 3 * block), (19, 2 * block)):  # N = 50: three 16-row panels and 2 left over
        blocks = random_blocks(qtype, N, K, seed=M)
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(N))
        w = gguf_dequant(blocks, qtype, N, K)
        exact = F.linear(x.double(), w.double())  # float64: exact to ~1e-16 relative, far below the bound
        bound = ops.error_bound(x, ops.term_magnitudes(blocks, qtype, N, K), isa)
        got = ops.gemm(x, blocks, qtype, N, K)
        assert got.shape == (M, N) and got.dtype == torch.float32
        assert ((got.double() - exact).abs() <= bound).all(), (qtype, isa, M, N, K)


needs_kernels = pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")


@needs_kernels
@pytest.mark.parametrize("qtype", KERNEL_TYPES)
def test_every_instruction_set_agrees_with_the_others(qtype):
    # Each kernel is within its own bound of x W^T (above), so any two are within the sum of their bounds: here
    # on one weight and activations spread over four decades (a hidden state's outliers), the few-rows kernels
    # (M = 1, 4) and the panel (M = 6), every pair of instruction sets this CPU runs.
    isas = runnable()
    if len(isas) < 2:
        pytest.skip("only the scalar kernel runs on this CPU")
    block = GGUF_BLOCKS[qtype][0]
    N, K = 40, 4 * block
    blocks = random_blocks(qtype, N, K, seed=5)
    terms = ops.term_magnitudes(blocks, qtype, N, K)
    try:
        for M in (1, 4, 6):
            x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * torch.logspace(-2, 2, K)
            outs = {}
            for name in isas:
                ops.set_isa(name)
                outs[name] = (ops.gemm(x, blocks, qtype, N, K).double(), ops.error_bound(x, terms, name))
            for a, b in itertools.combinations(isas, 2):
                assert ((outs[a][0] - outs[b][0]).abs() <= outs[a][1] + outs[b][1]).all(), (a, b, M)
    finally:
        ops.set_isa("auto")


@needs_kernels
@pytest.mark.parametrize("qtype", ops.PACKABLE)
@pytest.mark.parametrize("M", [1, 2, 3, 4, 7, 13])
def test_x8_layout_within_the_same_bound(qtype, M, isa):
    # The x8 layout (every 8 rows interleaved) moves bytes only: the same weights, the same bound (its M >= 2
    # kernel sums K in one lane, so D = K + 48). N = 1: no whole group; 19: 2 groups and 3 plain rows left;
    # 16: one pair of groups (the 16-wide tile); 50: 6 groups, 2 left. M = 2-4: the integer kernel of few rows;
    # 7 and 13: the float tile (13 = 5 + 4 + 4).
    K = 3 * 32
    for N in (1, 16, 19, 50):
        w = QuantWeight(random_blocks(qtype, N, K, seed=M), qtype, N, K)
        packed = w.pack()
        assert packed.packed and packed.blocks.shape == w.blocks.shape and packed.blocks.sum() == w.blocks.sum()
        ref = gguf_dequant(w.blocks, qtype, N, K)
        assert torch.equal(packed.dequantize(), ref)
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(N))
        exact = F.linear(x.double(), ref.double())
        bound = ops.error_bound(x, ops.term_magnitudes(w.blocks, qtype, N, K), isa, packed=True)
        got = packed.matmul(x)
        assert ((got.double() - exact).abs() <= bound).all(), (qtype, isa, M, N)


@needs_kernels
@pytest.mark.parametrize("packed", [False, True])
def test_non_finite_activations_propagate_as_in_float32(packed):
    # The kernels of M <= 4 rows split x into integer limbs; an inf or NaN cannot be split, so the product takes
    # the float path, and the outputs are inf / NaN exactly where F.linear's are.
    N, K = 19, 64
    w = QuantWeight(random_blocks("Q4_1", N, K), "Q4_1", N, K)
    w = w.pack() if packed else w
    for bad, M in ((float("inf"), 1), (float("nan"), 1), (float("inf"), 3)):  # 3: the few-rows kernel's rows
        x = torch.randn(M, K)
        x[M // 2, 5] = bad
        got, ref = w.matmul(x), F.linear(x, w.dequantize())
        assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.isinf(), ref.isinf())


@needs_kernels
def test_x8_rows_and_refusals():
    # An embedding lookup on packed blocks decodes the groups that hold the rows (and the plain rows after them).
    N, K = 21, 64
    w = QuantWeight(random_blocks("Q8_0", N, K), "Q8_0", N, K)
    packed = w.pack()
    index = torch.tensor([0, 20, 7, 8, 15, 16, 19, 7])
    assert torch.equal(packed.rows(index), w.dequantize()[index])
    assert packed.pack() is packed and w.pack() is not w
    k_quant = QuantWeight(random_blocks("Q4_K", 8, 256), "Q4_K", 8, 256)
    assert k_quant.pack() is k_quant  # no x8 kernel: stays plain
    with pytest.raises(ValueError, match="plain"):
        packed.permute_rows(torch.arange(N))
    with pytest.raises(ValueError, match="plain"):
        QuantWeight.cat([packed, packed])


def test_x8_layout_can_be_turned_off(monkeypatch):
    from prefill.model.quant import weight

    monkeypatch.setenv(weight.X8_ENV, "0")
    w = QuantWeight(random_blocks("Q4_1", 16, 64), "Q4_1", 16, 64)
    assert w.pack() is w


def test_portable_path_when_no_library(monkeypatch):
    # No compiler and no built library: the same product through torch ops, with the one-line note.
    with without_kernels(monkeypatch):
        N, K = 21, 64
        blocks = random_blocks("Q4_1", N, K)
        x = torch.randn(3, K)
        exact = F.linear(x.double(), gguf_dequant(blocks, "Q4_1", N, K).double())
        got = ops.gemm(x, blocks, "Q4_1", N, K)
        assert (
            (got.double() - exact).abs() <= ops.error_bound(x, ops.term_magnitudes(blocks, "Q4_1", N, K), "scalar")
        ).all()
        w = QuantWeight(blocks, "Q4_1", N, K)
        assert w.pack() is w  # no kernels, no x8 layout: the portable path reads plain blocks


def test_install_step_without_compiler_says_so_and_succeeds(monkeypatch, capsys):
    from prefill.model.quant import build

    monkeypatch.setenv(build.NO_COMPILER_ENV, "1")
    monkeypatch.setattr(build, "find_library", lambda: None)
    assert build.compiler() is None
    assert build.main() == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "quantized kernels: no C++ compiler, not built; native GGUF weights will run the slower portable path"
    ]


@pytest.mark.slow
def test_build_from_scratch(monkeypatch, tmp_path):
    # The install step's compile and link, into an empty folder: a library whose name carries the sources' digest.
    # One source (the smallest) keeps it to one compile; `make install` builds them all, and every kernel test
    # here runs that build's library.
    from prefill.model.quant import build

    if build.compiler() is None:
        pytest.skip("no C++ compiler here")
    monkeypatch.setattr(build, "_folders", lambda: [tmp_path])
    monkeypatch.setattr(build, "SOURCES", (min(build.SOURCES, key=lambda f: f.stat().st_size),))
    path = build.build()
    assert path.parent == tmp_path and path.name == build.library_name() and path.stat().st_size > 0
    assert build.find_library() == path


def test_fused_rows_and_permuted_rows_stay_blocks():
    # Concatenating and permuting rows of blocks equals doing it to the decoded weights (blocks run along K).
    K = 64
    a = QuantWeight(random_blocks("Q4_1", 10, K, 1), "Q4_1", 10, K)
    b = QuantWeight(random_blocks("Q4_1", 6, K, 2), "Q4_1", 6, K)
    fused = cat_rows([a, b])
    assert isinstance(fused, QuantWeight) and fused.shape == (16, K)
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(fused.permute_rows(order).dequantize(), fused.dequantize()[order])
    mixed = cat_rows([a, QuantWeight(random_blocks("Q8_0", 6, K, 3), "Q8_0", 6, K)])  # Q4_K_M-style mixed types
    assert isinstance(mixed, QuantRows) and mixed.shape == (16, K)  # blocks still, part by part
    with_dense = cat_rows([a, torch.zeros(6, K)])  # a dense part: one float32 matrix
    assert isinstance(with_dense, torch.Tensor) and torch.equal(with_dense[:10], a.dequantize())


def test_linear_on_quant_weight_keeps_leading_dims_and_bias():
    K, N = 64, 12
    w = QuantWeight(random_blocks("Q8_0", N, K), "Q8_0", N, K)
    x = torch.randn(2, 3, K)
    bias = torch.randn(N)
    y = linear(x, w, bias)
    assert y.shape == (2, 3, N) and w.device == x.device and w.dtype == y.dtype == torch.float32
    ref = F.linear(x.double(), w.dequantize().double(), bias.double())
    bound = ops.error_bound(x.reshape(-1, K), w.dequantize().abs(), "scalar").reshape(2, 3, N)
    assert ((y.double() - ref).abs() <= bound + 1e-6 * bias.abs().double()).all()


def test_bad_blocks_are_refused():
    from prefill.errors import ModelFileError

    with pytest.raises(ModelFileError, match="do not hold"):
        QuantWeight(torch.zeros(4, 10, dtype=torch.uint8), "Q4_1", 4, 64)
    with pytest.raises(ModelFileError, match="no quantized kernel"):
        QuantWeight(torch.zeros(4, 176, dtype=torch.uint8), "Q5_K", 4, 256)  # dequantized at load instead


def test_long_prompts_use_a_float32_copy_made_on_first_need(monkeypatch):
    from prefill.model.quant import weight

    K, N = 64, 12
    w = QuantWeight(random_blocks("Q4_1", N, K), "Q4_1", N, K, dense_min_m=4)
    short, long = torch.randn(3, K), torch.randn(5, K)
    linear(short, w)
    assert w.dense is None  # below dense_min_m: the kernels read the blocks
    y = linear(long, w)
    assert w.dense is not None and torch.equal(w.dense, w.dequantize())
    assert torch.equal(y, F.linear(long, w.dense))
    tight = QuantWeight(w.blocks, "Q4_1", N, K, dense_min_m=4)
    monkeypatch.setattr(weight, "DENSE_MEMORY_SHARE", 0.0)  # no memory to spare: the copy is never made
    linear(long, tight)
    assert tight.dense is None


@pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")
def test_operators_pass_torch_opcheck():
    # Schema, fake (meta) implementations for torch.compile, no autograd surprises, for every operator.
    D, H_q, H_kv, d, F_ = 64, 4, 2, 16, 96
    x, norm = torch.randn(2, 3, D), torch.ones(D)
    cos, sin = torch.randn(2, 3, 1, d), torch.randn(2, 3, 1, d)
    w_qkv, w_o = random_blocks("Q8_0", (H_q + 2 * H_kv) * d, D), random_blocks("Q4_1", D, H_q * d)
    w_gu, w_d = random_blocks("Q4_1", 2 * F_, D), random_blocks("Q4_0", D, F_)
    qk, v = random_blocks("Q5_0", (H_q + H_kv) * d, D), random_blocks("Q8_0", H_kv * d, D)  # Q/K/V of two types
    o, dn = torch.randn(6, H_q * d), torch.ones(d)
    qo = torch.ops.prefill_quant
    for op, args in (
        (qo.pre_attention.default, (x, norm, 1e-5, [w_qkv], [8], None, cos, sin, H_q, H_kv, None, None)),
        (qo.pre_attention.default, (x, norm, 1e-5, [qk, v], [6, 8], None, cos, sin, H_q, H_kv, dn, dn)),
        (qo.post_attention.default, (x.view(6, D), o, w_o, 3, norm, 1e-5, w_gu, 3, w_d, 2, None, None, False)),
        (qo.post_attention.default, (x.view(6, D), o, w_o, 3, norm, 1e-5, w_gu, 3, w_d, 2, norm, norm, True)),
        (qo.gemm.default, (torch.randn(5, D), w_gu, 3, 2 * F_, D)),
        (qo.dequant.default, (w_d, 2, D, F_)),
        (qo.pack.default, (w_gu, 3, 2 * F_, D)),
        (qo.gemm.default, (torch.randn(1, D), ops.pack(w_gu, "Q4_1", 2 * F_, D), 3 | ops.PACKED, 2 * F_, D)),
    ):
        torch.library.opcheck(op, args)


def test_cat_rows_keeps_q_k_v_of_two_types_as_blocks_part_by_part():
    """A Q4_K_M file's Q, K (Q5_0) and V (Q8_0) stay blocks, part by part (QuantRows), not one float32 matrix:
    its bytes are the parts', its product each part's in its columns (within the kernels' bound of the float64
    product on the gguf package's decoding), and an activation path set on it reaches every part."""
    shapes = (("Q5_0", 64), ("Q5_0", 32), ("Q8_0", 32))
    parts = [QuantWeight(random_blocks(t, N, 96, seed), t, N, 96) for seed, (t, N) in enumerate(shapes)]
    w = cat_rows(parts)
    assert isinstance(w, QuantRows) and w.shape == (128, 96) and w.nbytes == sum(p.nbytes for p in parts)
    assert [(p.qtype, p.N) for p in w.parts] == [("Q5_0", 96), ("Q8_0", 32)]  # Q and K one matrix
    ref_w = torch.cat([gguf_dequant(p.blocks, p.qtype, p.N, p.K) for p in parts])  # [128, 96]
    assert torch.equal(w.dequantize(), ref_w)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(4))
    got = linear(x, w)  # [3, 128]
    magnitudes = torch.cat([ops.term_magnitudes(p.blocks, p.qtype, p.N, p.K) for p in parts])
    bound = ops.error_bound(x, magnitudes, ops.isa() if ops.available() else "scalar")
    assert ((got.double() - x.double() @ ref_w.double().T).abs() <= bound).all()
    w.activations = "q8"
    assert [p.activations for p in w.parts] == ["q8"] * 2
