"""The lesson page's P sweep: where prefill turns compute-bound on this machine, measured beside the time model.

GET /api/sweep/curve: the time model's prefill (one forward of P tokens, unchunked) over a log grid of P, with the
roof of this machine's profile. POST /api/sweep/measure {"P": 64}: one warm prefill of P tokens on the server's
model, timed on the worker thread (between two steps of the serving loop, which waits for it: 2 to 4 forwards),
beside its prediction and a plain-words note on what sets its time. Every number comes from
prefill.costmodel.timemodel's Prediction; the page draws them.
"""

from __future__ import annotations

import math
from functools import partial

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from prefill.bench.warm import timed_repeats, warm_prefill
from prefill.costmodel import roofline
from prefill.costmodel.profile import MachineProfile
from prefill.costmodel.specs import ModelSpec
from prefill.costmodel.timemodel import Prediction
from prefill.engine.llm import Engine
from prefill.lesson.api import finite, roof_points
from prefill.lesson.limits import in_range
from prefill.lesson.regime import regime_words
from prefill.lesson.state import lesson_of
from prefill.lesson.verdict import compute_bound_from_P, verdict_body, weights_words
from prefill.lesson.words import human
from prefill.server.openai_schema import int_in

MEASURE_P = (1, 4, 16, 64, 256, 1024)  # what the page measures: a forward of 1024 tokens is ~2 s on 2 cores
MAX_CURVE_P = 8192
CURVE_POINTS = 30
REPEATS = 3  # timed forwards after the untimed one, at most; the answer is their median
BUDGET_S = 3.0  # fewer timed forwards where 3 would take longer (P = 1,024: one; a student waits for each)
router = APIRouter(prefix="/api/sweep", tags=["lesson: P sweep"])


class MeasureBody(BaseModel):
    """Which prompt length to prefill and time (at most 1024 tokens, and fewer than the model's context)."""

    model_config = ConfigDict(extra="forbid")
    P: int_in(ge=1, le=MEASURE_P[-1]) = Field(description="prompt tokens (an integer-valued number, 491.0, is one)")


def most_measured(spec: ModelSpec) -> int:
    """The longest prompt /api/sweep/measure prefills: MEASURE_P's last, and fewer tokens than the context."""
    return min(MEASURE_P[-1], spec.context_length - 1)


def document_measure(doc: dict, spec: ModelSpec) -> None:
    """Write most_measured into the OpenAPI document as the bound of MeasureBody's P (known once the model is)."""
    doc["components"]["schemas"][MeasureBody.__name__]["properties"]["P"]["maximum"] = most_measured(spec)


def measured_lengths(context: int) -> list[int]:
    """The P the page measures, below the context length (a forward of P needs P + 1 positions at most)."""
    return [n for n in MEASURE_P if n < context]


def curve_lengths(context: int) -> list[int]:
    """About CURVE_POINTS prompt lengths spaced evenly in log P from 1 to min(context, MAX_CURVE_P), and the
    measured ones (so each measured point has its predicted twin)."""
    top = min(context, MAX_CURVE_P)
    grid = {round(top ** (k / (CURVE_POINTS - 1))) for k in range(CURVE_POINTS)}
    return sorted(grid | set(measured_lengths(context)))


def point(P: int, pred: Prediction) -> dict:
    """One P of the curve: the prediction's seconds, FLOPs, bytes and where it sits on the roofline."""
    return {
        "P": P,
        "predicted_s": pred.seconds,
        "flops": pred.flops,
        "bytes": pred.bytes,
        "intensity": pred.flops / pred.bytes,  # FLOP per byte moved, as the time model counts both
        "attainable_flops_per_s": pred.flops / pred.seconds,
        "dominant": pred.dominant,
    }


def regime_note(
    P: int, pred: Prediction, measured_s: float, weights: str, profile: MachineProfile, repeats: int = REPEATS
) -> str:
    """What sets a prefill's time, in plain words, with the prediction's own numbers, and how it was measured."""
    how = (
        f"Measured warm: one untimed forward first, then {timed_words(repeats)}: {human(measured_s, 's')}, "
        f"predicted {human(pred.seconds, 's')}."
    )
    return f"P = {P:,}: {regime_words(pred, measured_s, weights, profile)}. {how}"


def curve_summary(engine: Engine, profile: MachineProfile, turn: int | None) -> str:
    """The curve in two sentences, its words chosen by its own numbers: a 3- and a 30-token prompt's predicted
    times and their ratio beside the FLOPs' ratio, and the P from which the page's verdict is compute-bound."""
    short, longer = engine.predict_prefill(3, profile=profile), engine.predict_prefill(30, profile=profile)
    flops, time = longer.flops / short.flops, longer.seconds / short.seconds
    why = (
        f"far less than in proportion: every forward reads all its weights ({weights_words(engine, short)}) "
        "however few its tokens, and all of them share that reading"
        if time < flops / 2
        else "nearly in proportion: the FLOPs set the time already"
    )
    turn_words = f" From P = {turn:,} the page's verdict is compute-bound." if turn else " No P here is compute-bound."
    return (
        f"Predicted on this machine: a 3-token prompt takes {human(short.seconds, 's')}, a 30-token one "
        f"{human(longer.seconds, 's')}: {flops:.2g} times the FLOPs for {time:.2g} times the time, {why}." + turn_words
    )


def timed_words(repeats: int) -> str:
    return "one timed forward" if repeats == 1 else f"the median of {repeats}"


@router.get("/curve")
async def curve(request: Request) -> dict:
    """The time model's prefill of one forward of P tokens over a log grid of P on this machine's profile (probed
    on the worker thread on first need), the roof (min of the profile's peak and intensity x bandwidth), the
    ridge, the P the page measures, and the seconds measuring them takes (2 to 4 forwards each, predicted)."""
    lesson = lesson_of(request)
    engine, context = lesson.engine, lesson.spec.context_length
    profile = await lesson.profile()
    points = [point(P, engine.predict_prefill(P, profile=profile)) for P in curve_lengths(context)]
    peak, bandwidth = profile.peak_flops_per_s, profile.bandwidth_bytes_per_s
    ridge = roofline.ridge_point(peak, bandwidth)
    intensities = [p["intensity"] for p in points] + [ridge]
    lo, hi = math.floor(math.log10(min(intensities))), math.ceil(math.log10(max(intensities)))
    by_P = {p["P"]: p for p in points}
    measure, total = [], 0.0
    for P in measured_lengths(context):
        total += (1 + timed_repeats(by_P[P]["predicted_s"], REPEATS, BUDGET_S)) * by_P[P]["predicted_s"]
        measure.append({"P": P, "predicted_s": by_P[P]["predicted_s"], "sweep_s": total, "sweep": human(total, "s")})
    turn = compute_bound_from_P(engine, profile, lesson.chunk_size)
    summary = curve_summary(engine, profile, turn)
    return finite(
        {
            "model": lesson.spec.name,
            "dtype": lesson.dtype,
            "profile": {"name": profile.name, "kind": profile.kind, "source": profile.source},
            "peak_flops_per_s": peak,
            "bandwidth_bytes_per_s": bandwidth,
            "ridge": ridge,
            "roof": roof_points(peak, bandwidth, lo, hi),
            "points": points,
            "measure": measure,
            "measure_P": [m["P"] for m in measure],
            "compute_bound_from_P": turn,
            "summary": summary,
            "human": {"peak": human(peak, "FLOP/s"), "bandwidth": human(bandwidth, "B/s")},
        }
    )


@router.post("/measure")
async def measure(request: Request, body: MeasureBody) -> dict:
    """A warm prefill of P tokens on the server's model, timed on the worker thread (one untimed forward, then the
    median of up to 3 that fit in BUDGET_S), beside the time model's prediction; error = predicted / measured - 1."""
    lesson = lesson_of(request)
    P = int(in_range("P", body.P, 1, most_measured(lesson.spec)))
    profile = await lesson.profile()
    pred = lesson.engine.predict_prefill(P, profile=profile)
    turn = compute_bound_from_P(lesson.engine, profile, lesson.chunk_size)
    warm = await lesson.run(partial(warm_prefill, lesson.engine, P, REPEATS, budget_s=BUDGET_S))
    measured_s = warm.seconds
    error = pred.seconds / measured_s - 1
    return finite(
        {
            **point(P, pred),
            "measured_s": measured_s,
            "error": error,
            "measured_flops_per_s": pred.flops / measured_s,
            "predicted_flops_per_s": pred.flops / pred.seconds,
            "explain": pred.explain(),
            "note": regime_note(P, pred, measured_s, weights_words(lesson.engine, pred), profile, warm.repeats),
            "verdict": verdict_body(lesson.engine, pred, profile, turn, measured_s),
            "repeats": warm.repeats,
            "human": {
                "measured": human(measured_s, "s"),
                "predicted": human(pred.seconds, "s"),
                "error": f"{error:+.0%}",
            },
        }
    )
