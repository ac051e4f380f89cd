"""The KV cache: per layer, K and V preallocated as [B, H_kv, S_max, d_head].

Prefill writes positions 0..P-1 in one step; each decode step appends one position. Attention then reads the
filled part [B, H_kv, length, d_head]. Nothing is ever recomputed for a cached position.
"""

from __future__ import annotations

import torch

from prefill.errors import BadInput


class KVCache:
    """Keys and values of every layer for B sequences of up to `capacity` tokens."""

    def __init__(self, L: int, B: int, H_kv: int, capacity: int, d_head: int, dtype: torch.dtype, device):
        shape = (B, H_kv, capacity, d_head)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(L)]  # L x [B, H_kv, S_max, d_head]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(L)]  # L x [B, H_kv, S_max, d_head]
        self.capacity = capacity
        self.length = 0  # positions 0..length-1 are filled

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, H_kv, P, d_head] at positions start..start+P-1; return the filled K, V up to there."""
        end = start + k.shape[2]
        if end > self.capacity:
            raise BadInput(f"KV cache holds {self.capacity} tokens; {end} needed (raise the capacity)")
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]  # [B, H_kv, end, d_head] views

    def nbytes(self, length: int | None = None) -> int:
        """Bytes of K and V held for the first `length` positions (default: the filled ones), all layers."""
        n = self.length if length is None else length
        per_position = sum(t[:, :, :1].numel() * t.element_size() for t in self.k + self.v)
        return per_position * n

    def allocated_bytes(self) -> int:
        """Bytes preallocated for the full capacity."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def shape(self, length: int | None = None) -> tuple[int, int, int, int]:
        """[B, H_kv, length, d_head] of one layer's K (or V) as filled."""
        B, H_kv, _, d_head = self.k[0].shape
        return (B, H_kv, self.length if length is None else length, d_head)

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on (they are overwritten by the next write)."""
        if not 0 <= length <= self.length:
            raise BadInput(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length

    def copy_prefix_from(self, other: KVCache, n: int) -> None:
        """Take positions 0..n-1 of every layer from `other` (a prefix shared with an earlier prompt)."""
        if n > min(self.capacity, other.length):
            raise BadInput(f"cannot copy {n} cached positions (source has {other.length})")
        for dst, src in zip(self.k + self.v, other.k + other.v, strict=True):
            dst[:, :, :n] = src[:, :, :n]
        self.length = n
