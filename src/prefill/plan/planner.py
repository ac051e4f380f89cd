"""A GPU deployment planned: which GPU x TP x replicas x engine meets a p99 TTFT/TPOT SLO at the lowest cost.

    options = plan_deployments(spec, Workload(200, PromptLengths(200, 2000), PromptLengths(100, 400)),
                               Load(rate=20.0), Slo(ttft_p99_s=1.0, tpot_p99_s=0.05), prices={"h100": 2.99})
    best = options[0]  # ranked by dollars per million output tokens; best.command launches it

Each candidate is one replica simulated as its engine runs it (prefill.plan.gpu_serving: the time model on the
engine's profile, the one Scheduler with the engine's caps). At a Poisson rate, R replicas each see rate / R
(a Poisson stream split evenly stays Poisson); at a fixed concurrency C, each sees ceil(C / R) users. R is the
fewest replicas whose simulated p99 TTFT and p99 TPOT meet the SLO: doubled until it does, then bisected.
Every R reported was simulated; nothing is extrapolated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from prefill.costmodel import timemodel
from prefill.costmodel.ops import Row
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput
from prefill.loadtest.report import tpot, ttft
from prefill.plan.capacity import MAX_REPLICAS, Workload, fewest_replicas
from prefill.plan.gpu_serving import GpuServer, closed_trace
from prefill.plan.simulate import SimRequest, SimResult

TPS = (1, 2, 4, 8)
# $/GPU-hour when none is given: Lambda's on-demand prices as listed by alpha-one-index.github.io/ai-infra-index
# (specs/inference-benchmarks.html, 2026): H100 $2.99, H200 $3.29. Pass --usd-per-gpu-hour for your own.
PRICES = {"h100": 2.99, "h200": 3.29}


@dataclass(frozen=True)
class Load:
    """The offered load: a Poisson `rate` (requests/s) or a fixed `concurrency` (users, closed loop)."""

    rate: float | None = None
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise BadInput("give one of --rate (requests/s) or --concurrency (users at once)")
        if (self.rate is not None and self.rate <= 0) or (self.concurrency is not None and self.concurrency < 1):
            raise BadInput(f"--rate must be > 0 and --concurrency >= 1, got {self.rate or self.concurrency}")


@dataclass(frozen=True)
class Slo:
    """p99 TTFT and p99 TPOT to keep under, seconds (None: no bound on that one)."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None

    def __post_init__(self) -> None:
        if self.ttft_p99_s is None and self.tpot_p99_s is None:
            raise BadInput("give an SLO: --slo-ttft-ms and/or --slo-tpot-ms (p99)")
        if any(x is not None and x <= 0 for x in (self.ttft_p99_s, self.tpot_p99_s)):
            raise BadInput("SLOs must be > 0 ms")

    def met(self, ttft_p99: float, tpot_p99: float) -> bool:
        return (self.ttft_p99_s is None or ttft_p99 <= self.ttft_p99_s) and (
            self.tpot_p99_s is None or tpot_p99 <= self.tpot_p99_s
        )


@dataclass(frozen=True)
class Run:
    """One replica's simulated run: p99 TTFT and TPOT (s), output tokens/s, and what bound its steps."""

    ttft_p99_s: float
    tpot_p99_s: float
    output_tok_s: float
    bound: str


@dataclass(frozen=True)
class Option:
    """One deployment: GPU, TP width, engine, storage; replicas needed (None: none meets the SLO, see note),
    its cost ($/hour; $ per million output tokens), the chosen replica's run, its launch command, and (at a
    rate) one replica's saturated throughput in requests/s."""

    gpu: str
    tp: int
    engine: str
    weights: str
    kv: str
    kv_tokens: int = 0
    replicas: int | None = None
    usd_per_hour: float | None = None
    usd_per_m_output: float | None = None
    run: Run | None = None
    command: str = ""
    note: str = ""
    capacity_req_s: float | None = None  # one replica's saturated throughput (at a rate: R >= rate / this)

    @property
    def gpus(self) -> int | None:
        return None if self.replicas is None else self.replicas * self.tp


def replica_run(server: GpuServer, workload: Workload, load: Load, R: int) -> Run:
    """One of R replicas under its share of the load, simulated."""
    if load.rate is not None:
        result = server.run(workload.trace(load.rate / R))
        records = result.records
    else:
        users = math.ceil(load.concurrency / R)
        n = max(workload.requests, 4 * users)
        result = server.run(closed_trace(n, workload.prompts, workload.outputs, workload.seed), in_flight=users)
        records = result.records[users:]  # the first wave is a warm-up
    ok = [r for r in records if r.ok]
    if not ok:
        raise BadInput("no simulated request completed; check the lengths against the model's context")
    tpots = sorted(t for t in (tpot(r) for r in ok) if t is not None) or [0.0]
    ttfts = sorted(ttft(r) for r in ok)
    out = sum(r.n_out for r in result.records if r.ok) / result.wall_s
    return Run(_p99(ttfts), _p99(tpots), out, bound_of(server, result))


def _p99(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, math.ceil(0.99 * len(sorted_values)) - 1)]


def bound_of(server: GpuServer, result: SimResult) -> str:
    """Why the replica is as fast as it is: KV capacity (it preempted), the scheduler's cap on running requests,
    or the part (compute, memory bandwidth, overhead) that sets most of its steps' predicted time."""
    if result.preemptions:
        return f"KV capacity ({result.preemptions} preemptions in {server.tokens:,} positions)"
    if result.steps and max(len(s) for s in result.steps) >= server.engine.max_seqs:
        return f"scheduler cap ({server.engine.max_seqs} running requests)"
    parts = dict.fromkeys(timemodel.PARTS, 0.0)
    stride = max(1, len(result.steps) // 200)  # a sample of the steps: their parts' shares are what matter
    for shape in result.steps[::stride]:
        rows = [Row(new, past) for new, past in shape]
        for k, v in timemodel.predict_step(server.spec, rows, server.profile, server.layout).parts().items():
            parts[k] += v
    part = max(parts, key=parts.get)
    words = {"compute": "compute", "memory": "memory bandwidth", "overhead": "launches and CPU overhead"}
    return f"{words[part]} ({parts[part] / sum(parts.values()):.0%} of step time)"


def plan_option(server: GpuServer, workload: Workload, load: Load, slo: Slo, usd_per_gpu_hour: float) -> Option:
    """The fewest replicas of `server` meeting `slo` under `load`, and what they cost."""
    runs: dict[int, Run] = {}
    start, most, capacity = 1, MAX_REPLICAS if load.rate is not None else load.concurrency, math.inf
    if load.rate is not None:  # no fewer than the saturated replica's throughput allows
        burst = [SimRequest(0.0, r.prompt_tokens, r.output_tokens) for r in workload.trace(1.0)]
        result = server.run(burst)
        capacity = len(burst) / result.wall_s
        start = min(most, max(1, math.ceil(load.rate / capacity)))

    def meets(R: int) -> bool:
        runs[R] = runs.get(R) or replica_run(server, workload, load, R)
        # beyond its saturated throughput a replica's queue only grows: a finite trace would hide that
        within = load.rate is None or load.rate / R <= capacity
        return within and slo.met(runs[R].ttft_p99_s, runs[R].tpot_p99_s)

    R = fewest_replicas(meets, start, most)
    e = server.engine
    cap = None if math.isinf(capacity) else capacity
    base = Option(server.hw.name, server.tp, e.name, server.weights, server.kv, server.tokens, capacity_req_s=cap)
    if R is None:
        worst = runs[max(runs)]
        why = f"p99 TTFT {worst.ttft_p99_s * 1e3:,.0f} ms, TPOT {worst.tpot_p99_s * 1e3:,.1f} ms at {max(runs)}"
        return _with(base, run=worst, note=f"misses the SLO even with {why} replicas ({worst.bound})")
    run = runs[R]
    per_hour = usd_per_gpu_hour * server.tp * R
    per_m = per_hour / (run.output_tok_s * R * 3600) * 1e6
    command = e.command(server.spec.name, server.weights, server.kv, server.tp)
    return _with(base, replicas=R, usd_per_hour=per_hour, usd_per_m_output=per_m, run=run, command=command)


def _with(o: Option, **changes) -> Option:
    from dataclasses import replace

    return replace(o, **changes)


def plan_deployments(
    spec: ModelSpec,
    workload: Workload,
    load: Load,
    slo: Slo,
    prices: dict[str, float],
    engines: tuple[str, ...] = ("vllm", "sglang"),
    weights: tuple[str, ...] = ("bfloat16",),
    kv: str | None = None,
    tps: tuple[int, ...] = TPS,
    echo: Callable[[str], None] | None = None,
) -> list[Option]:
    """Every GPU in `prices` x TP width x engine x weights, planned (plan_option); the ones that meet the SLO
    first, cheapest per million output tokens first, then the ones that do not, with why."""
    options = []
    for gpu, price in prices.items():
        for w in weights:
            for name in engines:
                for T in tps:
                    options.append(_candidate(spec, gpu, name, w, kv, T, workload, load, slo, price, echo))
    return sorted(options, key=lambda o: (o.usd_per_m_output is None, o.usd_per_m_output or 0.0, o.tp))


def _candidate(spec, gpu, engine, w, kv, T, workload, load, slo, price, echo) -> Option:
    try:
        server = GpuServer.of(spec, gpu, engine, w, kv, T)
    except BadInput as e:  # the heads do not split T ways, or the weights leave no KV cache
        return Option(gpu, T, engine, w, kv or "-", note=str(e))
    longest = workload.prompts.hi + workload.outputs.hi
    if server.tokens < longest:
        note = f"{server.tokens:,} KV positions, fewer than the longest request's {longest:,}"
        return Option(gpu, T, engine, server.weights, server.kv, server.tokens, note=note)
    option = _with(plan_option(server, workload, load, slo, price), gpu=gpu)
    if echo is not None:
        echo(f"{server.name}: {option.replicas or 'no'} replicas")
    return option
