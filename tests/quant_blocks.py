"""Random GGUF blocks for the quantized-weight tests, and the gguf package's own decoding of them."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from prefill.costmodel.storage import GGUF_BLOCKS

SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}  # f16 fields


def random_blocks(qtype: str, N: int, K: int, seed: int = 0, scale: float = 0.05) -> torch.Tensor:
    """uint8 [N, row_bytes]: random quant bytes, every f16 scale a finite value of either sign whose magnitude
    lies in (scale / 25, scale)."""
    g = torch.Generator().manual_seed(seed)
    block, nbytes = GGUF_BLOCKS[qtype]
    nb = K // block
    raw = torch.randint(0, 256, (N, nb, nbytes), dtype=torch.uint8, generator=g)
    for off in SCALE_OFFSETS[qtype]:
        s = (torch.rand(N, nb, generator=g) * 0.96 + 0.04) * scale
        s = s * (torch.randint(0, 2, (N, nb), generator=g) * 2 - 1)
        raw[..., off : off + 2] = s.half().view(torch.uint8).view(N, nb, 2)
    return raw.view(N, nb * nbytes)


def gguf_dequant(blocks: torch.Tensor, qtype: str, N: int, K: int) -> torch.Tensor:
    """float32 [N, K] as the gguf package decodes the blocks (the reference every path is held to)."""
    y = dequantize(blocks.numpy(), GGMLQuantizationType[qtype])
    return torch.from_numpy(np.array(y, dtype=np.float32)).reshape(N, K)


@contextlib.contextmanager
def without_kernels(monkeypatch):
    """No compiler and no built library inside the block (the portable torch path runs); the kernels are looked
    for again at the next call after it (monkeypatch restores the rest when the test ends)."""
    from prefill.model.quant import build, ops

    monkeypatch.setenv(build.NO_COMPILER_ENV, "1")
    monkeypatch.setattr(build, "find_library", lambda: None)
    ops.forget()
    try:
        assert not ops.available()
        yield
    finally:
        ops.forget()
