"""The engine's own C++ kernels (csrc/), loaded as torch operators: torch.ops.prefill_kernels.*.

    paged_attention(q [R, H_q, D], k, v [H_kv, n_slots, D], table [R, T], first_block, first, end [R],
                    block_size, scale) -> [R, H_q, D]
    linear_f32(x [M, K], w [N, K]) -> [M, N]

Every query reads its positions [first, end) where they lie in the pool, through its block table, in blocks
visited in a fixed order (so a query's result does not depend on the other queries of the call: the
batch-invariant mode uses it for every query). Built with the quantized kernels into one library
(prefill.model.quant.build); without a compiler the engine runs its portable torch path.
"""

from __future__ import annotations

import torch


def available() -> bool:
    """Whether the kernels are loaded: they are in the library prefill.model.quant.build makes (`make install`
    builds it; the engine builds it on first need, and says in one line when it cannot)."""
    from prefill.model.quant import ops

    return ops.available()


def usable(t: torch.Tensor) -> bool:
    """Do the kernels apply to this tensor (float32 on the CPU) and are they built?"""
    return t.device.type == "cpu" and t.dtype == torch.float32 and available()


def linear_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T in float32, each element summed in one fixed order (batch-invariant)."""
    return torch.ops.prefill_kernels.linear_f32(x, w, True)


def paged_attention(q, k, v, table, first_block, first, end, block_size: int, scale: float) -> torch.Tensor:
    """See the module docstring; float32 on the CPU only."""
    return torch.ops.prefill_kernels.paged_attention(q, k, v, table, first_block, first, end, block_size, scale, True)
