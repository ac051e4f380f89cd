"""Fit a MachineProfile to measured forwards: the quick probe's profile in, the measured profile out.

The time model of one operation on a CPU is max(compute / g, memory x mu) + launches x o, and of a forward their
sum plus a fixed c per step (on a GPU, whose launches overlap the kernels: the larger of the work and the
launches, plus c). With the probe's profile as the base (its compute and memory seconds per operation), five
parameters remain: g_gemm and g_attention (the share of the probed GEMM and attention rates a forward reaches),
mu (memory seconds over the probe's), o (seconds per launch) and c (seconds per forward). Which side of each max
an operation is on depends on the parameters, so the fit alternates: take the sides the current parameters give,
solve the then linear least-squares problem (each sample's row divided by its measured time: relative error),
repeat until the sides stop changing, and keep the point of least error seen (the probe's own included: a step
that flips sides can land worse than it started). A rate the measurements barely reach (say, attention in short prompts
only) keeps the probe's value.

Torch-free: synthetic measurements from known parameters test it (tests/costmodel/test_fit.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prefill.costmodel.ops import Layout, Row, forward_ops
from prefill.costmodel.profile import MachineProfile
from prefill.costmodel.specs import ModelSpec
from prefill.costmodel.timemodel import extra_launches, op_time
from prefill.errors import BadInput

PARAMETERS = ("1/g_gemm", "1/g_attention", "mu", "o", "c")
_PRIOR = np.array([1.0, 1.0, 1.0, 0.0, 0.0])  # the base profile's own values, o and c filled in per fit


@dataclass(frozen=True)
class Sample:
    """One measured workload: its forwards (each a list of Rows) and the measured seconds of all of them."""

    steps: tuple[tuple[Row, ...], ...]
    seconds: float
    label: str = ""


@dataclass(frozen=True)
class FitResult:
    """The fitted profile, the fitted parameters by name, and how many alternations it took."""

    profile: MachineProfile
    parameters: dict[str, float]
    iterations: int


def _terms(spec: ModelSpec, sample: Sample, base: MachineProfile, layout: Layout) -> np.ndarray:
    """Per operation of the sample's forwards: [kind (0 gemm, 1 attention, 2 other), compute s, memory s, launches]."""
    rows = []
    for step in sample.steps:
        ops = forward_ops(spec, step, layout)
        resident = sum(o.weight_bytes * o.count for o in ops) <= base.cache_bytes
        for op in ops:
            t = op_time(op, base, resident)
            kind = {"gemm": 0, "attention": 1}.get(op.kind, 2)
            rows.append((kind, t.compute_s, t.memory_s, extra_launches(op, base) * op.count))
    return np.array(rows, dtype=float)


def _design(terms: list[np.ndarray], steps: list[int], x: np.ndarray, overlap: bool, streamed: bool) -> np.ndarray:
    """The linear system's rows for the sides that parameters x put each operation on: on a CPU a sample's time
    is the sum of its operations' larger sides plus their launches; on a GPU (launches overlapping the kernels)
    the larger of the two sums. `streamed`: GEMMs take their curve's time (MachineProfile.gemm_streams_weights)."""
    a = np.zeros((len(terms), 5))
    for i, t in enumerate(terms):
        kind, comp, mem, n = t[:, 0], t[:, 1], t[:, 2], t[:, 3]
        comp_s = comp * np.where(kind == 0, x[0], x[1])
        on_compute = (comp_s >= mem * x[2]) | ((kind == 0) & streamed)  # a streamed GEMM curve is its whole time
        launch_bound = overlap and n.sum() * x[3] > np.maximum(comp_s, mem * x[2]).sum()
        if not launch_bound:
            a[i, 0] = comp[on_compute & (kind == 0)].sum()
            a[i, 1] = comp[on_compute & (kind == 1)].sum()
            a[i, 2] = mem[~on_compute].sum()
        a[i, 3] = n.sum() if launch_bound or not overlap else 0.0
        a[i, 4] = steps[i]
    return a


REACHED = 0.01  # a rate is fitted only where it sets at least this share of some measurement's time


def _solve(a: np.ndarray, seconds: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Least squares in relative error, non-negative: a rate that sets under REACHED of every measurement keeps
    its prior, as does one the measurements would drive to zero or below (a rate cannot be infinite)."""
    w = a / seconds[:, None]
    b = np.ones(len(seconds))
    free = [j for j in range(5) if (w[:, j] * (prior[j] if j < 3 else 1)).max() > (REACHED if j < 3 else 0)]
    while True:
        fixed = [j for j in range(5) if j not in free]
        rhs = b - w[:, fixed] @ prior[fixed] if fixed else b
        scale = np.abs(w[:, free]).max(axis=0)
        sol = np.linalg.lstsq(w[:, free] / scale, rhs, rcond=None)[0] / scale
        bad = [(v, j) for v, j in zip(sol, free, strict=True) if v < 0 or (j < 3 and v <= 0)]
        if not bad:
            x = prior.copy()
            x[free] = sol
            return x
        free.remove(min(bad)[1])


def fit_profile(
    spec: ModelSpec, base: MachineProfile, layout: Layout, samples: Sequence[Sample], max_iterations: int = 50
) -> FitResult:
    """The profile whose time model best matches `samples` (relative least squares), starting from `base`."""
    if len(samples) < 5:
        raise BadInput(f"a fit of {len(PARAMETERS)} parameters needs at least 5 measurements, got {len(samples)}")
    if any(not s.seconds > 0 for s in samples):
        raise BadInput("every measured time must be positive")
    terms = [_terms(spec, s, base, layout) for s in samples]
    steps = [len(s.steps) for s in samples]
    seconds = np.array([s.seconds for s in samples])
    prior = _PRIOR.copy()
    prior[3], prior[4] = base.op_overhead_s, base.step_overhead_s

    def error(x: np.ndarray) -> float:  # the model's squared relative error at x, each operation on its side
        return float(
            ((_design(terms, steps, x, base.overlap_launches, base.gemm_streams_weights) @ x / seconds - 1) ** 2).sum()
        )

    x, sides, iterations = prior.copy(), None, 0
    best = (error(x), x)  # an alternation can end worse than it began (sides flip): keep the best point seen
    while iterations < max_iterations:
        a = _design(terms, steps, x, base.overlap_launches, base.gemm_streams_weights)
        if sides is not None and np.array_equal(a, sides):
            break
        sides, x, iterations = a, _solve(a, seconds, prior), iterations + 1
        best = min(best, (error(x), x), key=lambda e: e[0])
    x = best[1]
    params = dict(zip(PARAMETERS, map(float, x), strict=True))
    cache_bw = base.cache_bandwidth_bytes_per_s
    profile = base.with_fit(
        gemm_efficiency=base.gemm_efficiency / x[0],
        attention_efficiency=base.attention_efficiency / x[1],
        bandwidth_bytes_per_s=base.bandwidth_bytes_per_s / x[2],
        cache_bandwidth_bytes_per_s=None if cache_bw is None else cache_bw / x[2],
        op_overhead_s=float(x[3]),
        step_overhead_s=float(x[4]),
        source=f"fitted to {len(samples)} measurements ({base.source})",
        kind="fitted",
    )
    return FitResult(profile, params, iterations)
