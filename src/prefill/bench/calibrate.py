"""Fit this machine's prefill efficiency from measurements, then predict every other prompt length.

The model (prefill.costmodel.costs.calibrated_prefill_seconds) has three unknowns:

    t = overhead_s + (linear + unembed) / R_lin + attention / R_attn

Two prompt lengths give two plain prefills, one equation short. The third comes from the same prompts,
through the engine's own KV cache: at each calibration length P we also time the second half of the prompt
prefilled after the first half is cached. That call does half the linear FLOPs but three quarters of the
attention FLOPs (P/2 * P/2 cached pairs + the causal triangle of P/2), so it separates the two rates without
a third prompt length and without looking inside the engine. Every row of the least-squares fit is scaled by
1/t, so a short and a long prompt weigh the same in relative terms.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prefill.costmodel.costs import Calibration, FlopCount, calibrated_prefill_seconds
from prefill.errors import BadInput


@dataclass(frozen=True)
class Observation:
    """One timed prefill: P new tokens after `past` cached ones, its exact FLOPs and median seconds."""

    P: int
    count: FlopCount
    seconds: float
    past: int = 0


@dataclass(frozen=True)
class PredictionRow:
    """Predicted beside measured seconds for one prefill; error in percent of the measurement."""

    P: int
    measured_s: float
    predicted_s: float
    fitted: bool  # True when this measurement was used for the fit
    past: int = 0

    @property
    def error_pct(self) -> float:
        """(predicted - measured) / measured, in percent."""
        return 100.0 * (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class CalibrationReport:
    """A fitted calibration and how well it predicts every measured prefill."""

    calibration: Calibration
    rows: tuple[PredictionRow, ...]

    @property
    def sweep(self) -> tuple[PredictionRow, ...]:
        """Rows of whole-prompt prefills (no cached prefix): the benchmark's sweep."""
        return tuple(r for r in self.rows if r.past == 0)

    @property
    def fitted_on(self) -> tuple[int, ...]:
        """Prompt lengths the fit used."""
        return tuple(r.P for r in self.sweep if r.fitted)

    @property
    def mape_pct(self) -> float:
        """Mean absolute percentage error over the whole sweep, percent."""
        return mape_pct(self.sweep)

    @property
    def holdout_mape_pct(self) -> float | None:
        """Mean absolute percentage error over the sweep's points not used for the fit (None if none)."""
        held = [r for r in self.sweep if not r.fitted]
        return mape_pct(held) if held else None


def mape_pct(rows: Sequence[PredictionRow]) -> float:
    """Mean of |error_pct| over `rows`, percent."""
    if not rows:
        raise BadInput("MAPE of no points: measure at least one prompt length")
    return statistics.fmean(abs(r.error_pct) for r in rows)


def fit_calibration(
    observations: Sequence[Observation], *, dtype: str, threads: int, source: str = "prefill bench --calibrate"
) -> Calibration:
    """Least-squares fit of overhead (s), linear FLOP/s and attention FLOP/s to `observations`.

    Needs observations whose (linear, attention) mixes differ in three independent ways, e.g. two prompt
    lengths plus one cached-prefix prefill, or three prompt lengths; BadInput otherwise.
    """
    for ob in observations:
        if not ob.seconds > 0:
            raise BadInput(f"measured time at P={ob.P} is {ob.seconds} s: it must be positive")
    a = np.array([[1.0, ob.count.linear + ob.count.unembed, ob.count.attention] for ob in observations])
    a /= np.array([[ob.seconds] for ob in observations])  # relative error: each row divided by its time
    if len(observations) < 3 or np.linalg.matrix_rank(a / np.abs(a).max(axis=0)) < 3:
        raise BadInput(
            "calibration needs three independent measurements (two prompt lengths and a cached-prefix "
            f"prefill, or three lengths); got {len(observations)}"
        )
    overhead, inv_lin, inv_attn = _solve_nonnegative_overhead(a, np.ones(len(observations)))
    if inv_lin <= 0 or inv_attn <= 0:
        raise BadInput(
            "the measurements do not determine positive linear and attention rates (too noisy?): "
            "calibrate on prompt lengths further apart (e.g. 128 and 4096) on an idle machine"
        )
    return Calibration(
        overhead_s=overhead,
        linear_flops_per_s=1.0 / inv_lin,
        attention_flops_per_s=1.0 / inv_attn,
        dtype=dtype,
        threads=threads,
        source=source,
    )


def report(cal: Calibration, measured: Sequence[Observation], fitted: Sequence[Observation]) -> CalibrationReport:
    """Predict every measured prefill with `cal`; mark the ones in `fitted`."""
    used = {(ob.P, ob.past) for ob in fitted}
    rows = tuple(
        PredictionRow(
            P=ob.P,
            measured_s=ob.seconds,
            predicted_s=calibrated_prefill_seconds(ob.count, cal),
            fitted=(ob.P, ob.past) in used,
            past=ob.past,
        )
        for ob in measured
    )
    return CalibrationReport(calibration=cal, rows=rows)


def _solve_nonnegative_overhead(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    # Columns differ by ~1e12 in scale: solve on unit-scaled columns, then scale back.
    scale = np.abs(a).max(axis=0)
    x, *_ = np.linalg.lstsq(a / scale, b, rcond=None)
    x = x / scale
    if x[0] < 0:  # a negative overhead is unphysical: refit with the overhead pinned to zero
        x_rates, *_ = np.linalg.lstsq(a[:, 1:] / scale[1:], b, rcond=None)
        x = np.concatenate([[0.0], x_rates / scale[1:]])
    return float(x[0]), float(x[1]), float(x[2])
