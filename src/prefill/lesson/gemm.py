"""Why prefill is one big GEMM and decode a thin one (GET /api/gemm): the real model's first weight of each layer.

Prefill multiplies the prompt's P rows by each weight matrix at once, x [P, d_model] · W [d_model, n], so the
weight's bytes, read once, serve P rows; a decode step multiplies one row, x [1, d_model] · W, and reads the same
bytes for one row's FLOPs. The numbers are the time model's own operation for that GEMM (prefill.costmodel.ops
"qkv": the fused Q, K and V projection) in this server's prefill and in one decode step: its FLOPs, the bytes it
moves and its predicted seconds at the GEMM rate measured here for that many rows.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from prefill.costmodel.timemodel import OpTime
from prefill.lesson.api import bad_input, finite
from prefill.lesson.limits import in_range
from prefill.lesson.state import lesson_of
from prefill.lesson.words import human

router = APIRouter(prefix="/api", tags=["lesson: live model"])
GEMM = "qkv"  # the time model's operation: x [M, d_model] · W_QKV [d_model, (H_q + 2 H_kv) d_head], once a layer


def one_gemm(op: OpTime, L: int, M: int, d_model: int) -> dict:
    """One layer's instance of the op, for M rows: its shape, FLOPs, bytes (weights and rows), FLOP per byte and
    predicted seconds, with their words."""
    flops, moved, weights, seconds = op.flops / L, op.bytes / L, op.weight_bytes / L, op.seconds / L
    n = round(flops / (2 * M * d_model))  # the weight's columns: FLOPs = 2 · M · d_model · n
    return {
        "M": M,
        "x": [M, d_model],
        "w": [d_model, n],
        "flops": flops,
        "bytes": moved,
        "weight_bytes": weights,
        "intensity": flops / moved,
        "seconds": seconds,
        "bound": op.bound,
        "human": {
            "flops": human(flops, "FLOP"),
            "bytes": human(moved, "B"),
            "weights": human(weights, "B"),
            "seconds": human(seconds, "s"),
        },
    }


@router.get("/gemm")
async def gemm(
    request: Request, P: int = Query(..., description="prompt tokens", json_schema_extra={"minimum": 1})
) -> dict:
    """The fused QKV projection of one layer in this prompt's prefill (its first chunk, where the server chunks)
    and in one decode step after it: shapes, FLOPs, bytes, FLOP/B and the time model's seconds, and their ratio."""
    lesson = lesson_of(request)
    engine, spec = lesson.engine, lesson.spec
    in_range("P", P, 1, spec.context_length)
    profile = await lesson.profile()
    M = min(P, lesson.chunk_size) if lesson.chunk_size else P  # the rows of one forward
    with bad_input():
        pre = one_gemm(engine.predict_prefill(M, profile=profile).by_op()[GEMM], spec.L, M, spec.d_model)
        dec = one_gemm(engine.predict_decode([P], profile=profile).by_op()[GEMM], spec.L, 1, spec.d_model)
    return finite(
        {
            "P": P,
            "L": spec.L,
            "chunked": M < P,
            "prefill": pre,
            "decode": dec,
            "flops_ratio": pre["flops"] / dec["flops"],
            "seconds_ratio": pre["seconds"] / dec["seconds"],
        }
    )
