"""The activation paths of the products on GGUF blocks: what the activations are rounded to before they meet the
weights' integers.

    f32   float32 activations: the reference, and the path of --deterministic and `prefill verify`
    q8    each row quantised per 32-block to int8 with a float32 scale (llama.cpp's Q8_0 / Q8_1), met by the
          weights' integers in exact integer dot products (csrc/q8.h): AVX-512 VNNI, AVX2 or the portable scalar
          kernel, which all give the same float32 bits. Q4_0, Q4_1 and Q8_0 blocks (Q8_TYPES); the K-quants, and
          products long enough for a weight's float32 copy (QuantWeight.uses_dense), keep float32 activations.

A weight's path is QuantWeight.activations: given when it is made, else default_activations(), which reads
PREFILL_ACTIVATIONS (f32 | q8; here and nowhere else: requested_activations); a loaded model's weights all at once by
prefill.model.quant.set_activations(model, path). quantize_q8 is the quantiser in torch: the portable path
(no compiler) and the tests' reference, bitwise the kernels' own (csrc/q8.h quantize_row).
"""

from __future__ import annotations

import os

import torch

from prefill.errors import BadInput

ENV = "PREFILL_ACTIVATIONS"
PATHS = ("f32", "q8")
Q8_TYPES = ("Q4_0", "Q4_1", "Q8_0")
QK = 32  # activations per quantisation block


def check(path: str) -> str:
    """`path` itself when it is one of PATHS, else BadInput with the choices."""
    if path not in PATHS:
        raise BadInput(f"activation path '{path}' is not one of {', '.join(PATHS)} (set by {ENV} or the engine)")
    return path


def requested_activations() -> str:
    """PREFILL_ACTIVATIONS (f32 | q8) when set, else "auto" (the serving path's choice, prefill.machine.paths)."""
    return check(os.environ[ENV]) if os.environ.get(ENV) else "auto"


def default_activations() -> str:
    """The path of a QuantWeight made without one: PREFILL_ACTIVATIONS when set, else f32."""
    requested = requested_activations()
    return "f32" if requested == "auto" else requested


def runs_q8(path: str, qtype: str) -> bool:
    """True when a product of a `qtype` weight on `path` quantises its activations to 8 bits."""
    return path == "q8" and qtype in Q8_TYPES


def words(path: str, dtype: str) -> str:
    """The activations in words: "8-bit" on the q8 path, else the engine's `dtype` ("float32")."""
    return "8-bit" if path == "q8" else dtype


def kernel_name(qtype: str, path: str) -> str:
    """The probe's name of the kernel a `qtype` weight's products run on `path`: "Q4_1", or "Q4_1:q8" where they
    take 8-bit activations (its GEMM curve is timed on those kernels)."""
    return f"{qtype}:q8" if runs_q8(path, qtype) else qtype


def quantize_q8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """x [M, K] float32 -> (q int8 [M, K], d float32 [M, K / 32]) with x ~ d_b q: d_b = max |x_b| / 127,
    q = round(x * (1 / d_b)) to nearest even, in float32 as the kernels do it. None when a block holds an inf or a
    NaN or a largest |x| in (0, 2^-100): the kernels then run the float32 path."""
    M, K = x.shape
    xb = x.float().reshape(M, K // QK, QK)  # [M, nb, 32]
    amax = xb.abs().amax(-1)  # [M, nb]
    if not torch.isfinite(xb).all() or ((amax > 0) & (amax < 2.0**-100)).any():
        return None
    d = amax / 127.0
    inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, 1.0), 0.0)  # [M, nb]
    q = torch.round(xb * inv[..., None]).clamp(-127, 127).to(torch.int8)
    return q.reshape(M, K), d


def dequantize_q8(q: torch.Tensor, d: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """d_b q [M, K] in `dtype` (float64: exact)."""
    M, K = q.shape
    return (q.to(dtype).reshape(M, K // QK, QK) * d.to(dtype)[..., None]).reshape(M, K)


def q8_error_bound(
    x: torch.Tensor, w: torch.Tensor, magnitudes: torch.Tensor, portable: bool = False, quantization: bool = True
) -> torch.Tensor:
    """A worst-case bound [M, N] on |gemm_q8(x, W) - x W^T| (W [N, K] the gguf package's float32 decoding, in
    float64), from the arithmetic of csrc/q8.h:

        sum_b d_b (1/2 + 2^-14) sum_{k in b} |w_k|   +   gamma_D sum_k t_k d_b |q_k|

    The first term is the quantisation: |x - d_b q| <= d_b |x / d_b - q| <= d_b (1/2 + 3 * 127 u) (q rounds
    x * fl(1 / d_b), three roundings from x / d_b). The second is float32's: each block's exact integer sum I meets
    (d_w d_b) and Q4_1's m meets s_b = fl(d_b sum q), 3 roundings, then nb sequential adds: D = nb + 3 (the
    portable path, F.linear over fl(d_b q): D = K + 2); t_k as in ops.term_magnitudes (|d q_w| + |m| >= the
    terms' parts), u = 2^-24. quantization=False: the second term alone, the bound against the exact product of
    W and the quantised activations d_b q (what holds the kernels to this quantiser, q for q)."""
    M, K = x.shape
    quantized = quantize_q8(x)
    assert quantized is not None, "q8_error_bound needs finite activations"
    q, d = quantized
    u = 2.0**-24
    D = K + 2 if portable else K // QK + 3
    aw = w.double().abs().reshape(w.shape[0], K // QK, QK).sum(-1)  # [N, nb]
    rounding = d.double() * (0.5 + 2.0**-14) @ aw.T if quantization else 0.0  # [M, N]
    xq = dequantize_q8(q.abs(), d, torch.float64)  # [M, K]: d_b |q|
    return rounding + D * u / (1 - D * u) * (xq @ magnitudes.double().T)
