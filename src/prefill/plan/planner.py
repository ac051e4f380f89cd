"""A GPU deployment planned: which GPU x TP x replicas x engine meets a p99 TTFT/TPOT SLO at the lowest cost.

    options = plan_deployments(spec, Workload(200, PromptLengths(200, 2000), PromptLengths(100, 400)),
                               Load(rate=20.0), Slo(ttft_p99_s=1.0, tpot_p99_s=0.05), prices={"h100": 2.99})
    best = options[0]  # ranked by dollars per million output tokens; best.command launches it

Each candidate is one replica simulated as its engine runs it (prefill.plan.gpu_serving: the time model on the
engine's profile, the one Scheduler with the engine's caps). First its lower bound: the workload's requests each
served alone (no load makes a request faster than alone: every step it shares only grows); a candidate whose p99
TTFT or TPOT alone misses the SLO misses it at any replica count and is not searched. At a Poisson rate, R
replicas each see rate / R (a Poisson stream split evenly stays Poisson); at a fixed concurrency C, each sees
ceil(C / R) users. R is the fewest replicas whose simulated p99 TTFT and p99 TPOT meet the SLO: from what one
replica's saturated throughput allows, doubled until it does, then bisected; a replica loaded under 5% of its
throughput that still misses is given up. Every R reported was simulated; nothing is extrapolated.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from prefill.costmodel import timemodel
from prefill.costmodel.engines import get_engine
from prefill.costmodel.hardware import get_hardware
from prefill.costmodel.ops import Row
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput
from prefill.loadtest.report import tpot, ttft
from prefill.plan.capacity import IDLE_UTILISATION, MAX_REPLICAS, Workload, replica_search
from prefill.plan.gpu_serving import GpuServer, closed_trace
from prefill.plan.launch import launch_for
from prefill.plan.simulate import SimRequest, SimResult

TPS = (1, 2, 4, 8)
# $/GPU-hour when none is given: Lambda's on-demand prices as listed by alpha-one-index.github.io/ai-infra-index
# (specs/inference-benchmarks.html, 2026): H100 $2.99, H200 $3.29. Pass --usd-per-gpu-hour for your own.
PRICES = {"h100": 2.99, "h200": 3.29}
Progress = Callable[[int, int], None]  # (candidates done, candidates in all)


@dataclass(frozen=True)
class Load:
    """The offered load: a Poisson `rate` (requests/s) or a fixed `concurrency` (users, closed loop)."""

    rate: float | None = None
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise BadInput("give one of --rate (requests/s) or --concurrency (users at once)")
        if self.rate is not None and not self.rate > 0:
            raise BadInput(f"--rate is requests arriving per second and must be > 0, got {self.rate:g}")
        if self.concurrency is not None and self.concurrency < 1:
            raise BadInput(f"--concurrency is users at once and must be >= 1, got {self.concurrency}")


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
    its cost ($/hour; $ per million output tokens), the chosen replica's run, its launch command (and the files
    it reads), at a rate one replica's saturated throughput in requests/s, and its p99s with every request served
    alone (the best any replica count reaches)."""

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
    files: tuple[tuple[str, str], ...] = ()
    note: str = ""
    capacity_req_s: float | None = None  # one replica's saturated throughput (at a rate: R >= rate / this)
    alone: tuple[float, float] | None = None  # (p99 TTFT, p99 TPOT) in seconds, each request alone

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
    return Run(p99(ttfts), p99(tpots), out, bound_of(server, result))


def p99(sorted_values: list[float]) -> float:
    """The 99th percentile of ascending values: the smallest value at or above 99% of them."""
    return sorted_values[min(len(sorted_values) - 1, math.ceil(0.99 * len(sorted_values)) - 1)]


def alone(server: GpuServer, workload: Workload) -> tuple[float, float]:
    """p99 TTFT and p99 TPOT (s) of the workload's requests each served alone: its p99 prompt's TTFT alone (the
    engine's prefill chunks, simulated), and the first decode step at the p99 context of the requests that decode
    (each later step reads more K/V). A request alone is TTFT- and TPOT-monotone in its prompt, so these are the
    p99s of every request's own; under load each is at least as long: a lower bound on any replica's p99s."""
    trace = workload.trace(1.0)
    prompt = p99(sorted(r.prompt_tokens for r in trace))
    (record,) = server.run([SimRequest(0.0, prompt, 1)]).records
    decoding = sorted(r.prompt_tokens for r in trace if r.output_tokens > 1)
    step = server.step_seconds([Row(1, p99(decoding))]) if decoding else 0.0
    return ttft(record), step


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
    search = option_search(server, workload, load, slo, usd_per_gpu_hour)
    while True:
        try:
            next(search)
        except StopIteration as done:
            return done.value


def option_search(server: GpuServer, workload: Workload, load: Load, slo: Slo, usd_per_gpu_hour: float):
    """plan_option one simulated run at a time: before each replica count it simulates, yields the fewest
    replicas the deployment can still need (a caller may stop there: at a rate its cost floor grows with them);
    returns the Option."""
    runs: dict[int, Run] = {}
    start, most, capacity = 1, MAX_REPLICAS if load.rate is not None else load.concurrency, math.inf
    if load.rate is not None:  # no fewer than the saturated replica's throughput allows
        burst = workload.burst()
        capacity = len(burst) / server.run(burst).wall_s
        start = min(most, max(1, math.ceil(load.rate / capacity)))

    def meets(R: int) -> bool:
        # beyond its saturated throughput a replica's queue only grows: a finite trace would hide that
        if load.rate is not None and load.rate / R > capacity:
            return False
        runs[R] = runs.get(R) or replica_run(server, workload, load, R)
        return slo.met(runs[R].ttft_p99_s, runs[R].tpot_p99_s)

    def idle(R: int) -> bool:  # this lightly loaded and still missing: more replicas will not help
        return load.rate is not None and load.rate / R / capacity < IDLE_UTILISATION

    search = replica_search(start, most, give_up=idle)
    R, lo = next(search)
    while True:
        if R not in runs and not (load.rate is not None and load.rate / R > capacity):
            yield lo + 1
        try:
            R, lo = search.send(meets(R))
        except StopIteration as found:
            return priced(server, found.value, runs, capacity, usd_per_gpu_hour)


def priced(server: GpuServer, R: int | None, runs: dict[int, Run], capacity: float, usd_per_gpu_hour: float):
    """The Option of R replicas of `server` (None: none found; why, from the runs), with its cost and launch."""
    cap = None if math.isinf(capacity) else capacity
    base = Option(server.hw.name, server.tp, server.engine.name, server.weights, server.kv, server.tokens)
    base = replace(base, capacity_req_s=cap)
    if R is None and not runs:
        return replace(base, note=f"one replica serves at most {capacity:.3g} req/s: needs over {MAX_REPLICAS}")
    if R is None:
        worst = runs[max(runs)]
        why = f"p99 TTFT {worst.ttft_p99_s * 1e3:,.0f} ms, TPOT {worst.tpot_p99_s * 1e3:,.1f} ms at {max(runs)}"
        return replace(base, run=worst, note=f"misses the SLO even with {why} replica(s) ({worst.bound})")
    run = runs[R]
    per_hour = usd_per_gpu_hour * server.tp * R
    per_m = per_hour / (run.output_tok_s * R * 3600) * 1e6
    launch = launch_for(server)
    cost = {"usd_per_hour": per_hour, "usd_per_m_output": per_m}
    return replace(base, replicas=R, run=run, command=launch.command, files=launch.files, **cost)


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
    progress: Progress | None = None,
) -> list[Option]:
    """Every GPU in `prices` x TP width x engine x weights, planned (plan_option) unless its requests alone
    already miss the SLO, or (at a rate) it cannot cost less than the cheapest found: best first by cost floor.
    A candidate's floor is cost_floor times the fewest replicas it can still need (each count below missed), so
    its search waits while another's floor is lower, and stops, before or part way, once its floor is above the
    cheapest found: what is not simulated cannot be cheaper. The ones that meet the SLO first, cheapest per
    million output tokens first, then the others, with why. BadInput, before any simulation, for a GPU or engine
    not in the catalogs."""
    for gpu in prices:
        get_hardware(gpu)
    for name in engines:
        get_engine(name)
    grid = [(gpu, w, name, T) for gpu in prices for w in weights for name in engines for T in tps]
    floors = [cost_floor(prices[gpu], T, workload, load) for gpu, _, _, T in grid]
    options: list[Option | None] = [None] * len(grid)
    searches: dict[int, tuple] = {}  # index -> (its Option so far, its search, the fewest replicas it may need)
    queue = [(floor, i) for i, floor in enumerate(floors)]  # (the least $/M out it can still cost, index)
    heapq.heapify(queue)
    cheapest = math.inf
    while queue:
        bound, i = heapq.heappop(queue)
        if i not in searches:
            gpu, w, name, T = grid[i]
            pruned = bound if bound > cheapest else None
            started = _candidate(spec, gpu, name, w, kv, T, workload, load, slo, prices[gpu], pruned)
            if isinstance(started, Option):
                options[i] = started
            else:
                searches[i] = (*started, 1)
                heapq.heappush(queue, (bound, i))
                continue
        else:
            base, search, need = searches[i]
            if bound > cheapest:
                options[i] = _not_simulated(base, bound, need)
            else:
                try:
                    searches[i] = (base, search, next(search))
                    heapq.heappush(queue, (floors[i] * searches[i][2], i))
                    continue
                except StopIteration as done:
                    options[i] = done.value
        if options[i].usd_per_m_output is not None:
            cheapest = min(cheapest, options[i].usd_per_m_output)
        if progress is not None:
            progress(sum(o is not None for o in options), len(grid))
    return sorted(options, key=lambda o: (o.usd_per_m_output is None, o.usd_per_m_output or 0.0, o.tp))


def cost_floor(usd_per_gpu_hour: float, T: int, workload: Workload, load: Load) -> float:
    """The least $ per million output tokens any replica count of a TP-T deployment can cost at `load`'s rate
    (0 at a concurrency). The cost is the price of T GPUs over one replica's simulated output tokens/s at
    rate / R, and one replica outputs its trace's N tokens in no less time than its last request takes to
    arrive, S R / rate (S: that arrival at rate 1): at most N rate / (S R) tokens/s, so the cost is at least
    price T S R / (3600 N rate) per token, least at R = 1 (R times this at R replicas)."""
    if load.rate is None:
        return 0.0
    trace = workload.trace(1.0)
    last, tokens = trace[-1].arrival_s, sum(r.output_tokens for r in trace)
    return usd_per_gpu_hour * T * last / (3600 * tokens * load.rate) * 1e6


def _not_simulated(base: Option, floor: float, need: int) -> Option:
    at = "" if need == 1 else f" at {need} replicas (fewer miss the SLO)"
    return replace(base, note=f"not simulated: costs at least ${floor:,.3f}/M out{at}, above the cheapest")


def _candidate(spec, gpu, engine, w, kv, T, workload, load, slo, price, pruned: float | None):
    """(its Option so far, its search: option_search once its lower bound is met), or its Option where it cannot
    be searched, or need not be (`pruned`: its cost floor, above the cheapest found)."""
    try:
        server = GpuServer.of(spec, gpu, engine, w, kv, T)
    except BadInput as e:  # the heads do not split T ways, or the weights leave no KV cache
        why = "the weights leave no room for a KV cache" if "does not fit" in str(e) else str(e)
        return Option(gpu, T, engine, w, kv or "-", note=why)
    base = Option(gpu, T, engine, server.weights, server.kv, server.tokens)
    longest = workload.prompts.hi + workload.outputs.hi
    if server.tokens < longest:
        return replace(base, note=f"{server.tokens:,} KV positions, fewer than the longest request's {longest:,}")
    if launch_for(server).missing:  # what the engine cannot deploy is not a deployment
        return replace(base, note=f"not deployable: {launch_for(server).missing}")
    if pruned is not None:
        return _not_simulated(base, pruned, 1)
    best = alone(server, workload)
    base = replace(base, alone=best)
    if not slo.met(*best):
        why = f"p99 TTFT {best[0] * 1e3:,.0f} ms, TPOT {best[1] * 1e3:,.1f} ms with each request alone"
        return replace(base, note=f"misses the SLO at any load: {why}")
    return base, _with_alone(option_search(server, workload, load, slo, price), gpu, best)


def _with_alone(search, gpu: str, best: tuple[float, float]):
    option = yield from search
    return replace(option, gpu=gpu, alone=best)


def reachable(options: list[Option]) -> str:
    """The best p99 TTFT and p99 TPOT any candidate reaches with each request alone, and where: what an SLO
    that no candidate meets would have to allow."""
    tried = [o for o in options if o.alone is not None]
    if not tried:
        return "no candidate holds the model and the workload's longest request"
    ttft_best = min(tried, key=lambda o: o.alone[0])
    tpot_best = min(tried, key=lambda o: o.alone[1])
    where = lambda o: f"{o.engine}, {o.tp} x {o.gpu}"  # noqa: E731
    return (
        f"the best reachable, each request alone: p99 TTFT {ttft_best.alone[0] * 1e3:,.1f} ms ({where(ttft_best)}), "
        f"p99 TPOT {tpot_best.alone[1] * 1e3:,.2f} ms ({where(tpot_best)})"
    )
