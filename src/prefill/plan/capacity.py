"""A deployment planned: how many replicas, at which tensor-parallel width, keep p99 TTFT under an SLO at a rate.

    rows = plan(spec, "h100", "vllm", "bfloat16", None, rate=20.0, slo_ttft_s=0.5, workload=Workload(...))

For each TP width T that splits the model's heads and leaves room for a KV cache on each GPU, one replica is
simulated as its engine runs it (prefill.plan.gpu_serving: the engine's profile, batched attention, its KV
cache and scheduler caps, T-way tensor parallelism). Poisson arrivals split evenly over R replicas are Poisson at
rate / R, so R replicas meet the SLO when one replica meets it at rate / R. R starts at what the saturated
replica's throughput says is needed, doubles until p99 TTFT meets the SLO, then is bisected down. A replica
loaded past its saturated throughput never meets it (its queue grows without end, which a finite trace would
hide). Nothing is extrapolated: every R reported was simulated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass

from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput
from prefill.loadtest.client import PromptLengths
from prefill.loadtest.report import summarize
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.simulate import SimRequest, poisson_trace

TPS = (1, 2, 4, 8)  # tensor-parallel widths tried (one node)
MAX_REPLICAS = 256
IDLE_UTILISATION = 0.05  # a replica this lightly loaded that still misses the SLO misses it at no load


@dataclass(frozen=True)
class Workload:
    """The requests a plan is for: `requests` of them, prompt and output lengths drawn from the two ranges."""

    requests: int
    prompts: PromptLengths
    outputs: PromptLengths
    seed: int = 0

    def trace(self, rate: float) -> list[SimRequest]:
        return poisson_trace(rate, self.requests, self.prompts, self.outputs, self.seed)

    def burst(self) -> list[SimRequest]:
        """The same requests all arriving at once: what a saturated replica serves."""
        return [SimRequest(0.0, r.prompt_tokens, r.output_tokens) for r in self.trace(1.0)]


@dataclass(frozen=True)
class PlanRow:
    """One TP width's answer: replicas needed (None: no count meets the SLO, or the width does not fit), the
    saturated throughput of one replica, and the simulated latencies of the replica at rate / replicas."""

    tp: int
    replicas: int | None = None
    pool_tokens: int = 0
    capacity_req_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    simulations: int = 0
    note: str = ""

    @property
    def gpus(self) -> int | None:
        return None if self.replicas is None else self.replicas * self.tp


def plan(
    spec: ModelSpec,
    hardware: str,
    engine: str,
    weights: str,
    kv: str | None,
    rate: float,
    slo_ttft_s: float,
    workload: Workload,
    tps: tuple[int, ...] = TPS,
    echo: Callable[[str], None] | None = None,
) -> list[PlanRow]:
    """One PlanRow per TP width in `tps` (see the module docstring): `spec` on catalog GPU `hardware`, served by
    `engine` with weights and K/V stored as `weights` and `kv` (None: the engine's choice)."""
    if rate <= 0 or slo_ttft_s <= 0:
        raise BadInput(f"a plan needs rate > 0 and an SLO > 0, got rate = {rate}, SLO = {slo_ttft_s} s")
    rows = []
    longest = workload.prompts.hi + workload.outputs.hi
    for T in tps:
        try:
            server = GpuServer.of(spec, hardware, engine, weights, kv, T)
        except BadInput as e:  # the heads do not split T ways, or the weights leave no KV cache
            rows.append(PlanRow(T, note=str(e)))
            continue
        if server.tokens < longest:
            why = f"{server.tokens:,} positions of KV cache per replica, fewer than the longest request's {longest:,}"
            rows.append(PlanRow(T, pool_tokens=server.tokens, note=why))
            continue

        def run(trace, server=server):
            result = server.run(trace)
            return summarize(result.records, result.wall_s)

        rows.append(_replicas(T, server.tokens, rate, slo_ttft_s, workload, run, echo))
    return rows


def _replicas(T, tokens, rate, slo_ttft_s, workload: Workload, run, echo) -> PlanRow:
    """The fewest simulated replicas of TP width T whose p99 TTFT at rate / R meets the SLO."""
    saturated = run(workload.burst())
    capacity = saturated["throughput_req_per_s"]
    tried: dict[int, dict] = {}

    def meets(R: int) -> bool:
        if R not in tried:
            tried[R] = run(workload.trace(rate / R))
            if echo is not None:
                p99 = tried[R]["latency"]["ttft_s"]["p99"]
                each = f"{rate / R:.3g} req/s each, p99 TTFT {p99 * 1e3:,.0f} ms (simulated)"
                echo(f"TP {T}, {R} replica{'s' if R > 1 else ''}: {each}")
        # beyond its saturated throughput a replica's queue only grows: a finite trace would hide that
        return rate / R <= capacity and tried[R]["latency"]["ttft_s"]["p99"] <= slo_ttft_s

    def idle(R: int) -> bool:  # a replica this lightly loaded that misses the SLO misses it at no load
        return rate / R / capacity < IDLE_UTILISATION

    hi = fewest_replicas(meets, max(1, math.ceil(rate / capacity)), MAX_REPLICAS, give_up=idle)
    if hi is None:
        last = max(tried)
        why = "at no load" if last < MAX_REPLICAS else f"at {MAX_REPLICAS} replicas"
        p99 = tried[last]["latency"]["ttft_s"]["p99"]
        return PlanRow(T, None, tokens, capacity, simulations=len(tried) + 1, note=_miss(p99, slo_ttft_s, why))
    lat = tried[hi]["latency"]
    return PlanRow(
        T,
        hi,
        tokens,
        capacity,
        lat["ttft_s"]["p50"],
        lat["ttft_s"]["p99"],
        (lat["itl_s"] or {}).get("p50"),
        len(tried) + 1,
    )


def fewest_replicas(meets: Callable[[int], bool], start: int, most: int, give_up=lambda R: False) -> int | None:
    """The fewest R in [start, most] with meets(R) (assumed monotone in R), by doubling from `start` then
    bisecting; None when `most` misses, or when give_up(R) says a missing R is hopeless."""
    search = replica_search(start, most, give_up)
    R, _ = next(search)
    while True:
        try:
            R, _ = search.send(meets(R))
        except StopIteration as found:
            return found.value


def replica_search(start: int, most: int, give_up=lambda R: False) -> Generator[tuple[int, int], bool, int | None]:
    """fewest_replicas one question at a time: yields (R, lo), the R to try and the most replicas known to miss
    (start - 1 before any: the answer is above lo), is sent whether R meets; returns fewest_replicas' answer. A
    caller that can stop a search part way (the planner: lo + 1 replicas already cost more than its best) drives
    this."""
    lo, R = start - 1, start
    while not (yield R, lo):
        if most <= R or give_up(R):
            return None
        lo, R = R, min(most, 2 * R)
    hi = R
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if (yield mid, lo) else (mid, hi)
    return hi


def _miss(p99: float, slo: float, where: str) -> str:
    return f"p99 TTFT {p99 * 1e3:,.0f} ms {where}, above the SLO of {slo * 1e3:,.0f} ms"


def cheapest(rows: list[PlanRow]) -> PlanRow | None:
    """The row needing the fewest GPUs (ties: the lower p99 TTFT), or None when none meets the SLO."""
    ok = [r for r in rows if r.gpus is not None]
    return min(ok, key=lambda r: (r.gpus, r.ttft_p99_s or 0.0)) if ok else None
