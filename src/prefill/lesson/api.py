"""The lesson page's calculator API: every number the page shows, computed by `prefill.costmodel.costs`.

GET /api/catalog, /api/estimate, /api/mask, /api/kv, /api/request and POST /api/answer. Pure arithmetic (no
model, no torch), so a slider's request is answered in about a millisecond. Bad input is a 400 with one
clear message, in the same OpenAI-style error body as the /v1 routes.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from prefill.costmodel import costs, roofline
from prefill.costmodel.causal import causal_blocks, causal_pairs
from prefill.costmodel.estimate import Estimate, Roofline, Setting, build_estimate
from prefill.costmodel.estimate import request_time as estimate_request_time
from prefill.costmodel.hardware import HARDWARE
from prefill.costmodel.specs import PRESETS, ModelSpec
from prefill.errors import BadInput
from prefill.lesson.exercise import FUNCTIONS, skeleton
from prefill.lesson.limits import RANGES, in_words, limits
from prefill.lesson.quiz import check_answer
from prefill.lesson.state import lesson_of
from prefill.lesson.words import human, plural, seed_lines

MAX_MASK_P = 256  # the largest mask /api/mask sends pair by pair; a longer prompt's comes in cells of tokens
LOADED = "loaded"  # the model name that means the server's own model


@contextmanager
def bad_input():
    """Turn the ValueErrors of costmodel.costs into BadInput, which the app answers with a 400; so too arithmetic
    that leaves float64 (a peak of 5e-324 FLOP/s times 0.5 is 0)."""
    try:
        yield
    except BadInput:
        raise
    except ValueError as e:
        raise BadInput(str(e)) from None
    except ArithmeticError:
        raise BadInput(
            "these values leave the range of float64 (a division by an underflowed 0, or an overflow); "
            "use realistic sizes"
        ) from None


def finite(body: dict) -> dict:
    """`body`, or BadInput if any number in it is inf or NaN (JSON has no such numbers)."""

    def walk(x) -> bool:
        if isinstance(x, float):
            return math.isfinite(x)
        if isinstance(x, dict):
            return all(walk(v) for v in x.values())
        if isinstance(x, list):
            return all(walk(v) for v in x)
        return True

    if not walk(body):
        raise BadInput("the result overflows float64 for these values; use realistic sizes")
    return body


DTYPES = ["float32", "bfloat16", "float16", "fp8", "int8"]
PRESET_DTYPE = "bfloat16"  # the presets' published checkpoints, and the seed's: the calculator's dtype for them


# ---- the routes --------------------------------------------------------------------------------------


def spec_named(model: str | None, loaded: ModelSpec) -> ModelSpec | None:
    """A preset by key, the server's model for 'loaded', or None for '' / None (only N known)."""
    if not model:
        return None
    if model == LOADED:
        return loaded
    if model not in PRESETS:
        raise BadInput(f"unknown model {model!r}; choose one of: {LOADED}, {', '.join(PRESETS)}")
    return PRESETS[model]


def kv_body(spec: ModelSpec, P: int, dtype: str, B: int = 1, symbol: str = "P") -> dict:
    """KV-cache bytes of `spec` holding P positions, with the formula written out (the length named `symbol`: P
    after prefill, S = P + n - 1 after n answer tokens, the last one's K/V never written) and the per-layer shape."""
    b = costs.kv_bytes_per_element(dtype)
    n = costs.kv_cache_bytes_for(spec, P, b, B)
    return {
        "bytes": n,
        "per_token": costs.kv_cache_bytes_for(spec, 1, b, B),
        "text": costs.format_bytes(n),
        "mib": costs.bytes_to_mib(n),
        "mb": costs.bytes_to_mb(n),
        "shape": [B, spec.H_kv, P, spec.d_head],
        "L": spec.L,
        "formula": f"2 · L · B · H_kv · {symbol} · d_head · b = 2 · {spec.L} · {B} · {spec.H_kv} · {P:,} · "
        f"{spec.d_head} · {b:g} = {n:,} B",
    }


def roof_points(peak: float, bandwidth: float, lo: int = -1, hi: int = 5) -> dict:
    """The roof min(peak, intensity x bandwidth) at 8 intensities a decade from 10**lo to 10**hi FLOP/B and at the
    ridge point, for drawing: a line through the samples alone would cut the corner, bending off the ridge."""
    ridge = roofline.ridge_point(peak, bandwidth)
    grid = {10 ** (k / 8) for k in range(8 * lo, 8 * hi + 1)}
    xs = sorted(grid | {ridge} if 10**lo <= ridge <= 10**hi else grid)
    return {"intensity": xs, "flops_per_s": [roofline.attainable_flops_per_s(x, peak, bandwidth) for x in xs]}


def roofline_body(rf: Roofline, peak: float) -> dict:
    """The estimate's roofline (this prefill and one decode step against the ridge point) and the roof's points."""
    bandwidth = rf.bandwidth_bytes_per_s
    return {
        "prefill_intensity": rf.prefill_intensity,
        "decode_intensity": rf.decode_intensity,
        "ridge": rf.ridge_point,
        "prefill_bound": rf.prefill_bound,
        "decode_bound": rf.decode_bound,
        "prefill_attainable": rf.prefill_attainable_flops_per_s,
        "decode_attainable": rf.decode_attainable_flops_per_s,
        "compute_bound_from_P": rf.compute_bound_from_P,
        "roof": roof_points(peak, bandwidth),  # 0.1 .. 1e5 FLOP/B
        "peak": peak,
        "bandwidth": bandwidth,
    }


class AnswerBody(BaseModel):
    """A typed answer to one of the lesson's questions; reveal asks for the answer itself."""

    model_config = ConfigDict(extra="forbid")
    question: Literal["flops", "seconds", "pairs"]
    answer: StrictStr = Field("", max_length=200)
    reveal: StrictBool = False


router = APIRouter(prefix="/api", tags=["lesson: calculator"])
MODELS = ["", LOADED, *PRESETS]  # what `model` may name: N only, the server's own model, or a preset


@router.get("/catalog")
def catalog(request: Request) -> dict:
    """Hardware (datasheet peaks and bandwidth), model presets, dtypes, and the server's own model."""
    lesson = lesson_of(request)
    loaded = lesson.spec
    hardware = [
        {
            "key": k,
            "name": h.name,
            "peak_flops": h.peak_flops,
            "bandwidth": h.bandwidth_bytes_per_s,
            "memory": h.memory_bytes,
        }
        for k, h in HARDWARE.items()
    ]
    models = [
        {"key": k, "name": s.name, "N": s.N, "L": s.L, "H_q": s.H_q, "H_kv": s.H_kv, "d_head": s.d_head}
        | {"dtype": PRESET_DTYPE}
        for k, s in PRESETS.items()
    ]
    own = {
        "key": LOADED,
        "name": loaded.name,
        "N": loaded.N,
        "L": loaded.L,
        "H_q": loaded.H_q,
        "H_kv": loaded.H_kv,
        "d_head": loaded.d_head,
        "dtype": lesson.dtype,
        "weights": lesson.engine.weights,
        "path": lesson.engine.path_label,  # the one label of the path that runs (the header's)
        "model_id": lesson.model_id,
        "context_length": loaded.context_length,
    }
    return {"hardware": hardware, "models": models, "dtypes": ["float32", "bfloat16", "float16", "fp8"], "loaded": own}


@router.get("/estimate")
def estimate(
    request: Request,
    N: float = Query(7e9, description="parameters, e.g. 7e9", json_schema_extra=limits("N")),
    P: int = Query(1000, description="prompt tokens", json_schema_extra=limits("P")),
    n: int = Query(1, description="answer tokens (the KV cache after decode)", json_schema_extra=limits("n")),
    peak: float = Query(1e14, description="peak FLOP/s", json_schema_extra=limits("peak")),
    mfu: float = Query(0.5, description="utilisation of the peak", json_schema_extra=limits("mfu")),
    bandwidth: float = Query(
        2e12,
        description="memory bandwidth, bytes/s (for compute- or memory-bound)",
        json_schema_extra=limits("bandwidth"),
    ),
    model: str = Query(
        "", description="a preset key, 'loaded', or empty for N only", json_schema_extra={"enum": MODELS}
    ),
    dtype: str = Query(
        PRESET_DTYPE, description="bytes per element of weights and KV cache", json_schema_extra={"enum": DTYPES}
    ),
) -> dict:
    """Prefill FLOPs (2·N·P and exact), seconds, KV-cache bytes and the roofline at one setting."""
    for name, value in (("N", N), ("P", P), ("n", n), ("peak", peak), ("mfu", mfu), ("bandwidth", bandwidth)):
        in_words(name, value)
    with bad_input():
        spec = spec_named(model, lesson_of(request).spec)
        machine = {"peak_flops_per_s": peak, "mfu": mfu, "bandwidth_bytes_per_s": bandwidth}
        est = build_estimate(Setting(P=P, spec=spec, N=N, dtype=dtype, **machine))
        rate = est.achieved_flops_per_s
        body = {
            "N": est.N,
            "P": P,
            "peak": peak,
            "mfu": mfu,
            "effective_flops_per_s": rate,
            "flops": est.flops_2NP,
            "seconds": est.prefill_s_2NP,
            "lines": seed_lines(est.N, P, est.flops_2NP, rate, est.prefill_s_2NP),
            "human": {
                "flops": human(est.flops_2NP, "FLOP"),
                "seconds": human(est.prefill_s_2NP, "s"),
                "effective": human(rate, "FLOP/s"),
            },
            "exact": exact_body(est) if est.exact else None,
            "kv": kv_body(spec, P, dtype) if spec is not None else None,
            "kv_decoded": kv_body(spec, P + n - 1, dtype, symbol="S") if spec is not None else None,
            "roofline": roofline_body(est.roofline, peak),
        }
    return finite(body)


def exact_body(est: Estimate) -> dict:
    """The exact FLOP count of the estimate's prefill (linear, causal attention, one unembedding) and its seconds."""
    count, exact_s, spec = est.exact, est.prefill_s_exact, est.setting.spec
    return {
        "model": spec.name,
        "N": spec.N,
        "linear": count.linear,
        "attention": count.attention,
        "unembed": count.unembed,
        "total": count.total,
        "seconds": exact_s,
        "human": {
            "total": human(count.total, "FLOP"),
            "seconds": human(exact_s, "s"),
            "attention": human(count.attention, "FLOP"),
            "unembed": human(count.unembed, "FLOP"),
        },
    }


@router.get("/mask")
def mask(P: int = Query(5, description="prompt tokens", json_schema_extra=limits("mask_P"))) -> dict:
    """The causal mask as rows of '1' (may attend) and '0' (masked), with the pair counts. Past MAX_MASK_P tokens
    it is scaled to at most MAX_MASK_P cells a side, each `scale` x `scale` tokens ('d' on the diagonal: part of
    its pairs may attend), so a long prompt's mask is drawn too."""
    RANGES["mask_P"].check("P", P)
    pairs, scale = causal_pairs(P), max(1, -(-P // MAX_MASK_P))
    rows = causal_blocks(P, scale)  # scale 1: the pair-by-pair mask, [P, P]
    caption = f"{plural(pairs, 'pair')} for {plural(P, 'token')}" + (
        f", each cell {scale} x {scale} tokens" if scale > 1 else ""
    )
    return {"P": P, "allowed": pairs, "masked": P * P - pairs, "rows": rows, "scale": scale, "caption": caption}


@router.get("/kv")
def kv(
    request: Request,
    P: int = Query(1000, description="tokens held", json_schema_extra=limits("P")),
    model: str = Query(LOADED, description="a preset key or 'loaded'", json_schema_extra={"enum": MODELS}),
    dtype: str = Query(
        "",
        description="element type (default: the loaded model's, else bfloat16)",
        json_schema_extra={"enum": ["", *DTYPES]},
    ),
    B: int = Query(1, description="sequences", json_schema_extra=limits("B")),
    symbol: Literal["P", "S"] = Query("P", description="the length's name in the formula: P, or S after decode"),
) -> dict:
    """KV-cache bytes after P tokens: 2·L·B·H_kv·P·d_head·b, written out, and the per-layer shape."""
    RANGES["P"].check("P", P)
    RANGES["B"].check("B", B)
    lesson = lesson_of(request)
    with bad_input():
        spec = spec_named(model or LOADED, lesson.spec)
        own = model in ("", LOADED) and lesson.dtype
        return kv_body(spec, P, dtype or (own or "bfloat16"), B, symbol)


@router.get("/request")
def request_time(
    ttft: float = Query(0.2, description="time to first token, seconds", json_schema_extra=limits("ttft")),
    itl: float = Query(0.05, description="inter-token latency, seconds", json_schema_extra=limits("itl")),
    n: int = Query(5, description="output tokens", json_schema_extra=limits("n")),
) -> dict:
    """The chapter's worked example: request time TTFT + (n−1)·ITL, decode rate 1/ITL, output rate n/time."""
    for name, value in (("ttft", ttft), ("itl", itl), ("n", n)):
        in_words(name, value)
    with bad_input():
        r = estimate_request_time(ttft, n, itl)
        total, decode, output = r.request_s, r.decode_rate, r.output_rate
    lines = {
        "request": f"{ttft:.2f} + {n - 1} × {itl:.2f} = {total:.2f} s",
        "decode": f"1 / {itl:.2f} = {decode:.3g} tokens/s",
        "output": f"{n} / {total:.2f} = {output:.3g} tokens/s",
    }
    return finite({"request_s": total, "decode_rate": decode, "output_rate": output, "lines": lines})


@router.get("/exercise")
def exercise() -> dict:
    """The coding exercise's skeleton, as `prefill exercise` writes it (the page shows it; nothing runs here)."""
    return {
        "functions": list(FUNCTIONS),
        "skeleton": skeleton(),
        "write": "prefill exercise",
        "check": "prefill exercise check prefill_exercise.py",
    }


@router.post("/answer")
def answer(body: AnswerBody) -> dict:
    """Check a typed answer ('1.4e13', '14e12', '1.4 × 10^13', '14 TFLOP', '280 ms' all read): right, or a hint
    until reveal."""
    v = check_answer(body.question, body.answer, body.reveal)
    return {"correct": v.correct, "message": v.message, "answer": v.answer}
