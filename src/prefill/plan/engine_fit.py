"""A GPU deployment's measured load test beside the planner's prediction, and the engine's efficiencies refit.

    records = read_records(Path("loadtest.json"))            # what `prefill loadtest` measured, request by request
    summary = predict_load(server, records, in_flight=64)     # the same trace on the simulated deployment
    fit = fit_engine(server, records, in_flight=64)           # bandwidth and GEMM efficiencies that explain it
    print(fit.describe())                                     # how much each moved

The trace is the load test's own (trace_of: each request's start, prompt and output tokens), replayed with the
client's cap on requests in flight. The fit moves the two efficiencies that set a step's time, the fraction of
HBM bandwidth reached (decode: TPOT) and of the GEMM peak (prefill: TTFT), until the simulated mean TTFT and
mean TPOT are the measured ones: Newton's method on the two log-errors in log-efficiency, within [0.05, 1], a step
taken only where it lowers the errors (halved until it does; none does: a minimum, the fit stops there). On this
CPU the same fit moves the probed profile's attention and GEMM efficiencies (prefill.plan.cpu_fit).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from prefill.errors import BadInput
from prefill.loadtest.client import RequestRecord
from prefill.loadtest.report import summarize, tpot, ttft
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.simulate import trace_of

FITTED = ("bandwidth", "gemm")  # the efficiencies a load test can tell apart (decode, prefill)
BOUNDS = (0.05, 1.0)
ITERATIONS, TOLERANCE = 40, 1e-3  # Newton steps at most (12 ran out with an efficiency held at its bound,
# the other creeping on by coordinate steps); stop when both means are within 0.1%
MIN_GAIN = 0.01  # a step that lowers the squared errors by less than 1% of them ends the fit (a minimum)
HALVINGS = 6  # a step that does not lower the errors is halved, at most this many times
STEP, MAX_STEP = 0.1, 0.7  # the Jacobian's finite difference (wide: step alignment is not smooth), the largest step


def read_records(path: Path) -> tuple[list[RequestRecord], dict]:
    """The requests and the config of a `prefill loadtest` JSON report; BadInput on anything else."""
    try:
        data = json.loads(Path(path).read_text())
        fields = {f.name for f in dataclasses.fields(RequestRecord)}
        records = [RequestRecord(**{k: v for k, v in r.items() if k in fields}) for r in data["requests"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = f"cannot read a load test from {path} ({e}); give the JSON `prefill loadtest --out` wrote"
        raise BadInput(why) from None
    if not trace_of(records):
        raise BadInput(
            f"{path} has no successful request with token counts; run the load test with usage, or with "
            "--tokenizer MODEL where the server streams none"
        )
    return records, data.get("config", {})


def run_trace(server: GpuServer, records: list[RequestRecord], in_flight: int | None):
    """The load test's trace through the simulated deployment."""
    return server.run(trace_of(records), in_flight)


def predict_load(server: GpuServer, records: list[RequestRecord], in_flight: int | None) -> dict:
    """The simulated summary of the load test's trace (as `prefill loadtest` summarises a measured one)."""
    result = run_trace(server, records, in_flight)
    return summarize(result.records, result.wall_s)


def means(records: list[RequestRecord]) -> tuple[float, float]:
    """Mean TTFT and mean TPOT, seconds, of the successful requests: means, not medians, since a request's TTFT
    jumps by a step when a small change moves its arrival to the other side of a step's start."""
    ok = [r for r in records if r.ok]
    tpots = [t for t in (tpot(r) for r in ok) if t is not None]
    if not ok or not tpots:
        raise BadInput("the load test has no request with two output tokens or more: nothing to fit")
    return statistics.fmean(ttft(r) for r in ok), statistics.fmean(tpots)


@dataclass(frozen=True)
class Fit:
    """Efficiencies before and after the fit, and the mean TTFT/TPOT errors (predicted / measured - 1)."""

    before: dict[str, float]
    after: dict[str, float]
    errors_before: tuple[float, float]
    errors_after: tuple[float, float]

    stopped: str = "tolerance"  # why the fit stopped: "tolerance", "no descent" (a minimum) or "iterations"

    @property
    def converged(self) -> bool:
        """Whether the fit reached the measured means within TOLERANCE or a point no Newton step improves on (a
        minimum of the stepwise response: a real run's means move in steps), not its cap on iterations."""
        return self.stopped != "iterations"

    def describe(self) -> str:
        moves = [
            f"{k} efficiency {self.before[k]:.2f} -> {self.after[k]:.2f} ({self.after[k] / self.before[k] - 1:+.0%})"
            for k in self.before
        ]
        (t0, p0), (t1, p1) = self.errors_before, self.errors_after
        errors = f"Mean TTFT error {t0:+.0%} -> {t1:+.0%}, mean TPOT error {p0:+.0%} -> {p1:+.0%}"
        return f"{'; '.join(moves)}. {errors} (stopped: {self.stopped})"


def fit_engine(server: GpuServer, records: list[RequestRecord], in_flight: int | None) -> Fit:
    """The engine's bandwidth and GEMM efficiencies that make the simulated trace's mean TTFT and TPOT the
    measured ones (see the module docstring)."""
    eff = dict(server.engine.efficiencies)

    def run(values: dict[str, float]) -> list[RequestRecord]:
        engine = dataclasses.replace(server.engine, efficiencies=tuple({**eff, **values}.items()))
        return run_trace(server.with_engine(engine), records, in_flight).records

    return fit_means(run, records, {k: eff[k] for k in FITTED}, BOUNDS)


def fit_means(run, records: list[RequestRecord], before: dict[str, float], bounds: tuple[float, float]) -> Fit:
    """The two efficiencies `before` (the first sets decode, the second prefill, mostly) moved within `bounds`
    until `run(efficiencies)`, the simulated records, has the measured mean TTFT and TPOT: Newton's method on the
    two log-errors in log-efficiency."""
    measured, names = means(records), tuple(before)

    def errors(values: dict[str, float]) -> tuple[float, float]:
        got = means(run({**before, **values}))
        return got[0] / measured[0] - 1, got[1] / measured[1] - 1

    x = [math.log(before[k]) for k in names]
    r, stopped = _residuals(errors, names, x), "iterations"
    for _ in range(ITERATIONS):
        if max(abs(v) for v in r) < TOLERANCE:
            stopped = "tolerance"
            break
        step = _descent(errors, names, x, r, _newton_step(errors, names, x, r, bounds))
        step = step or _coordinate_descent(errors, names, x, r, bounds)
        if step is None or _cost(step[1]) > (1 - MIN_GAIN) * _cost(r):  # a minimum of a stepwise response
            x, r = step or (x, r)
            stopped = "no descent"
            break
        x, r = step
    after = {k: math.exp(v) for k, v in zip(names, x, strict=True)}
    return Fit(dict(before), after, errors({}), errors(after), stopped)


def _descent(errors, names, x: list[float], r: list[float], target: list[float]):
    """(x, residuals) of the first point from x towards `target` (the whole way, then half, a quarter, ...) whose
    squared log-errors sum lower than at x; None when none of HALVINGS does. The simulated means move in steps
    (a request's arrival crossing a step's start), so a full Newton step can land higher than it left."""
    cost = _cost(r)
    for k in range(HALVINGS):
        xk = [a + (b - a) / 2**k for a, b in zip(x, target, strict=True)]
        rk = _residuals(errors, names, xk)
        if _cost(rk) < cost:
            return xk, rk
    return None


def _coordinate_descent(errors, names, x: list[float], r: list[float], bounds: tuple[float, float]):
    """Where Newton's direction fails (its finite-difference Jacobian misled by the steps): the first of each
    efficiency up or down by MAX_STEP (within `bounds`) that _descent finds lower; None when none is."""
    lo, hi = (math.log(v) for v in bounds)
    for i in range(len(x)):
        for sign in (1.0, -1.0):
            target = list(x)
            target[i] = min(hi, max(lo, x[i] + sign * MAX_STEP))
            step = _descent(errors, names, x, r, target) if target != x else None
            if step is not None:
                return step
    return None


def _cost(r: list[float]) -> float:
    """The summed squared log-errors the fit lowers."""
    return sum(v * v for v in r)


def _residuals(errors, names: tuple[str, ...], x: list[float]) -> list[float]:
    """log(predicted / measured) of mean TTFT and TPOT at log-efficiencies x."""
    return [math.log1p(e) for e in errors({k: math.exp(v) for k, v in zip(names, x, strict=True)})]


def _newton_step(errors, names, x: list[float], r: list[float], bounds: tuple[float, float]) -> list[float]:
    """One Newton step on the two residuals in log space (a finite-difference Jacobian), its size capped at
    MAX_STEP and the result kept within `bounds`; projected where one efficiency sits at its bound and the step
    pushes it further: that one stays, and the other takes the least-squares step on both residuals alone (the
    joint step assumed the pinned one would move, and left the other creeping on by halved steps)."""
    cols = []
    for i in range(len(x)):
        xi = list(x)
        xi[i] += STEP
        cols.append([(a - b) / STEP for a, b in zip(_residuals(errors, names, xi), r, strict=True)])
    (a, c), (b, d) = cols  # J = [[a, b], [c, d]]: rows the residuals, columns the parameters
    det = a * d - b * c
    if abs(det) < 1e-9:
        why = f"the load test cannot tell the {names[0]} from the {names[1]} efficiency (send prompts and outputs)"
        raise BadInput(why)
    dx = [(d * r[0] - b * r[1]) / det, (-c * r[0] + a * r[1]) / det]
    lo, hi = (math.log(v) for v in bounds)
    pinned = [i for i in range(2) if (x[i] <= lo and dx[i] > 0) or (x[i] >= hi and dx[i] < 0)]
    if len(pinned) == 1:  # x - dx leaves the bound it sits on: fix it, solve for the other on both residuals
        free = 1 - pinned[0]
        col = cols[free]
        dx = [0.0, 0.0]
        dx[free] = sum(j * v for j, v in zip(col, r, strict=True)) / max(sum(j * j for j in col), 1e-12)
    scale = min(1.0, MAX_STEP / max(max(abs(v) for v in dx), 1e-12))
    return [min(hi, max(lo, v - scale * s)) for v, s in zip(x, dx, strict=True)]
