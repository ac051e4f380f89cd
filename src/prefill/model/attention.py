"""Attention: where the queries of one forward meet the KV pool, and the kernels that compute it.

`attend` is the one place attention meets the cache. It stores the forward's new K/V in the pool, then gives
each row its attention over its own past, read where it lies in the pool (runs of consecutive slots, each a
view: no copy of a row's history, whatever its length), plus, for a chunk of several new tokens, the chunk's
own K/V under the causal mask. Pieces are merged by their log-sum-exp, as FlashAttention merges key blocks:
out = sum_i exp(lse_i - lse) * out_i with lse = log sum_i exp(lse_i). A prefill with nothing cached before it
(the usual one) is a single piece, computed as below.

On a CPU, PyTorch's flash-attention kernel runs its inner products one query head at a time with d_head-long
dot products, and scales poorly past one thread. The blocked form instead walks the queries in blocks of
`block` positions; for each block it computes the scores of all G = H_q / H_kv query heads that share a K/V
head in one GEMM against the keys they may see (never the future ones), takes the softmax, and multiplies by
V in a second GEMM. It never forms the P x P matrix, never copies K/V per query head, and masks only the
block x block triangle on the diagonal.

A sliding window of W tokens (Mistral, Gemma's local layers) lets the query at position i see the keys at
max(0, i - W + 1)..i: itself and the W - 1 before it. Keys that no query of the call can see are sliced off
before any kernel runs, so a windowed layer costs the band, not the triangle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prefill.model import kernels
from prefill.model.batch import ForwardBatch, Row

BLOCK = 64  # query positions per block: scores are [B, H_kv, G, BLOCK, keys]
SDPA_BAND = 512  # least queries per SDPA call when a window cuts a long prompt into bands


def visible(rows: torch.Tensor, cols: torch.Tensor, window: int | None) -> torch.Tensor:
    """Bool mask: key position cols may be seen by query position rows (cols <= rows, and within the window)."""
    mask = cols <= rows
    return mask if window is None else mask & (cols > rows - window)


def _seen_keys(k, v, start: int, P: int, window: int | None):
    """The keys (and values) any of the queries start..start+P-1 may see, and the position of the first.

    k, v [B, H_kv, S, d] hold the positions start + P - S .. start + P - 1 (the last S, ending at the last query).
    """
    k0 = start + P - k.shape[2]
    lo = k0 if window is None else max(k0, start - window + 1)
    return k[:, :, lo - k0 :], v[:, :, lo - k0 :], lo


def sdpa_causal(q, k, v, start: int, window: int | None = None, scale: float | None = None) -> torch.Tensor:
    """Causal attention with scaled_dot_product_attention. q [B, H_q, P, d] at positions start..start+P-1,
    k, v [B, H_kv, S, d] at the last S positions up to start+P-1 -> [B, H_q, P, d]. `scale` defaults to d^-1/2."""
    P = q.shape[2]
    k, v, lo = _seen_keys(k, v, start, P, window)
    if P == 1:  # one decode position sees every key left after the slice: no mask at all
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    if lo == start and (window is None or window >= P):
        # Keys start with the queries and no window bites: plain causal attention, the fused kernel, no mask.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    n = P if window is None else max(window, SDPA_BAND)  # queries per call
    out = []
    for s in range(0, P, n):
        # A long prompt under a window goes in blocks of n queries, each against only the keys it may see:
        # neither the scores nor the mask grow as P^2, only as P * (W + n).
        e = min(P, s + n)
        first = lo if window is None else max(lo, start + s - window + 1)
        rows = torch.arange(start + s, start + e, device=q.device)[:, None]  # [n, 1]
        cols = torch.arange(first, start + e, device=q.device)[None, :]  # [1, keys]
        ks, vs = k[:, :, first - lo : start + e - lo], v[:, :, first - lo : start + e - lo]
        mask = visible(rows, cols, window)
        out.append(F.scaled_dot_product_attention(q[:, :, s:e], ks, vs, attn_mask=mask, scale=scale, enable_gqa=True))
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


def blocked_causal(q, k, v, start: int, window=None, scale=None, block: int = BLOCK) -> torch.Tensor:
    """The same result as sdpa_causal, computed block by block with two GEMMs per block (see module doc)."""
    B, H_q, P, d = q.shape
    k, v, lo = _seen_keys(k, v, start, P, window)
    H_kv = k.shape[1]
    G = H_q // H_kv
    qg = (q * (d**-0.5 if scale is None else scale)).view(B, H_kv, G, P, d)  # [B, H_kv, G, P, d]
    out = torch.empty_like(qg)
    future = torch.ones(block, block, dtype=torch.bool, device=q.device).triu_(1)  # [block, block]
    for s in range(0, P, block):
        e = min(P, s + block)
        n = e - s  # queries in this block, at positions start+s .. start+e-1
        first = lo if window is None else max(lo, start + s - window + 1)  # the first key the block may see
        keys = k[:, :, first - lo : start + e - lo]  # [B, H_kv, keys, d]
        qs = qg[:, :, :, s:e].reshape(B, H_kv, G * n, d)  # [B, H_kv, G n, d]
        scores = torch.matmul(qs, keys.transpose(-1, -2)).view(B, H_kv, G, n, -1)  # [B, H_kv, G, n, keys]
        if window is None:  # only the diagonal block x block triangle has future keys
            scores[..., start + s - first :].masked_fill_(future[:n, :n], float("-inf"))
        else:
            rows = torch.arange(start + s, start + e, device=q.device)[:, None]  # [n, 1]
            cols = torch.arange(first, start + e, device=q.device)[None, :]  # [1, keys]
            scores.masked_fill_(~visible(rows, cols, window), float("-inf"))
        p = torch.softmax(scores, dim=-1).view(B, H_kv, G * n, -1)  # [B, H_kv, G n, keys]
        out[:, :, :, s:e] = torch.matmul(p, v[:, :, first - lo : start + e - lo]).view(B, H_kv, G, n, d)
    return out.view(B, H_q, P, d)


def causal_attention(q, k, v, start: int, window=None, scale=None) -> torch.Tensor:
    """Attention of the P new positions start..start+P-1 (P >= 1) over the cached ones, under a sliding window
    when `window` is set: the blocked GEMM form for bfloat16 on CPUs, the fused SDPA kernel elsewhere (in
    float32 on 2 CPU threads SDPA is the faster one: 125 vs 71 GFLOP/s at P = 4096, while in bfloat16 the
    blocked form wins, 184 vs 131; measured with both on this machine)."""
    if q.device.type == "cpu" and q.dtype != torch.float32 and q.shape[2] > 1:
        return blocked_causal(q, k, v, start, window, scale)
    return sdpa_causal(q, k, v, start, window, scale)


def attend(q, k, v, batch: ForwardBatch, layer: int, window: int | None, scale: float) -> torch.Tensor:
    """Store the new k, v [1, H_kv, N, d_head] in the pool, then each row's queries attend causally over that
    row's positions: all up to itself, or in a windowed layer its last `window` (itself included).
    q [1, H_q, N, d_head] -> [1, H_q, N, d_head]."""
    k, v = batch.store(layer, k, v)  # as the pool holds them: rounded to a 16-bit pool's, or q8_0's values
    paged = batch.paged
    if batch.fresh and (paged is None or not paged.every_token):  # one prompt, nothing cached before it
        return causal_attention(q, k, v, 0, window, scale)
    out = torch.empty_like(q)  # [1, H_q, N, d_head]
    rows = batch.rows
    if paged is not None and (paged.every_token or kernels.paged_usable(batch.k[layer])):
        # Every decode row (or every token) in one call, each query reading its past where it lies (16-bit K/V
        # widened as they are read: a row's past in many runs of the pool costs one call, not one per run).
        qp = q[0, :, paged.index].transpose(0, 1).float().contiguous()  # [Q, H_q, d_head] float32
        table, first_block, first, end = paged.tables[batch.group_of[layer]]
        op = kernels.paged_attention(
            qp, batch.k[layer], batch.v[layer], table, first_block, first, end, paged.block_size, scale
        )
        out[0, :, paged.index] = op.transpose(0, 1).to(out.dtype)
        if paged.every_token:
            return out
        rows = [r for r in rows if not r.paged]
    for row in rows:
        out[:, :, row.offset : row.offset + row.T] = _row(q, k, v, batch, layer, row, window, scale)
    return out


def _row(q, k, v, batch: ForwardBatch, layer: int, row: Row, window: int | None, scale: float) -> torch.Tensor:
    """One row's attention: its T queries [1, H_q, T, d] over its past (pool views) and, for T > 1, its own
    new K/V (causal), merged by log-sum-exp; or, when its past and its own K/V lie in one run of the pool (a
    chunk after a prefix, its blocks consecutive), one causal call on that view (the new K/V is stored first)."""
    s, e = row.offset, row.offset + row.T
    qr = q[:, :, s:e]  # [1, H_q, T, d_head]
    g = batch.group_of[layer]
    if row.whole and row.whole[g] is not None:  # past and chunk in one run of the pool: one causal call on a view
        a, b = row.whole[g]
        k_run, v_run = batch.run(layer, a, b, qr.dtype)  # [1, H_kv, S + T, d_head]
        return causal_attention(qr, k_run, v_run, row.start, window, scale)
    parts = [_piece(qr, kp, vp, row.start, p0, window, scale) for kp, vp, p0 in batch.past(layer, row, qr.dtype)]
    if not row.decode:  # the chunk's own K/V: causal within it (a square, so top-left causal is right)
        if parts:
            parts.append(_piece(qr, k[:, :, s:e], v[:, :, s:e], row.start, row.start, window, scale))
        else:
            return causal_attention(qr, k[:, :, s:e], v[:, :, s:e], row.start, window, scale)
    return merge(parts)


def _piece(q, k, v, start: int, first: int, window: int | None, scale: float):
    """Attention of queries at positions start.. over keys at positions first.. (all of them before the queries,
    or the queries' own, causal): (out [1, H_q, T, d], lse [1, H_q, T])."""
    T, S = q.shape[2], k.shape[2]
    rows = torch.arange(start, start + T, device=q.device)[:, None]  # [T, 1]
    cols = torch.arange(first, first + S, device=q.device)[None, :]  # [1, S]
    own = first == start
    need_mask = (window is not None and start + T - window > first) or (own and T > 1)
    mask = visible(rows, cols, window) if need_mask else None  # [T, S]
    return with_lse(q, k, v, mask, scale)


def with_lse(q, k, v, mask: torch.Tensor | None, scale: float):
    """Attention and its log-sum-exp: q [1, H_q, T, d], k, v [1, H_kv, S, d] (GQA), mask [T, S] bool or None ->
    (out [1, H_q, T, d], lse [1, H_q, T] float32; -inf where a query sees no key, and out 0 there)."""
    if q.device.type == "cpu":
        bias = None if mask is None else torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf"))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=bias, scale=scale
        )
    else:
        B, H_q, T, d = q.shape
        H_kv = k.shape[1]
        qg = q.view(B, H_kv, H_q // H_kv * T, d)  # GQA: a K/V head's G query heads as more query rows
        scores = torch.matmul(qg.float(), k.float().transpose(-1, -2)).view(B, H_q, T, -1) * scale  # [B, H_q, T, S]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # [B, H_q, T]
        p = torch.exp(scores - lse[..., None]).nan_to_num(0.0).view(B, H_kv, -1, scores.shape[-1])
        out = torch.matmul(p.to(v.dtype), v).view(B, H_q, T, d)
    if mask is not None:
        lse = lse.masked_fill(~mask.any(-1), float("-inf"))  # the kernel reports 0 for a query with no key
    return out, lse


def merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Attention over the union of disjoint key sets from each set's (out [1, H_q, T, d], lse [1, H_q, T])."""
    if len(parts) == 1:
        return parts[0][0]
    lse = torch.stack([p[1] for p in parts]).logsumexp(0)  # [1, H_q, T]
    out = sum(o.float() * torch.exp(l - lse).nan_to_num(0.0)[..., None] for o, l in parts)
    return out.to(parts[0][0].dtype)
