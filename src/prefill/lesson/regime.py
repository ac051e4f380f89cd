"""What sets a prefill's time, in plain words: the lesson's sentences for a measured prefill beside its prediction
(the P sweep's points and the live view's prompt), every number from the time model's Prediction."""

from __future__ import annotations

import os

from prefill.costmodel import costs
from prefill.costmodel.profile import MachineProfile
from prefill.costmodel.timemodel import Prediction
from prefill.lesson.words import human, plural, short_sci


def regime_words(pred: Prediction, measured_s: float, weights: str, profile: MachineProfile) -> str:
    """The part that sets the prefill's time (compute, memory or overhead: the page's one verdict, as
    prefill.lesson.verdict says it), with the prediction's own FLOPs, bytes and seconds; `weights` says what a
    forward reads ('84 MB of Q8_0 + Q4_1 blocks, float32 activations'); when memory sets the time, also what its
    FLOPs alone (the 2·N·P view) would take."""
    parts = pred.parts()  # seconds the compute, memory and overhead sides add to the prediction
    side, side_s = pred.dominant_work()
    flops = pred.flops
    overhead = f"; per-operation overhead adds {human(parts['overhead'], 's')}" if parts["overhead"] else ""
    if pred.dominant == "memory":  # the rate its ops move bytes at, as measured at their shapes (not the peak)
        moved = sum(o.bytes for o in side)
        peak_s = costs.compute_seconds(flops, profile.peak_flops_per_s)
        return (
            f"memory-bound: every forward reads all its weights, however short the prompt ({weights}); its "
            f"operations move {human(moved, 'B')} at {human(moved / side_s, 'B/s')} at these "
            f"shapes ({human(parts['memory'], 's')}){overhead}. Its {short_sci(flops)} FLOPs alone (the 2·N·P "
            f"view) would take {human(peak_s, 's')} at the peak GEMM rate ({human(profile.peak_flops_per_s, 'FLOP/s')})"
        )
    if pred.dominant == "compute":
        side_flops = sum(o.flops for o in side)
        memory_s = sum(o.memory_s for o in pred.ops)
        return (
            f"compute-bound: {short_sci(side_flops)} FLOPs at the rates measured at these shapes take "
            f"{human(parts['compute'], 's')} ({human(side_flops / side_s, 'FLOP/s')}; "
            f"{human(flops / measured_s, 'FLOP/s')} measured over the whole forward){overhead}; moving its "
            f"{human(pred.bytes, 'B')} ({weights}) would take "
            f"{human(memory_s, 's')} at {human(profile.bandwidth_bytes_per_s, 'B/s')}: it hides under the compute"
        )
    compute_s, memory_s = sum(o.compute_s for o in pred.ops), sum(o.memory_s for o in pred.ops)
    return (
        f"overhead-bound: launching the forward's kernels ({human(parts['overhead'], 's')}) takes longer than its "
        f"FLOPs ({human(compute_s, 's')}) or its bytes ({human(memory_s, 's')})"
    )


SLOW = 0.5  # a warm prefill measured over 1 / (1 - SLOW) = 2x its prediction is explained


def slow_words(error: float, cold: bool, computed: int, itl_error: float | None) -> str:
    """Why a prefill ran far slower than predicted (error = predicted / measured - 1 below -SLOW; '' else): cold
    (its length never ran before) is one cause where it was, never the only one named; not the prefix cache (the
    prediction counts exactly the `computed` tokens); the cores shared with other work (the 1-minute load average
    says how busy they were); `itl_error` is the decode steps' error, which says whether the whole machine was slow."""
    if error > -SLOW:
        return ""
    times = 1 / (1 + error)
    first = (
        " Being cold is one cause, and maybe not the only one."
        if cold
        else f" Yet it was warm: a forward of {plural(computed, 'token')} had run before on the server's worker, so"
        " no kernel was built for it."
    )
    words = (
        f" It ran {times:.0f} times slower than predicted.{first} Nor is the prefix cache the cause: the prediction"
        f" counts exactly the {computed:,} tokens this prefill computed. The time model takes this machine's cores as"
        " free; while other programs run on them, PyTorch's threads wait for each other at every operation, so each"
        f" forward takes many times longer{load_words()}."
    )
    if itl_error is not None and itl_error <= -SLOW:
        words += (
            f" The decode steps ran {1 / (1 + itl_error):.0f} times slower than predicted too: the machine was busy,"
            " not this prefill."
        )
    return words + (
        "" if cold else " Run the prompt again when the machine is quiet: the same length is warm, near the prediction."
    )


def load_words() -> str:
    """' (the load average over the last minute: 3.2 on 2 cores, this server included)', or '' where the system
    does not say (no os.getloadavg)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return ""
    cores = os.cpu_count() or 1
    return f" (the load average over the last minute: {load:.1f} on {plural(cores, 'core')}, this server included)"
