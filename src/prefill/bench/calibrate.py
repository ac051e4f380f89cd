"""Fit this machine's prefill efficiency from measurements, then predict every other prompt length.

The model (prefill.costs.calibrated_prefill_seconds) has three unknowns:

    t(P) = overhead_s + (linear + unembed) / R_lin + attention / R_attn

Two prompt lengths give two totals, one equation short. The third comes from inside the same calls: a
profiled run of each calibration prompt measures the share of its time spent in the attention kernel
(`scaled_dot_product_attention`), so each length contributes two equations,

    t_i        = overhead_s + lin_i / R_lin + attn_i / R_attn
    s_i * t_i  =                              attn_i / R_attn       (s_i: measured attention share)

four equations for three unknowns, solved by least squares with each row scaled by 1/t_i so that a short
and a long prompt weigh the same in relative terms. With three or more lengths the shares are optional.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from prefill.costs import Calibration, FlopCount, calibrated_prefill_seconds
from prefill.errors import BadInput

# Profiler op names of the attention kernel; matched as substrings, counted at their outermost occurrence.
ATTENTION_OPS = ("scaled_dot_product_attention", "flash_attention")


@dataclass(frozen=True)
class Observation:
    """One measured prompt length: its exact FLOPs, median seconds, and (optionally) its attention share."""

    P: int
    count: FlopCount
    seconds: float
    attention_share: float | None = None  # fraction 0..1 of the call's time inside attention


@dataclass(frozen=True)
class PredictionRow:
    """Predicted beside measured seconds for one prompt length; error in percent of the measurement."""

    P: int
    measured_s: float
    predicted_s: float
    fitted: bool  # True when this length was used for the fit

    @property
    def error_pct(self) -> float:
        """(predicted - measured) / measured, in percent."""
        return 100.0 * (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class CalibrationReport:
    """A fitted calibration and how well it predicts every measured point."""

    calibration: Calibration
    rows: tuple[PredictionRow, ...]

    @property
    def fitted_on(self) -> tuple[int, ...]:
        """Prompt lengths used for the fit."""
        return tuple(r.P for r in self.rows if r.fitted)

    @property
    def mape_pct(self) -> float:
        """Mean absolute percentage error over every point, percent."""
        return mape_pct(self.rows)

    @property
    def holdout_mape_pct(self) -> float | None:
        """Mean absolute percentage error over the points not used for the fit, percent (None if none)."""
        held = [r for r in self.rows if not r.fitted]
        return mape_pct(held) if held else None


def mape_pct(rows: Sequence[PredictionRow]) -> float:
    """Mean of |error_pct| over `rows`, percent."""
    if not rows:
        raise BadInput("MAPE of no points: measure at least one prompt length")
    return statistics.fmean(abs(r.error_pct) for r in rows)


def fit_calibration(
    observations: Sequence[Observation], *, dtype: str, threads: int, source: str = "prefill bench --calibrate"
) -> Calibration:
    """Least-squares fit of overhead (s), linear FLOP/s and attention FLOP/s to `observations`."""
    _check_determined(observations)
    rows: list[list[float]] = []
    targets: list[float] = []
    for ob in observations:
        if ob.seconds <= 0:
            raise BadInput(f"measured time at P={ob.P} is {ob.seconds} s: it must be positive")
        w = 1.0 / ob.seconds
        rows.append([w, (ob.count.linear + ob.count.unembed) * w, ob.count.attention * w])
        targets.append(1.0)
        if ob.attention_share is not None:
            rows.append([0.0, 0.0, ob.count.attention * w])
            targets.append(ob.attention_share)
    overhead, inv_lin, inv_attn = _solve_nonnegative_overhead(np.array(rows), np.array(targets))
    if inv_lin <= 0 or inv_attn <= 0:
        raise BadInput(
            "the measurements do not determine positive linear and attention rates: "
            "calibrate on prompt lengths further apart (e.g. 512 and 4096)"
        )
    return Calibration(
        overhead_s=overhead,
        linear_flops_per_s=1.0 / inv_lin,
        attention_flops_per_s=1.0 / inv_attn,
        dtype=dtype,
        threads=threads,
        source=source,
    )


def report(cal: Calibration, measured: Sequence[Observation], fitted_on: Sequence[int]) -> CalibrationReport:
    """Predict every measured point with `cal`; mark the ones in `fitted_on`."""
    rows = tuple(
        PredictionRow(
            P=ob.P,
            measured_s=ob.seconds,
            predicted_s=calibrated_prefill_seconds(ob.count, cal),
            fitted=ob.P in fitted_on,
        )
        for ob in measured
    )
    return CalibrationReport(calibration=cal, rows=rows)


def attention_share(fn: Callable[[], object], device: str = "cpu", ops: Sequence[str] = ATTENTION_OPS) -> float:
    """Run `fn()` once under torch.profiler; the fraction of its wall time spent inside attention ops.

    Outermost matching ops are summed, so an SDPA call and the kernel it dispatches to count once.
    Raises BadInput when no attention op ran (an engine that does not call SDPA cannot be split this way).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    prof = profile(activities=activities)
    with _quiet_stderr():  # the profiler's C++ side prints start/stop lines to fd 2
        prof.start()
    try:
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    finally:
        with _quiet_stderr():
            prof.stop()
    attn_us = 0.0
    for ev in prof.events():
        if _matches(ev.name, ops) and not _has_matching_parent(ev, ops):
            attn_us += ev.device_time_total if device.startswith("cuda") else ev.cpu_time_total
    if attn_us <= 0:
        raise BadInput(f"no attention op ({', '.join(ops)}) ran: cannot split the time by profiling")
    return min(1.0, attn_us / wall_us)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _matches(name: str, ops: Sequence[str]) -> bool:
    return any(op in name for op in ops)


def _has_matching_parent(ev: object, ops: Sequence[str]) -> bool:
    parent = getattr(ev, "cpu_parent", None)
    while parent is not None:
        if _matches(parent.name, ops):
            return True
        parent = getattr(parent, "cpu_parent", None)
    return False


def _check_determined(observations: Sequence[Observation]) -> None:
    lengths = {ob.P for ob in observations}
    with_share = {ob.P for ob in observations if ob.attention_share is not None}
    if len(lengths) >= 3 or (len(lengths) == 2 and with_share):
        return
    raise BadInput(
        f"calibration needs two prompt lengths with a profiled attention share, or three lengths; "
        f"got lengths {sorted(lengths)} with shares at {sorted(with_share)}"
    )


def _solve_nonnegative_overhead(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    # A negative overhead is unphysical: if the free fit gives one, refit with overhead pinned to zero.
    x, *_ = np.linalg.lstsq(a, b, rcond=None)
    if x[0] < 0:
        x_rates, *_ = np.linalg.lstsq(a[:, 1:], b, rcond=None)
        x = np.concatenate([[0.0], x_rates])
    return float(x[0]), float(x[1]), float(x[2])
