"""Causal attention for a prefill: the fused SDPA kernel, or a blocked GEMM form that is faster on CPUs.

On a CPU, PyTorch's flash-attention kernel runs its inner products one query head at a time with d_head-long
dot products, and scales poorly past one thread. The blocked form instead walks the queries in blocks of
`block` positions; for each block it computes the scores of all G = H_q / H_kv query heads that share a K/V
head in one GEMM against the keys they may see (never the future ones), takes the softmax, and multiplies by
V in a second GEMM. It never forms the P x P matrix, never copies K/V per query head, and masks only the
block x block triangle on the diagonal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 64  # query positions per block: scores are [B, H_kv, G, BLOCK, keys]


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Causal attention with scaled_dot_product_attention. q [B, H_q, P, d] at positions start..start+P-1,
    k, v [B, H_kv, start+P, d] -> [B, H_q, P, d]."""
    P = q.shape[2]
    if start == 0:
        # The cache was empty: plain causal attention, the fused kernel with no mask at all.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    # A chunk after `start` cached tokens: query i sees keys 0..start+i (bottom-right causal).
    rows = torch.arange(start, start + P, device=q.device)[:, None]  # [P, 1]
    cols = torch.arange(start + P, device=q.device)[None, :]  # [1, start + P]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=cols <= rows, enable_gqa=True)


def blocked_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, block: int = BLOCK) -> torch.Tensor:
    """The same result as sdpa_causal, computed block by block with two GEMMs per block (see module doc)."""
    B, H_q, P, d = q.shape
    H_kv = k.shape[1]
    G = H_q // H_kv
    qg = (q * d**-0.5).view(B, H_kv, G, P, d)  # [B, H_kv, G, P, d]: the G heads sharing one K/V head
    out = torch.empty_like(qg)
    future = torch.ones(block, block, dtype=torch.bool, device=q.device).triu_(1)  # [block, block]
    for s in range(0, P, block):
        e = min(P, s + block)
        n, keys = e - s, start + e  # queries in this block; keys they may see: 0..start+e-1
        qs = qg[:, :, :, s:e].reshape(B, H_kv, G * n, d)  # [B, H_kv, G n, d]
        scores = torch.matmul(qs, k[:, :, :keys].transpose(-1, -2)).view(B, H_kv, G, n, keys)
        scores[..., start + s :].masked_fill_(future[:n, :n], float("-inf"))  # only the diagonal block
        p = torch.softmax(scores, dim=-1).view(B, H_kv, G * n, keys)  # [B, H_kv, G n, keys]
        out[:, :, :, s:e] = torch.matmul(p, v[:, :, :keys]).view(B, H_kv, G, n, d)
    return out.view(B, H_q, P, d)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Attention of P > 1 new positions: the blocked GEMM form for bfloat16 on CPUs, the fused SDPA kernel
    elsewhere (in float32 on 2 CPU threads SDPA is the faster one: 125 vs 71 GFLOP/s at P = 4096, while in
    bfloat16 the blocked form wins, 184 vs 131; measured with both on this machine)."""
    if q.device.type == "cpu" and q.dtype != torch.float32 and q.shape[2] > 1:
        return blocked_causal(q, k, v, start)
    return sdpa_causal(q, k, v, start)
