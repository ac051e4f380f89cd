"""Attention timed as the engine runs it: causal prefill by prompt length, and one decode row's query over S
cached keys stored as the engine's pool stores them (float32, bfloat16, float16 or q8_0: the paged kernel reads
each as it is; row by row over the pool where the kernels are not built). Part of the machine's one probe
(prefill.machine.probe), which times everything else."""

from __future__ import annotations

import math

from prefill.costmodel.causal import causal_pairs
from prefill.costmodel.costs import cache_dtype, canonical_dtype, kv_bytes_per_element
from prefill.machine.probe import after_streaming, best_seconds, cold_bytes, grow, streamer

# Causal prefill lengths of the attention curve. 4: a short prompt's attention is a fixed cost (26 us a layer at
# SmolLM2's heads on the Zen 3), twice what the rate at 16 scaled down (its FLOPs grow as P^2) predicted.
ATTENTION_PS = (4, 16, 64, 256, 1024, 2048)
DECODE_KEYS = (64, 256, 1024, 4096)  # keys of the decode curve (one query per row)
DECODE_ROWS = 4  # decode rows of one paged-attention call in the probe (a batch: every thread has K/V heads)


def attention_curves(
    H_q: int,
    H_kv: int,
    d_head: int,
    dtype: str,
    device: str = "cpu",
    budget_s: float = 0.5,
    kv_dtype: str | None = None,
    prefill: bool = True,
):
    """((P, FLOP/s) of causal prefills for P in ATTENTION_PS, (S, FLOP/s) of one decode query over S keys for S
    in DECODE_KEYS) of scaled_dot_product_attention at the model's heads (4 H_q d_head FLOPs per attended pair),
    each list grown while the budget allows (without `prefill`, the first is empty); the decode keys stored as
    `kv_dtype` (None: `dtype`; a prefill's attention reads its keys as computed). A prefill
    runs the engine's own causal attention (the fused SDPA kernel, or on a CPU in bfloat16 its blocked GEMM form:
    prefill.model.attention.causal_attention), on a CPU after a GEMV that streams weights, as in a forward
    (probe.after_streaming)."""
    import torch

    from prefill.model.attention import causal_attention

    dt = getattr(torch, canonical_dtype(dtype))
    stream = streamer(device, dtype) if device == "cpu" else None

    def timed(P: int, S: int) -> float:
        q = torch.randn(1, H_q, P, d_head, device=device).to(dt)  # [1, H_q, P, d_head]
        k = torch.randn(1, H_kv, S, d_head, device=device).to(dt)  # [1, H_kv, S, d_head]
        v = torch.randn_like(k)
        if stream is None:
            return best_seconds(lambda: causal_attention(q, k, v, S - P), 2 if P > 1 else 5, device)

        def touch() -> None:  # q, k and v come hot from their projection
            q.mul_(1), k.mul_(1), v.mul_(1)

        return after_streaming(lambda: causal_attention(q, k, v, S - P), stream, touch)

    flops = 4.0 * H_q * d_head
    prefill = grow(ATTENTION_PS, lambda P: (flops * causal_pairs(P), timed(P, P)), budget_s / 2) if prefill else []
    kv = cache_dtype(kv_dtype or dtype)
    pool = device == "cpu" and (kv != "float32" or kernels_built())  # the engine's path over its pool

    def decode_s(S: int) -> float:
        return decode_row_seconds(H_q, H_kv, d_head, S, dtype=kv) if pool else timed(1, S)

    decode = grow(DECODE_KEYS, lambda S: (flops * S, decode_s(S)), budget_s / 2)
    return prefill, decode


def kernels_built() -> bool:
    from prefill.model import kernels

    return kernels.available()


def decode_row_seconds(
    H_q: int, H_kv: int, d_head: int, S: int, rows: int = DECODE_ROWS, block: int = 16, dtype: str = "float32"
) -> float:
    """Best seconds of one decode row's attention over S cached keys stored as `dtype` (a K/V dtype: float32,
    bfloat16, float16, q8_0) as the engine runs it on a CPU: in kernels.paged_attention (`rows` rows a call, so
    both threads work) when it is built, else in attention.with_lse row by row over its run of the pool, as its
    _row does (a 16-bit pool; float32 and q8_0 need the kernels); over cold_bytes() of layers' K/V, so they come
    from memory."""
    import torch

    from prefill.model import kernels, kv_quant
    from prefill.model.attention import with_lse

    name = cache_dtype(dtype)
    paged = kernels.available()  # available() loads the library
    if name in ("float32", "q8_0") and not paged:
        raise RuntimeError("the engine's kernels are not built")
    n_blocks = -(-S // block)
    slots = rows * n_blocks * block
    layer_bytes = 2 * H_kv * slots * d_head * kv_bytes_per_element(name)
    layers = max(1, min(4096, math.ceil(cold_bytes() / layer_bytes)))
    if name == "q8_0":  # [layers, 2, H_kv, slots, D / 32 * 34], every row the same q8_0 bytes
        row = kv_quant.quantize(torch.full((d_head,), 0.01))
        kv = row.expand(layers, 2, H_kv, slots, row.numel()).contiguous()
    else:
        kv = torch.full((layers, 2, H_kv, slots, d_head), 0.01, dtype=getattr(torch, name))  # [.., slots, D]
    q = torch.full((rows, H_q, d_head), 0.01, dtype=kv.dtype if name != "q8_0" else torch.float32)  # [R, H_q, D]
    table = torch.arange(rows * n_blocks).view(rows, n_blocks)  # [R, blocks]: a fresh pool's blocks, in order
    zero, end = torch.zeros(rows, dtype=torch.long), torch.full((rows,), S, dtype=torch.long)
    runs = [(r * n_blocks * block, r * n_blocks * block + S) for r in range(rows)]  # each row's slots, one run

    def every_layer() -> None:
        for layer in range(layers):
            k, v = kv[layer, 0], kv[layer, 1]  # [H_kv, slots, D]
            if paged:  # q widened to float32, as the engine passes it
                kernels.paged_attention(q.float(), k, v, table, zero, zero, end, block, d_head**-0.5)
            else:  # each row's query [1, H_q, 1, D] over its run's views [1, H_kv, S, D] of the pool
                for r, (a, b) in enumerate(runs):
                    with_lse(q[r, :, None][None], k[None, :, a:b], v[None, :, a:b], None, d_head**-0.5)

    return best_seconds(every_layer, 3) / (layers * rows)
