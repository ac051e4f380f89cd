"""A weight kept as the GGUF file stores it, and the one `linear` every projection and the unembedding call.

QuantWeight holds a matrix [N, K] as its raw blocks, uint8 [N, row_bytes]: blocks run along K, so rows are
whole byte ranges, and fusing Q/K/V or gate/up (concatenating rows) or undoing llama.cpp's Q/K row order
(permuting rows) never decodes a weight. A plain object rather than a tensor subclass: torch.compile traces
through its attributes, and the custom operator (prefill.model.quant.ops) does the arithmetic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from prefill.costmodel.storage import GGUF_BLOCKS
from prefill.errors import ModelFileError
from prefill.model.quant import activations, ops

KERNEL_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K")  # the block types csrc/ multiplies
# From this many rows of x a float32 copy of the weight, made on first need and kept beside the blocks, beats
# the kernels (MKL's blocking wins once the product is compute-bound): measured on the embedded model, 1 thread,
# CPU time of a whole prefill: panel kernel 0.52 s vs float32 0.66 s at P = 128, 2.18 vs 2.14 s at 512, 3.63 vs
# 3.00 s at 1,024 (benchmarks/quant_gemm.py shows it per shape). The server's 256-token chunks never reach it.
DENSE_MIN_M = 1024
DENSE_MEMORY_SHARE = 0.25  # a float32 copy is made only while it takes at most this share of the free memory
X8_ENV = "PREFILL_X8"  # "0": keep the plain layout (benchmarks compare the two layouts this way)


@dataclass(eq=False)
class QuantWeight:
    """A [N, K] weight as GGUF blocks of `qtype`. From M >= dense_min_m rows (0: never) the product runs as a
    float32 GEMM over `dense`, a float32 copy made on first need and kept beside the blocks, when memory allows
    (DENSE_MEMORY_SHARE of the free memory); else, and below that M, the kernels read the blocks."""

    blocks: torch.Tensor  # uint8 [N, K / block * bytes per block]
    qtype: str
    N: int
    K: int
    dense_min_m: int = DENSE_MIN_M
    dense: torch.Tensor | None = None  # float32 [N, K] once a long prompt made it, else None
    packed: bool = False  # the blocks in the x8 layout (every 8 rows interleaved, csrc/packed.h)
    activations: str = field(default_factory=activations.default_activations)  # f32 | q8 (activations.py)

    def __post_init__(self) -> None:
        activations.check(self.activations)
        if self.qtype not in KERNEL_TYPES:
            raise ModelFileError(
                f"GGUF type {self.qtype} has no quantized kernel here (have {', '.join(KERNEL_TYPES)})"
            )
        block, nbytes = GGUF_BLOCKS[self.qtype]
        if self.K % block or tuple(self.blocks.shape) != (self.N, self.K // block * nbytes):
            raise ModelFileError(
                f"{self.qtype} blocks {tuple(self.blocks.shape)} do not hold a [{self.N}, {self.K}] weight"
            )
        ops.available()  # load (or build) the kernels now, not inside a compiled graph

    @property
    def shape(self) -> tuple[int, int]:
        return (self.N, self.K)

    @property
    def device(self) -> torch.device:
        """Where the blocks live (as a dense weight's .device says where it lives)."""
        return self.blocks.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype its products come out in: float32 (the blocks themselves are uint8)."""
        return torch.float32

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: the blocks (the dense copy, when kept, serves long prompts only)."""
        return self.blocks.numel()

    @property
    def type_id(self) -> int:
        """The operators' type argument (the GGUF type number, with the packed bit)."""
        return ops.type_id(self.qtype, self.packed, self.activations)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [N, K], decoded as the gguf package does."""
        return ops.dequant(self.blocks, self.qtype, self.N, self.K, self.packed)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Float32 rows [len(index), K] (an embedding lookup decodes only the rows it reads; packed: the
        8-row groups that hold them)."""
        if not self.packed:
            picked = self.blocks.index_select(0, index)  # [T, row_bytes]
            return ops.dequant(picked, self.qtype, picked.shape[0], self.K)
        full = self.N // 8 * 8  # rows in whole groups; the N % 8 last rows are plain
        out = torch.empty(index.shape[0], self.K)  # [T, K]
        inside = index < full
        if inside.any():
            idx = index[inside]
            g, which = torch.unique(idx // 8, return_inverse=True)  # each group decoded once
            groups = self.blocks[:full].view(full // 8, -1).index_select(0, g)  # [G, 8 row_bytes]
            y = ops.dequant(groups.view(-1, self.blocks.shape[1]), self.qtype, 8 * g.shape[0], self.K, True)
            out[inside] = y.view(-1, 8, self.K)[which, idx % 8]  # [G, 8, K] -> the asked rows
        if not inside.all():
            tail = self.blocks.index_select(0, index[~inside])
            out[~inside] = ops.dequant(tail, self.qtype, tail.shape[0], self.K)
        return out

    def pack(self) -> QuantWeight:
        """This weight in the x8 layout, where the kernels read eight rows at a time (the same bytes, moved),
        or itself when already packed, its type has no x8 kernel or the kernels are not built."""
        if self.packed or self.qtype not in ops.PACKABLE or not ops.available() or os.environ.get(X8_ENV) == "0":
            return self
        blocks = ops.pack(self.blocks, self.qtype, self.N, self.K)
        return replace(self, blocks=blocks, packed=True, dense=None)

    def uses_dense(self, M: int) -> bool:
        """True when a product of M rows runs over the float32 copy (making it now if it is missing). Never on
        the q8 path: on gate_up (3,072 x 576) its kernel ran 122-183 GMAC/s at M = 256 to 2,048, MKL on the copy
        45 at M = 1,024 (thread CPU time, 1 thread, Zen 5)."""
        if not 0 < self.dense_min_m <= M or activations.runs_q8(self.activations, self.qtype):
            return False
        if self.dense is None:
            import psutil

            if DENSE_MEMORY_SHARE * psutil.virtual_memory().available < 4 * self.N * self.K:
                return False
            self.dense = self.dequantize()
        return True

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] float32 -> x @ W^T [..., N] float32 (activations on self.activations' path; over the
        float32 copy, float32)."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.K)  # [M, K]
        if self.uses_dense(x2.shape[0]):
            return F.linear(x, self.dense)
        y = ops.gemm(x2, self.blocks, self.qtype, self.N, self.K, self.packed, self.activations)  # [M, N]
        return y.view(*lead, self.N)

    def with_activations(self, path: str) -> QuantWeight:
        """The same blocks (shared, not copied) with their products on activation path `path` (f32 | q8)."""
        return replace(self, activations=activations.check(path))

    def permute_rows(self, order: torch.Tensor) -> QuantWeight:
        """The same weight with its rows in `order` (a permutation of range(N)); plain blocks only."""
        if self.packed:
            raise ValueError("permute_rows needs plain blocks: permute before pack()")
        return replace(self, blocks=self.blocks.index_select(0, order).contiguous(), dense=None)

    @staticmethod
    def cat(parts: list[QuantWeight]) -> QuantWeight:
        """The row concatenation of weights of one type and width (fused Q/K/V, fused gate/up)."""
        if len({(p.qtype, p.K) for p in parts}) != 1 or any(p.packed for p in parts):
            raise ValueError("QuantWeight.cat needs plain parts of one type and one K")
        return replace(parts[0], blocks=torch.cat([p.blocks for p in parts]), N=sum(p.N for p in parts), dense=None)


@dataclass(eq=False)
class QuantRows:
    """Weights of different GGUF types stacked by rows into one [N, K] (a Q4_K_M file's Q/K/V: Q5_0, Q5_0 and
    Q8_0, since rows of blocks fuse only within one type), each part kept as its blocks: a product runs part by
    part into its columns, and the fused operators take the parts as a list (csrc/fused.cpp)."""

    parts: tuple[QuantWeight, ...]
    N: int = field(init=False)  # the parts' rows together
    K: int = field(init=False)
    dtype = torch.float32  # what its products come out in

    def __post_init__(self) -> None:
        if len({p.K for p in self.parts}) != 1:
            raise ValueError("QuantRows needs parts of one width K")
        self.N, self.K = sum(p.N for p in self.parts), self.parts[0].K

    @property
    def shape(self) -> tuple[int, int]:
        return (self.N, self.K)

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def activations(self) -> str:
        return self.parts[0].activations

    @activations.setter
    def activations(self, path: str) -> None:
        for p in self.parts:
            p.activations = path

    @property
    def dense_min_m(self) -> int:
        return self.parts[0].dense_min_m

    def uses_dense(self, M: int) -> bool:
        """True when a product of M rows runs any part over its float32 copy (QuantWeight.uses_dense)."""
        return any([p.uses_dense(M) for p in self.parts])  # each part asked: each makes its copy alike

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])  # [N, K]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] float32 -> [..., N] float32: each part's product in its columns."""
        return torch.cat([p.matmul(x) for p in self.parts], dim=-1)

    def pack(self) -> QuantRows:
        return QuantRows(tuple(p.pack() for p in self.parts))


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for a dense weight [N, K], a QuantWeight or QuantRows: x [..., K] -> [..., N]."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, b)
    y = w.matmul(x)
    return y if b is None else y + b


def cat_rows(parts: list) -> torch.Tensor | QuantWeight | QuantRows:
    """Fuse projections by rows: quantized parts of one type stay one matrix of blocks; quantized parts of
    several types (Q4_K_M files: Q/K Q5_0, V Q8_0) stay blocks, neighbours of one type fused (QuantRows: Q and K
    one matrix, V another); dense parts, or dense and quantized together, are one float32 matrix."""
    if all(isinstance(p, QuantWeight) for p in parts):
        runs: list[list[QuantWeight]] = []  # neighbours of one type fused: Q and K of Q5_0, then V of Q8_0
        for p in parts:
            if runs and (runs[-1][0].qtype, runs[-1][0].K) == (p.qtype, p.K):
                runs[-1].append(p)
            else:
                runs.append([p])
        fused = [QuantWeight.cat(run) for run in runs]
        return fused[0] if len(fused) == 1 else QuantRows(tuple(fused))
    return torch.cat([p.dequantize() if isinstance(p, QuantWeight) else p for p in parts])
