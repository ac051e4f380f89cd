"""The engine's own C++ kernels (csrc/), loaded as torch operators: torch.ops.prefill_kernels.*.

    paged_attention(q [R, H_q, D], k, v [H_kv, n_slots, D], table [R, T], first_block, first, end [R],
                    block_size, scale) -> [R, H_q, D]
    linear_f32(x [M, K], w [N, K]) -> [M, N]

Every query reads its positions [first, end) where they lie in the pool, through its block table, in blocks
visited in a fixed order (so a query's result does not depend on the other queries of the call: the
batch-invariant mode uses it for every query). Without a compiler the engine runs its portable torch path.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"


@functools.cache
def available() -> bool:
    """Whether the kernels are loaded (built on first need; a one-line note when they cannot be)."""
    try:
        from torch.utils import cpp_extension

        cpp_extension.load(name="prefill_kernels", sources=[str(CSRC / "paged_attention.cpp"),
                           str(CSRC / "linear.cpp")], extra_cflags=["-O3", "-ffp-contract=off"],
                           is_python_module=False)  # fmt: skip
        return True
    except Exception as e:  # noqa: BLE001 - no compiler, or it failed: the portable path runs
        print(f"prefill kernels: not built ({type(e).__name__}); attention runs the portable torch path",
              file=sys.stderr)  # fmt: skip
        return False


def usable(t: torch.Tensor) -> bool:
    """Do the kernels apply to this tensor (float32 on the CPU) and are they built?"""
    return t.device.type == "cpu" and t.dtype == torch.float32 and available()


def linear_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T in float32, each element summed in one fixed order (batch-invariant)."""
    return torch.ops.prefill_kernels.linear_f32(x, w, True)


def paged_attention(q, k, v, table, first_block, first, end, block_size: int, scale: float) -> torch.Tensor:
    """See the module docstring; float32 on the CPU only."""
    return torch.ops.prefill_kernels.paged_attention(q, k, v, table, first_block, first, end, block_size, scale, True)
