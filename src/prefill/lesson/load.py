"""The lesson page's server under load, simulated: p50 and p99 TTFT at an arrival rate, and why the tail grows.

GET /api/load?rate=2.1: a fixed mix of requests, arriving as a Poisson process of `rate` requests/s, through this
server's own scheduler (prefill.plan.simulate: the real step loop with the server's chunk size, max_running and
KV pool, on a simulated clock, each step timed by the time model on this machine's profile). Once per server: the
capacity (the mix's throughput when every request arrives at once) and p50 / p99 TTFT at fractions of it. The
simulations run on a thread of their own (pure Python: neither the event loop nor the model's worker thread
waits for them), each rate once (rounded to 3 significant digits).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import APIRouter, Query, Request

from prefill.costmodel.profile import MachineProfile
from prefill.errors import BadInput
from prefill.lesson.api import finite
from prefill.lesson.state import lesson_of
from prefill.lesson.words import human
from prefill.loadtest.client import PromptLengths
from prefill.loadtest.report import summarize
from prefill.plan.capacity import Workload
from prefill.plan.simulate import SimRequest, simulate, time_model_steps

if TYPE_CHECKING:
    from prefill.lesson.state import LessonState

# One simulation of the mix takes 0.5-1.7 s here (2 cores, busy; the time model's ~0.4 ms a step over 1,000 to
# 4,000 steps), so 12 rates of 100 requests cost ~15 s: 60 requests keep the once-per-server curve near 8 s.
MIX = Workload(60, PromptLengths(32, 512), PromptLengths(16, 64), seed=0)
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0, 1.1, 1.2)  # of capacity: the curve's rates
DEFAULT_UTILISATION = 0.7  # the rate asked when none is given, as a fraction of capacity
# The rates simulated, as fractions of capacity: far below it no request meets another (every rate looks alike),
# and at 1e-300 req/s the arrivals lie so far out that a step's seconds vanish in the clock's rounding.
MIN_UTILISATION, MAX_UTILISATION = 0.001, 10.0
REMEMBERED = 256  # rates whose simulation is kept
WORKLOAD = (
    f"{MIX.requests} requests arriving as a Poisson process (seed {MIX.seed}), prompts uniform "
    f"{MIX.prompts.lo}-{MIX.prompts.hi} tokens, outputs uniform {MIX.outputs.lo}-{MIX.outputs.hi} tokens"
)
router = APIRouter(prefix="/api", tags=["lesson: simulated load"])


def three_digits(x: float) -> float:
    return float(f"{x:.3g}")


@dataclass(frozen=True)
class Run:
    """One simulation: loadtest_report.summarize's summary, the preemptions, the seconds it took to run, and each
    completed request's (arrival, TTFT) in seconds, in arrival order: the queue over time."""

    summary: dict
    preemptions: int
    took_s: float
    waits: tuple[tuple[float, float], ...] = ()

    def latency(self, name: str, stat: str) -> float:
        """A latency statistic, seconds: ("ttft_s", "p99"), ("itl_s", "p50"), ("e2e_s", "p50")."""
        stats = self.summary["latency"][name]
        if stats is None:
            raise BadInput(f"no simulated request completed in this server's KV pool, so it has no {name}")
        return stats[stat]


@dataclass(frozen=True)
class Baseline:
    """What is simulated once per server: the capacity (requests/s) and the curve [(rate, Run)] at FRACTIONS."""

    capacity: float
    curve: list[tuple[float, Run]]
    took_s: float


class SimulatedServer:
    """This server's scheduler on a simulated clock: its baseline once, and each asked rate once."""

    def __init__(self, lesson: LessonState) -> None:
        self.lesson = lesson
        self._baseline: asyncio.Task | None = None
        self._runs: OrderedDict[float, asyncio.Future] = OrderedDict()

    def simulate(self, trace: list[SimRequest], profile: MachineProfile) -> Run:
        """The trace through the step loop with the server's sizes; each step's seconds from the time model."""
        lesson, engine, t = self.lesson, self.lesson.engine, time.perf_counter()
        step_seconds = time_model_steps(engine.spec, profile, engine.layout())  # engine.predict_step's, remembered
        result = simulate(engine.spec, trace, step_seconds, lesson.pool_tokens, lesson.chunk_size, lesson.max_running)
        waits = tuple((r.start, r.first_content - r.start) for r in result.records if r.ok)
        return Run(summarize(result.records, result.wall_s), result.preemptions, time.perf_counter() - t, waits)

    def _measure_baseline(self, profile: MachineProfile) -> Baseline:
        t = time.perf_counter()
        capacity = self.simulate(MIX.burst(), profile).summary["throughput_req_per_s"]
        rates = [three_digits(f * capacity) for f in FRACTIONS]
        return Baseline(capacity, [(r, self.simulate(MIX.trace(r), profile)) for r in rates], time.perf_counter() - t)

    async def baseline(self) -> Baseline:
        """The capacity and the curve, simulated on the first ask (and again after a failure)."""
        if self._baseline is None or (self._baseline.done() and self._baseline.exception() is not None):
            profile = await self.lesson.profile()
            self._baseline = asyncio.ensure_future(asyncio.to_thread(self._measure_baseline, profile))
            self._baseline.add_done_callback(self._remember_curve)
        return await asyncio.shield(self._baseline)  # a client that leaves does not cancel it for the others

    def _remember_curve(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        for rate, run in task.result().curve:
            done = asyncio.get_running_loop().create_future()
            done.set_result(run)
            self._runs.setdefault(rate, done)

    async def at(self, rate: float) -> Run:
        """The mix at `rate` requests/s (rounded to 3 significant digits), simulated once."""
        run = self._runs.get(rate)
        if run is None or (run.done() and run.exception() is not None):
            profile = await self.lesson.profile()
            run = self._runs[rate] = asyncio.ensure_future(asyncio.to_thread(self.simulate, MIX.trace(rate), profile))
            while len(self._runs) > REMEMBERED:
                self._runs.popitem(last=False)
        self._runs.move_to_end(rate)
        return await asyncio.shield(run)


def explanation(rate: float, capacity: float, run: Run, lesson: LessonState, profile: MachineProfile) -> str:
    """Why TTFT is what it is at this rate, in plain words, with the simulation's numbers."""
    u = rate / capacity
    p50, p99 = run.latency("ttft_s", "p50"), run.latency("ttft_s", "p99")
    head = f"At {rate:.3g} req/s ({u:.0%} of the {capacity:.3g} req/s this server sustains on this mix)"
    tail = f"p99 TTFT ({human(p99, 's')}) is {p99 / p50:.2g}x p50 ({human(p50, 's')})"
    if u < 0.5:
        middle = f"most requests arrive to a server with little else to do: TTFT is about one prefill, and {tail}."
    elif u <= 1:
        middle = f"requests often arrive while others are prefilling: they wait in the queue, so {tail}."
    else:
        middle = (
            f"requests arrive faster than the server finishes them: the queue never drains, each arrival waits "
            f"longer than the one before, and {tail}; a longer run would wait longer still."
        )
    law = (
        "Queueing delay grows like 1/(1 − utilisation): near capacity every new arrival waits behind a longer "
        "queue, and beyond it the queue never drains."
    )
    pool = ""
    if run.preemptions:
        pool = (
            f" The KV pool ({lesson.pool_tokens:,} tokens) holds few of these requests at once: {run.preemptions:,} "
            "preemptions (a newer request's blocks freed for an older one's, its prefill redone later)."
        )
    chunks = f"prefill chunks of {lesson.chunk_size} tokens" if lesson.chunk_size else "unchunked prefills"
    how = (
        f" Simulated: this server's own scheduler (the step loop: first come first served, {chunks}, at most "
        f"{lesson.max_running} requests running) on a simulated clock, each step timed by the time model on this "
        f"machine's profile ({profile.name})."
    )
    return f"{head} {middle} {law}{pool}{how}"


@router.get("/load")
async def load(
    request: Request,
    rate: float | None = Query(
        None,
        description=f"arrivals, requests/s (default: {DEFAULT_UTILISATION:.0%} of this server's simulated capacity). "
        f"The mix is simulated from {MIN_UTILISATION:.1%} to {MAX_UTILISATION:g}x the capacity: a rate outside is "
        "simulated at the nearer end, and the answer's `rate` is the rate simulated, `asked` the rate asked",
        json_schema_extra={"exclusiveMinimum": 0},
    ),
) -> dict:
    """Simulated p50 / p99 TTFT, ITL and end-to-end latency of a fixed mix of requests arriving at `rate` (within
    0.1% to 10x the capacity), through this server's scheduler with each step timed by the time model; the
    capacity, the curve of TTFT against the rate, and why the tail grows."""
    if rate is not None and not (rate > 0 and math.isfinite(rate)):  # before the baseline, which takes seconds
        raise BadInput(f"rate must be > 0 requests/s (a finite number), got {rate:g}")
    lesson = lesson_of(request)
    sim = lesson.part(SimulatedServer)
    base = await sim.baseline()
    capacity = base.capacity
    asked = DEFAULT_UTILISATION * capacity if rate is None else rate
    simulated = three_digits(min(max(asked, MIN_UTILISATION * capacity), MAX_UTILISATION * capacity))
    run = await sim.at(simulated)
    return finite({**load_body(simulated, base, run, lesson, await lesson.profile()), "asked": asked})


def load_body(rate: float, base, run, lesson: LessonState, profile: MachineProfile) -> dict:
    """/api/load's answer: the run at `rate` beside the baseline's capacity and TTFT curve, with its words."""
    capacity = base.capacity
    p50, p99 = run.latency("ttft_s", "p50"), run.latency("ttft_s", "p99")
    curve = [
        {
            "rate": r,
            "utilisation": r / capacity,
            "ttft_p50_s": c.latency("ttft_s", "p50"),
            "ttft_p99_s": c.latency("ttft_s", "p99"),
        }
        for r, c in base.curve
    ]
    return {
        "rate": rate,
        "capacity_req_per_s": capacity,
        "utilisation": rate / capacity,
        "ttft_p50_s": p50,
        "ttft_p99_s": p99,
        "itl_p50_s": run.latency("itl_s", "p50"),
        "e2e_p50_s": run.latency("e2e_s", "p50"),
        "throughput_req_per_s": run.summary["throughput_req_per_s"],
        "preemptions": run.preemptions,
        "workload": WORKLOAD,
        "curve": curve,
        "curve_range": [FRACTIONS[0], FRACTIONS[-1]],  # the slider's ends, as fractions of the capacity
        "requests": [{"arrival_s": a, "ttft_s": w} for a, w in run.waits],
        "explanation": explanation(rate, capacity, run, lesson, profile),
        "simulated_in_s": run.took_s,
        "curve_simulated_in_s": base.took_s,
        "human": {
            "ttft_p50": human(p50, "s"),
            "ttft_p99": human(p99, "s"),
            "itl_p50": human(run.latency("itl_s", "p50"), "s"),
            "utilisation": f"{rate / capacity:.0%}",
            "rate": f"{rate:.3g} req/s",
            "capacity": f"{capacity:.3g} req/s",
        },
    }
