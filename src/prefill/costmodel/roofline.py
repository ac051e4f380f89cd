"""Arithmetic intensity and the roofline: the bytes a prefill moves, its FLOPs per byte, the ridge point where a
kernel turns compute-bound, the attainable rate, and the shortest compute-bound prompt. No torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefill.costmodel.costs import _non_negative, _positive, kv_cache_bytes_for, prefill_flops_exact

if TYPE_CHECKING:
    from prefill.costmodel.specs import ModelSpec


def prefill_bytes_moved(spec: ModelSpec, P: int, bytes_per_element: int, B: int = 1) -> int:
    """Bytes a prefill moves to and from memory, at the least: weights read once (N * b), each layer's input
    read and output written (2 * L * B * P * d_model * b), and the KV cache written."""
    activations = 2 * spec.L * B * P * spec.d_model * bytes_per_element
    return spec.N * bytes_per_element + activations + kv_cache_bytes_for(spec, P, bytes_per_element, B)


def prefill_intensity(spec: ModelSpec | None, P: int, bytes_per_element: int, B: int = 1) -> float:
    """Arithmetic intensity of a prefill (FLOPs per byte): exact FLOPs / bytes moved. Grows with P because
    the weights are read once and reused by all B * P tokens. With spec None (only N known) the weights are
    the only bytes counted: weight_reuse_intensity(B * P, bytes_per_element)."""
    if spec is None:
        return weight_reuse_intensity(B * P, bytes_per_element)
    return prefill_flops_exact(spec, P, B=B).total / prefill_bytes_moved(spec, P, bytes_per_element, B)


def weight_reuse_intensity(tokens: int, bytes_per_weight: float) -> float:
    """FLOPs per byte of a dense weight scan shared by `tokens` token positions: 2*N*tokens / (N*b).

    Counts weight bytes only (no activations, no KV traffic).
    """
    _non_negative("tokens", tokens)
    return 2 * tokens / _positive("bytes_per_weight", bytes_per_weight)


def decode_intensity(bytes_per_weight: float) -> float:
    """Arithmetic intensity of one single-sequence dense decode step: about 2/b FLOPs per byte."""
    return weight_reuse_intensity(1, bytes_per_weight)


def ridge_point(peak_flops_per_sec: float, bandwidth_bytes_per_s: float) -> float:
    """The roofline's ridge (FLOPs per byte): below it a kernel is memory-bound, above it compute-bound."""
    return _positive("peak_flops_per_sec", peak_flops_per_sec) / _positive(
        "bandwidth_bytes_per_s", bandwidth_bytes_per_s
    )


def bound(intensity: float, ridge: float) -> str:
    """'compute-bound' if `intensity` reaches the ridge point, else 'memory-bound'."""
    return "compute-bound" if intensity >= ridge else "memory-bound"


def attainable_flops_per_s(intensity: float, peak_flops_per_sec: float, bandwidth_bytes_per_s: float) -> float:
    """The roofline: FLOP/s a kernel of `intensity` FLOPs per byte can reach, min(peak, intensity * bandwidth)."""
    _non_negative("intensity", intensity)
    return min(
        _positive("peak_flops_per_sec", peak_flops_per_sec),
        intensity * _positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s),
    )


def compute_bound_prompt_length(
    spec: ModelSpec | None, bytes_per_element: int, ridge: float, B: int = 1, max_P: int = 2**40
) -> int | None:
    """The shortest prompt (tokens) whose prefill_intensity(spec, ...) reaches `ridge`, or None beyond `max_P`.

    Found by doubling then bisection on prefill_intensity, which rises with P.
    """
    _positive("ridge", ridge)
    hi = 1
    while prefill_intensity(spec, hi, bytes_per_element, B) < ridge:
        if hi >= max_P:
            return None
        hi *= 2
    lo = hi // 2  # intensity(lo) < ridge, or lo == 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if prefill_intensity(spec, mid, bytes_per_element, B) >= ridge:
            hi = mid
        else:
            lo = mid
    return hi
