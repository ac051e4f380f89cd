"""Random GGUF blocks for the quantized-weight tests, and the gguf package's own decoding of them."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from prefill.costmodel.storage import GGUF_BLOCKS

# The f16 fields of each type's block (every type the loader meets: the kernels' and those decoded at load).
SCALE_OFFSETS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
ISAS = ("avx512", "avx2", "scalar")  # the kernels' instruction sets, best first
MISSING = {"avx512": "AVX-512 F/BW/VL/VNNI not on this CPU", "avx2": "AVX2 + FMA + F16C not on this CPU"}


def runnable() -> list[str]:
    """The kernels' instruction sets this CPU runs, best first ([] where the kernels are not built)."""
    from prefill.model.quant import ops

    if not ops.available():
        return []
    best = ops.set_isa("auto")
    return list(ISAS[ISAS.index(best) :])


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
