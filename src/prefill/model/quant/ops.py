"""The quantized GEMM as an operator: torch.ops.prefill_quant (csrc/gemm.cpp) when its library is built, else a
portable torch path that decodes the blocks per call (correct, and slower than float32 weights).

    gemm(x [M, K] float32, blocks uint8 [N, row_bytes], qtype, N, K, activations) -> [M, N] float32
    dequant(blocks, qtype, N, K) -> [N, K] float32

The library loads once per process, built first if missing or stale (prefill.model.quant.build); either way a
one-line note says which path runs. PREFILL_ISA (scalar | avx2 | avx512) forces its instruction set at load, as
set_isa does (the suite runs each kernel so); a CPU without it is a one-line error. Both paths decode exactly as
the gguf package does (the products q * d are exact in float32), so on the f32 activation path they differ from
F.linear on the dequantized weight by summation order only; the q8 path (activations.py) rounds the activations
first.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import torch

from prefill.costmodel.storage import GGUF_BLOCKS, GGUF_TYPE_IDS
from prefill.errors import BadInput
from prefill.model.quant.activations import dequantize_q8, quantize_q8, runs_q8


@functools.cache
def native_library() -> str | None:
    """Path of the loaded kernel library, or None when the portable path runs (with the reason printed once)."""
    from prefill.model.quant import build

    path, why = build.find_library(), "no C++ compiler"
    if path is None and build.compiler() is not None:
        print("quantized kernels: building them (once, about a minute)", file=sys.stderr)
        try:
            path = build.build()
        except RuntimeError as e:
            why = str(e)
    if path is None:
        print(f"quantized kernels: not built ({why}); GGUF blocks run the portable torch path", file=sys.stderr)
        return None
    torch.ops.load_library(str(path))
    _register_fakes()
    if forced := os.environ.get(ISA_ENV):
        try:
            set_isa(forced)
        except RuntimeError as e:  # the operator's own message: an unknown name, or one this CPU lacks
            raise BadInput(f"{ISA_ENV}={forced}: {str(e).splitlines()[0]}") from None
    return str(path)


def _register_fakes() -> None:
    """Shapes for torch.compile's tracing (FakeTensor): the op's output without running it."""

    @torch.library.register_fake("prefill_quant::gemm")
    def _(x, w, qtype, n, k):
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("prefill_quant::dequant")
    def _(w, qtype, n, k):
        return w.new_empty(n, k, dtype=torch.float32)

    @torch.library.register_fake("prefill_quant::pack")
    def _(w, qtype, n, k):
        return torch.empty_like(w)

    @torch.library.register_fake("prefill_quant::pre_attention")
    def _(x, norm_w, eps, w, qtypes, bias, cos, sin, H_q, H_kv, q_norm, k_norm):
        B, P, _ = x.shape
        d = cos.shape[-1]
        return x.new_empty(B, H_q, P, d), x.new_empty(B, H_kv, P, d), x.new_empty(B, H_kv, P, d)

    @torch.library.register_fake("prefill_quant::decode_block")
    def _(x, *args):
        return x.new_empty(x.shape)

    @torch.library.register_fake("prefill_quant::post_attention")
    def _(x, o, w_o, o_type, norm_w, eps, w_gate_up, gu_type, w_down, down_type, post_attn, post_mlp, gelu):
        return x.new_empty(x.shape)


ISA_ENV = "PREFILL_ISA"  # scalar | avx2 | avx512 | auto: the kernels' instruction set, forced at load
_LOADED: bool | None = (
    None  # native_library() is not None, once asked: a plain global torch.compile reads as a constant
)


def available() -> bool:
    """True when the compiled kernels are loaded (building them first if a compiler is there)."""
    global _LOADED
    if _LOADED is None:
        _LOADED = native_library() is not None
    return _LOADED


def forget() -> None:
    """Look for the library again at the next call (tests that hide it use this)."""
    global _LOADED
    _LOADED = None
    native_library.cache_clear()


def set_isa(name: str) -> str:
    """Force the kernels' instruction set ("scalar", "avx2", "avx512": AVX-512 F/BW/VL/VNNI) or restore the best
    one ("auto"); returns the one in use. RuntimeError when the CPU lacks it. Tests run each kernel this way."""
    return torch.ops.prefill_quant.set_isa(name)


def isa() -> str:
    """The instruction set the kernels run now ("avx512", "avx2" or "scalar"; set_isa changes it)."""
    return torch.ops.prefill_quant.isa()


PACKED = 0x100  # type bit of blocks in the x8 layout (csrc/packed.h)
ACT_Q8 = 0x200  # type bit: the products quantise their activations to 8 bits (activations.py, csrc/q8.h)
PACKABLE = ("Q4_0", "Q4_1", "Q8_0")


def type_id(qtype: str, packed: bool = False, activations: str = "f32") -> int:
    """The operators' type argument: the GGUF type number, | PACKED for blocks in the x8 layout, | ACT_Q8 for
    the 8-bit activation path (where the type has it)."""
    q8 = ACT_Q8 if runs_q8(activations, qtype) else 0
    return GGUF_TYPE_IDS[qtype] | (PACKED if packed else 0) | q8


def gemm(
    x: torch.Tensor, blocks: torch.Tensor, qtype: str, N: int, K: int, packed: bool = False, activations: str = "f32"
) -> torch.Tensor:
    """x [M, K] float32 times the quantized weight [N, K] transposed -> [M, N] float32 (F.linear without bias),
    with the activations on `activations`' path (activations.py)."""
    if available():
        return torch.ops.prefill_quant.gemm(x, blocks, type_id(qtype, packed, activations), N, K)
    if runs_q8(activations, qtype) and (quantized := quantize_q8(x)) is not None:
        x = dequantize_q8(*quantized)  # the same 8-bit activations, multiplied in float32
    return torch.nn.functional.linear(x, dequant_portable(blocks, qtype, N, K))


def dequant(blocks: torch.Tensor, qtype: str, N: int, K: int, packed: bool = False) -> torch.Tensor:
    """The float32 weight [N, K] of quantized blocks [N, row_bytes] (parallel over N in the kernels)."""
    if available():
        return torch.ops.prefill_quant.dequant(blocks, type_id(qtype, packed), N, K)
    return dequant_portable(blocks, qtype, N, K)


def pack(blocks: torch.Tensor, qtype: str, N: int, K: int) -> torch.Tensor:
    """The same blocks with every 8 rows interleaved (the x8 layout, csrc/packed.h): the bytes move, none
    changes. Needs the kernels (available()) and a type in PACKABLE."""
    return torch.ops.prefill_quant.pack(blocks, GGUF_TYPE_IDS[qtype], N, K)


def dequant_portable(blocks: torch.Tensor, qtype: str, N: int, K: int) -> torch.Tensor:
    """The same decoding in torch ops (Q4_0, Q4_1, Q8_0) or the gguf package's numpy (the K-quants)."""
    block, nbytes = GGUF_BLOCKS[qtype]
    b = blocks.reshape(N, K // block, nbytes)  # [N, blocks per row, bytes per block]
    if qtype == "Q8_0":
        d = b[..., :2].contiguous().view(torch.float16).float()  # [N, nb, 1]
        return (b[..., 2:].contiguous().view(torch.int8).float() * d).reshape(N, K)
    if qtype in ("Q4_0", "Q4_1"):
        d = b[..., :2].contiguous().view(torch.float16).float()  # [N, nb, 1]
        off = 2 if qtype == "Q4_0" else 4
        qs = b[..., off:]  # [N, nb, 16]: byte i holds weight i (low nibble) and weight i + 16 (high)
        q = torch.cat([qs & 0xF, qs >> 4], dim=-1).float()  # [N, nb, 32]
        if qtype == "Q4_0":
            return ((q - 8) * d).reshape(N, K)
        return (q * d + b[..., 2:4].contiguous().view(torch.float16).float()).reshape(N, K)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    y = dequantize(blocks.numpy(), GGMLQuantizationType[qtype])
    return torch.from_numpy(np.array(y, dtype=np.float32)).reshape(N, K)


def summation_depth(K: int, isa: str, packed: bool = False) -> int:
    """The most roundings any product x_k w_k passes through on its way into one output of `gemm`: AVX2 keeps
    8 lanes of K / 8 sequential FMAs (+ 3 to add the lanes, + the block sums of x and the final adds of the
    M = 1 path: 48 covers them); the scalar path, and the x8 layout's M >= 2 kernel (one lane per output,
    csrc/packed_avx2.h), sum all K in a row."""
    return (K if isa == "scalar" or packed else K // 8) + 48


def error_bound(x: torch.Tensor, magnitudes: torch.Tensor, isa: str, packed: bool = False) -> torch.Tensor:
    """A worst-case bound [M, N] on |gemm(x, W) - x W^T| with W the gguf package's float32 decoding, in float32
    activations:

        gamma_D * sum_k |x_k| t_k  +  2^-28 * sum_b max_{k in b} |x_k| * sum_{k in b} t_k

    gamma_D = D u / (1 - D u), u = 2^-24, D = summation_depth(K, isa, packed); t_k the magnitude of the terms the
    kernel adds (|d q| + |m| for Q4_0 / Q4_1, whose decode path sums d * sum q x and m * sum x apart; |w|
    otherwise; see term_magnitudes). The second term is the decode kernel's split of each 32-block of x into two
    int16 limbs over a power-of-two scale s (exact to s 2^-16 <= max |x_b| 2^-29; csrc/simd_avx2.h), summed over
    the blocks b. The typical error is about sqrt(D) u times the first sum, a few percent of this bound."""
    D = summation_depth(x.shape[-1], isa, packed)
    u = 2.0**-24
    ax, t = x.double().abs(), magnitudes.double()
    M, K = ax.shape
    block_max = ax.view(M, K // 32, 32).amax(-1)  # [M, K / 32]
    split = 2.0**-28 * (block_max @ t.view(t.shape[0], K // 32, 32).sum(-1).T)  # [M, N]
    return D * u / (1 - D * u) * (ax @ t.T) + split


def term_magnitudes(blocks: torch.Tensor, qtype: str, N: int, K: int) -> torch.Tensor:
    """[N, K] float64: the magnitudes of the terms the kernels add, |d| q + |m| for Q4_1 and Q5_1, |d| (q + 8) for
    Q4_0 (q the integer, 0..15 or 0..31), |d sc| q + |dmin m| for Q4_K (each sub-block's sum q x and sum x meet
    its scale and its min apart), |w| for other types."""
    block, nbytes = GGUF_BLOCKS[qtype]
    b = blocks.reshape(N, K // block, nbytes)
    if qtype == "Q4_K":
        return _q4k_terms(b).reshape(N, K)
    if qtype not in ("Q4_0", "Q4_1", "Q5_1"):
        return dequant_portable(blocks, qtype, N, K).double().abs()
    d = b[..., :2].contiguous().view(torch.float16).double().abs()  # [N, nb, 1]
    off = {"Q4_0": 2, "Q4_1": 4, "Q5_1": 8}[qtype]
    q = torch.cat([b[..., off:] & 0xF, b[..., off:] >> 4], dim=-1).long()  # [N, nb, 32]
    if qtype == "Q5_1":  # the fifth bits: bit i of the word at bytes 4..7 is weight i's
        q = q | ((b[..., 4:8].contiguous().view(torch.int32).long() >> torch.arange(32)) & 1) << 4
    m = 8 * d if qtype == "Q4_0" else b[..., 2:4].contiguous().view(torch.float16).double().abs()
    return (q.double() * d + m).reshape(N, K)


def _q4k_terms(b: torch.Tensor) -> torch.Tensor:
    """|d sc| q + |dmin m| of Q4_K blocks b [N, nb, 144] -> [N, nb, 8, 32] (csrc/blocks.h's layout)."""
    N, nb, _ = b.shape
    d = b[..., 0:2].contiguous().view(torch.float16).double().abs()  # [N, nb, 1]
    dmin = b[..., 2:4].contiguous().view(torch.float16).double().abs()
    s = b[..., 4:16].long()  # [N, nb, 12]: 8 six-bit scales and 8 six-bit mins
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)], -1)  # [N, nb, 8]
    mn = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)  # [N, nb, 8]
    qs = b[..., 16:].reshape(N, nb, 4, 1, 32)  # 32 bytes per 64 weights: low nibbles, then high
    q = torch.cat([qs & 0xF, qs >> 4], dim=3).reshape(N, nb, 8, 32).double()
    return q * (d * sc)[..., None] + (dmin * mn)[..., None]
