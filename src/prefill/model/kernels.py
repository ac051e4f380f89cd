"""The engine's own C++ kernels (csrc/), loaded as torch operators: torch.ops.prefill_kernels.*.

    paged_attention(q [R, H_q, D], k, v [H_kv, n_slots, D or q8_0 bytes], table [R, T], first_block, first, end [R],
                    block_size, scale) -> [R, H_q, D]
    linear_f32(x [M, K], w [N, K]) -> [M, N]

and which GEMM a projection of a few rows runs (few_rows_linear: linear_f32 or prefill.model.quant.linear).

Every query reads its positions [first, end) where they lie in the pool, through its block table, in blocks
visited in a fixed order (so a query's result does not depend on the other queries of the call: the
batch-invariant mode uses it for every query). Built with the quantized kernels into one library
(prefill.model.quant.build); without a compiler the engine runs its portable torch path.
"""

from __future__ import annotations

import functools

import torch

from prefill.model.quant import linear


def available() -> bool:
    """Whether the kernels are loaded: they are in the library prefill.model.quant.build makes (`make install`
    builds it; the engine builds it on first need, and says in one line when it cannot)."""
    from prefill.model.quant import ops

    return ops.available()


def usable(t: torch.Tensor) -> bool:
    """Do the kernels apply to this tensor (float32 on the CPU) and are they built?"""
    return t.device.type == "cpu" and t.dtype == torch.float32 and available()


def paged_usable(t: torch.Tensor) -> bool:
    """Does the paged attention kernel read this pool (float32, bfloat16 or float16 K/V, or q8_0 rows as uint8, on
    the CPU), and is it built?"""
    kinds = (torch.float32, torch.bfloat16, torch.float16, torch.uint8)
    return t.device.type == "cpu" and t.dtype in kinds and available()


def linear_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T in float32, each element summed in one fixed order (batch-invariant)."""
    return torch.ops.prefill_kernels.linear_f32(x, w, True)


def paged_attention(q, k, v, table, first_block, first, end, block_size: int, scale: float) -> torch.Tensor:
    """See the module docstring: q float32, k and v float32, bfloat16 or float16, or q8_0 rows (uint8
    [H_kv, n_slots, D / 32 * 34], prefill.model.kv_quant), read as float32, on the CPU."""
    return torch.ops.prefill_kernels.paged_attention(q, k, v, table, first_block, first, end, block_size, scale, True)


# Up to this many rows linear_f32 beats MKL, by the CPU's kind (SmolLM2, float32, 2 threads). Zen 4 (AVX-512,
# where MKL runs its AVX-512 kernels): 1.8x at 1 row, 3x at 2; at 33-128 rows it won for wide N and lost for
# K = 1,536. Zen 3 (AVX2), warm prefills of P = 48 / 64 / 96 / 128 tokens: MKL 307 / 342 / 384 / 422 ms,
# linear_f32 193 / 227 / 285 / 352 ms; even at 192.
FEW_ROWS = {"AVX2": 128}
FEW_ROWS_ELSEWHERE = 32


@functools.cache
def few_rows() -> int:
    """The most rows a float32 projection runs through linear_f32 on this CPU (FEW_ROWS)."""
    from prefill.device.capability import capability

    return FEW_ROWS.get(capability("cpu").kind, FEW_ROWS_ELSEWHERE)


def few_rows_linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """prefill.model.quant.linear (F.linear, or GGUF blocks' own kernel), through linear_f32 for 1..few_rows()
    rows of dense float32 on the CPU: the weights stream from memory once for all rows. MKL's GEMV reads them at
    10 GB/s on a Zen 4 where linear_f32 reads 18-22; its small-M GEMM runs at a third of its large-M rate."""
    rows = x.numel() // x.shape[-1]
    if 1 <= rows <= few_rows() and isinstance(w, torch.Tensor) and w.dtype == torch.float32 and usable(x):
        return invariant_linear(x, w, b)
    return linear(x, w, b)


def invariant_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear with every element summed in one fixed order: x [..., K] @ w [N, K]^T (+ b)."""
    y = linear_f32(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[0])
    return y if b is None else y + b
