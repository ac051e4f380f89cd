"""One verdict for the whole page: whether a prefill is compute-, memory- or overhead-bound, where it sits against
this machine's ridge point, and what its weights are, all from one time-model Prediction on the engine's machine
profile (the path the server runs: its weights as stored, its activation dtype, its prefill chunks).

The live prefill, the P sweep's points and its summary all read verdict_body, so the page cannot say
"compute-bound" in one place and "memory-bound" in another for the same forward. The roof drawn is
min(profile peak, intensity x profile bandwidth); the verdict is the time model's dominant part, which reads the
GEMM rates measured at the forward's own shapes. Where the two disagree (a short prompt's GEMMs run far below the
peak, so compute sets the time left of the ridge) the words say so with the rate that explains it.
"""

from __future__ import annotations

from prefill.costmodel import roofline
from prefill.costmodel.profile import MachineProfile
from prefill.costmodel.timemodel import Prediction
from prefill.engine.llm import Engine
from prefill.lesson.words import human

MAX_TURN_P = 1 << 20  # the longest prompt the turn to compute-bound is looked for up to


def weights_words(engine: Engine, pred: Prediction) -> str:
    """What one forward reads and computes in: '84 MB of Q8_0 + Q4_1 blocks, float32 activations, float32 K/V'
    (GGUF blocks kept native; '8-bit activations' where their products round them so) or '538 MB of float32
    weights, float32 activations, float32 K/V': the precision is Engine.precision, as the header's path label."""
    dense = not engine.weight_types()  # no GEMM weight kept as GGUF blocks
    what = f"{engine.weights} weights" if dense else f"{engine.weights} blocks"
    return f"{human(pred.weights_per_forward, 'B')} of {what}, {engine.precision}"


def compute_bound_from_P(engine: Engine, profile: MachineProfile, chunk_size: int | None = None) -> int | None:
    """The shortest prompt whose predicted prefill (in the server's chunks) is compute-bound, by doubling then
    bisection up to the model's context (None if none is). The time model's dominant part decides, as for every
    verdict on the page."""
    top = min(engine.spec.context_length - 1, MAX_TURN_P)

    def compute(P: int) -> bool:
        return engine.predict_prefill(P, 0, chunk_size, profile=profile).dominant == "compute"

    hi = 1
    while not compute(hi):
        if hi >= top:
            return None
        hi = min(2 * hi, top)
    lo = hi // 2  # not compute-bound at lo (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute(mid) else (mid, hi)
    return hi


def verdict_body(
    engine: Engine, pred: Prediction, profile: MachineProfile, turn_P: int | None, measured_s: float | None = None
) -> dict:
    """The page's one verdict on a forward: its bound, FLOP/B against the ridge (profile peak / bandwidth), the
    FLOP/s predicted and (given measured_s, seconds) measured, the weights, the turn to compute-bound, and a
    sentence saying all of it."""
    peak, bandwidth = profile.peak_flops_per_s, profile.bandwidth_bytes_per_s
    ridge = roofline.ridge_point(peak, bandwidth)
    intensity = pred.flops / pred.bytes  # FLOP per byte moved, as the time model counts both
    bound = f"{pred.dominant}-bound"
    side = "right of" if intensity >= ridge else "left of"
    words = f"{bound}: {intensity:.1f} FLOP/B, {side} the ridge {ridge:.1f} FLOP/B"
    if pred.dominant == "compute" and intensity < ridge:
        ops, seconds = pred.dominant_work()
        rate = sum(o.flops for o in ops) / seconds
        words += (
            f", yet its GEMMs run at {human(rate, 'FLOP/s')} at these shapes (the ridge assumes the "
            f"{human(peak, 'FLOP/s')} peak), so its FLOPs still take longer than its bytes"
        )
    elif pred.dominant == "memory" and intensity >= ridge:
        words += ", yet its bytes move slower than the bandwidth at these shapes, so memory sets the time"
    body = {
        "bound": bound,
        "dominant": pred.dominant,
        "intensity": intensity,
        "ridge": ridge,
        "peak_flops_per_s": peak,
        "bandwidth_bytes_per_s": bandwidth,
        "predicted_flops_per_s": pred.flops / pred.seconds,
        "measured_flops_per_s": None if measured_s is None else pred.flops / measured_s,
        "weights": weights_words(engine, pred),
        "compute_bound_from_P": turn_P,
        "words": words,
    }
    if turn_P is not None:
        body["turn"] = f"on this machine a prefill is compute-bound from P = {turn_P:,} tokens"
    return body
