"""Tensor parallelism across T GPUs: each GPU's share of the FLOPs and KV heads, the head-split rule, and the
ring all-reduces of the activations that a tensor-parallel prefill adds. No torch."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from prefill.costmodel.costs import _non_negative, _positive, compute_seconds, kv_cache_bytes_for

if TYPE_CHECKING:
    from prefill.costmodel.specs import ModelSpec


def _tp(T: int) -> int:
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"tensor-parallel size T must be an integer >= 1, got {T!r}")
    return T


def tp_flops_per_gpu(flops: float, T: int) -> float:
    """FLOPs each of T GPUs does when heads, MLP columns and vocabulary are split evenly across them."""
    return _non_negative("flops", flops) / _tp(T)


def tp_kv_heads_per_gpu(H_kv: int, T: int) -> int:
    """KV heads each of T GPUs holds: ceil(H_kv / T) (heads are replicated when T > H_kv)."""
    return math.ceil(H_kv / _tp(T))


def tp_head_split_problem(H_q: int, H_kv: int, T: int) -> str | None:
    """Why T GPUs cannot split the attention heads evenly, or None when they can. Each GPU takes H_q / T query
    heads, and H_kv / T KV heads, or (T > H_kv) one KV head copied to T / H_kv GPUs: T must divide H_q, and divide
    H_kv or be a multiple of it (vLLM's rule)."""
    if H_q % _tp(T):
        return f"T = {T} does not divide the {H_q} query heads"
    if (H_kv % T) if H_kv >= T else (T % H_kv):
        return f"T = {T} neither divides the {H_kv} KV heads nor is a multiple of them"
    return None


def tp_kv_cache_bytes_per_gpu(spec: ModelSpec, P: int, bytes_per_element: int, T: int, B: int = 1) -> int:
    """KV-cache bytes on each of T GPUs: tp_kv_heads_per_gpu(H_kv, T) KV heads each."""
    return kv_cache_bytes_for(spec, P, bytes_per_element, B, H_kv=tp_kv_heads_per_gpu(spec.H_kv, T))


def tp_allreduce_payload_bytes(spec: ModelSpec, P: int, bytes_per_element: int, B: int = 1) -> int:
    """Bytes all-reduced during a tensor-parallel prefill: 2 all-reduces per layer (after attention and
    after the MLP) of the [B, P, d_model] activations each: 2 * L * B * P * d_model * b."""
    return int(2 * spec.L * B * P * spec.d_model * bytes_per_element)


def ring_allreduce_bytes_per_gpu(payload_bytes: float, T: int) -> float:
    """Bytes each GPU sends (and receives) in a ring all-reduce of `payload_bytes`: 2 * (T-1)/T * payload."""
    return 2 * (_tp(T) - 1) / T * _non_negative("payload_bytes", payload_bytes)


def tp_allreduce_seconds(payload_bytes: float, T: int, link_bytes_per_s: float) -> float:
    """Seconds of the ring all-reduces of a prefill at `link_bytes_per_s` per GPU per direction
    (bandwidth term only; no latency)."""
    return ring_allreduce_bytes_per_gpu(payload_bytes, T) / _positive("link_bytes_per_s", link_bytes_per_s)


def tp_prefill_seconds(
    flops: float, T: int, flops_per_sec: float, utilization: float = 1.0, allreduce_s: float = 0.0
) -> float:
    """Seconds of a prefill of `flops` FLOPs on T GPUs: each GPU's share at peak x MFU, plus the all-reduces
    (`allreduce_s`, tp_allreduce_seconds), not overlapped with the compute."""
    return compute_seconds(tp_flops_per_gpu(flops, T), flops_per_sec, utilization) + _non_negative(
        "allreduce_s", allreduce_s
    )
