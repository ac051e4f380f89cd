"""K/V as q8_0 (llama.cpp's block_q8_0, as its --cache-type-k/-v q8_0 stores them): each row of d_head values in
blocks of 32 along d_head, each block a float16 scale d and 32 int8s q, 34 bytes; a value reads back as q * d.

    d = max|x| / 127 (float32, then stored as float16),  q = round_half_even(x * (1 / d)), clamped to +-127

The pool holds such rows as uint8 [..., d_head / 32 * 34]. The C++ kernels (model/csrc/paged_attention.cpp
reading, model/quant/csrc/fused.cpp writing) do the same arithmetic in the same order, so a row written or read
by either is bitwise the same. q * d is exact in float32 (8 bits times 11), so dequantizing is exact; the error
is the rounding of x * (1 / d) to an integer: at most d / 2 per value, plus d's own rounding to float16.
"""

from __future__ import annotations

import torch

from prefill.costmodel.costs import Q8_0_BLOCK

BLOCK_BYTES = 2 + Q8_0_BLOCK  # a float16 scale and 32 int8s


def row_bytes(d_head: int) -> int:
    """Bytes of one q8_0 row of d_head values."""
    if d_head % Q8_0_BLOCK:
        from prefill.errors import BadInput

        raise BadInput(f"q8_0 K/V needs d_head a multiple of {Q8_0_BLOCK}, got {d_head}")
    return d_head // Q8_0_BLOCK * BLOCK_BYTES


def quantize(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (D a multiple of 32) -> uint8 [..., D / 32 * 34]: per block its float16 d, then its 32 int8 q."""
    *lead, D = x.shape
    blocks = x.float().reshape(*lead, D // Q8_0_BLOCK, Q8_0_BLOCK)  # [..., nb, 32]
    d = blocks.abs().amax(-1, keepdim=True) / 127.0  # [..., nb, 1]
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv).clamp_(-127, 127).to(torch.int8)  # [..., nb, 32]
    scale = d.to(torch.float16).view(torch.uint8)  # [..., nb, 2]
    return torch.cat([scale, q.view(torch.uint8)], -1).reshape(*lead, D // Q8_0_BLOCK * BLOCK_BYTES)


def dequantize(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [..., R] of q8_0 rows -> [..., R / 34 * 32] in `dtype` (q * d, exact in float32)."""
    *lead, R = rows.shape
    blocks = rows.reshape(*lead, R // BLOCK_BYTES, BLOCK_BYTES)  # [..., nb, 34]
    d = blocks[..., :2].contiguous().view(torch.float16).float()  # [..., nb, 1]
    q = blocks[..., 2:].contiguous().view(torch.int8).float()  # [..., nb, 32]
    return (q * d).reshape(*lead, R // BLOCK_BYTES * Q8_0_BLOCK).to(dtype)
