"""Aggregated or disaggregated: which serves a workload within its SLO on fewer GPUs, and why, in the step
model's numbers.

    v = compare(spec, workload, rate=8.0, slo=Slo(1.0, 0.05), gpu="h100", engine="vllm", link=get_link("nvlink"))
    print(v.describe())   # the winner, both deployments' GPUs and p99s, and the steps that decided it

Aggregated: R replicas of one TP width, each running prefill and decode in the same steps (the engine's own rules).
Disaggregated: x prefill and y decode instances (prefill.plan.disagg), each pool's TP width chosen on its own.
Each side is the fewest GPUs whose simulated p99 TTFT and p99 TPOT meet the SLO at the whole rate (Poisson, split
evenly): the same GPU at the same price, so fewer GPUs is the lower cost, and rate / GPUs the goodput per GPU.
The pools are sized apart (prefill-only runs for TTFT, decode-only runs for TPOT), then the xPyD pair is run end to
end and grown by one instance of the pool that misses, until it meets the SLO or gives up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import fmean

from prefill.costmodel.links import Link, kv_transfer_bytes
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput
from prefill.loadtest.report import summarize
from prefill.plan.capacity import IDLE_UTILISATION, MAX_REPLICAS, Workload, fewest_replicas
from prefill.plan.disagg import Disagg, Meter, run_metered, simulate_disagg
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.planner import Slo
from prefill.plan.simulate import SimRequest

GROW_TRIES = 4  # instances added to the end-to-end xPyD run before giving up


@dataclass(frozen=True)
class Side:
    """One deployment at the load: its name, GPUs (None: no size tried meets the SLO), p99s (s), output tokens/s,
    and the step model's numbers behind it (facts)."""

    name: str
    gpus: int | None
    ttft_p99_s: float = math.nan
    tpot_p99_s: float = math.nan
    output_tok_s: float = 0.0
    facts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """Both sides, the winner ("aggregated", "disaggregated" or "neither") and why, sentence by sentence."""

    agg: Side
    disagg: Side
    winner: str
    why: list[str]
    rate: float

    def describe(self) -> str:
        lines = [f"{self.winner} wins" if self.winner != "neither" else "neither meets the SLO"]
        for side in (self.agg, self.disagg):
            if side.gpus is None:
                lines.append(f"  {side.name}: no size tried meets the SLO")
            else:
                each = f"{self.rate / side.gpus:.2f} req/s per GPU"
                p99 = f"p99 TTFT {side.ttft_p99_s * 1e3:,.0f} ms, TPOT {side.tpot_p99_s * 1e3:,.1f} ms"
                lines.append(f"  {side.name}: {_gpus(side.gpus)} ({each}), {p99}")
        return "\n".join(lines + [f"  {w}" for w in self.why])


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _rows(n: float) -> str:
    return f"{n:.0f} row" if round(n) == 1 else f"{n:.0f} rows"


def step_facts(meters: list[Meter]) -> dict:
    """What a pool's steps were: how many carried prompt tokens, their mean seconds, prompt tokens and decode rows,
    and the same for the decode-only steps."""
    steps = [s for m in meters for s in m.steps]
    mixed = [s for s in steps if s[1] > 0]
    plain = [s for s in steps if s[1] == 0 and s[2] > 0]

    def mean(rows, i):
        return fmean(r[i] for r in rows) if rows else 0.0

    return {
        "steps": len(steps),
        "prefill_share": len(mixed) / len(steps) if steps else 0.0,
        "prefill_step_s": mean(mixed, 0),
        "prefill_tokens": mean(mixed, 1),
        "stalled_rows": mean(mixed, 2),
        "decode_step_s": mean(plain, 0),
        "decode_rows": mean(plain, 2),
    }


def _p99s(records, wall_s) -> tuple[float, float, float]:
    s = summarize(records, wall_s)
    lat = s["latency"]
    return (
        (lat["ttft_s"] or {}).get("p99", math.inf),
        (lat["tpot_s"] or {}).get("p99", 0.0),
        s["throughput_output_tok_per_s"],
    )


def _fewest(run, rate: float, burst: list[SimRequest], server: GpuServer, arrived: bool = False) -> int | None:
    """The fewest instances R of `server` for which run(rate / R) is True, never fewer than its saturated
    throughput on `burst` allows (a finite trace would hide a queue that only grows)."""
    result, _ = run_metered(server, burst, arrived)
    capacity = len(burst) / result.wall_s
    tried: dict[int, bool] = {}

    def meets(R: int) -> bool:
        if R not in tried:
            tried[R] = rate / R <= capacity and run(rate / R)
        return tried[R]

    start = min(MAX_REPLICAS, max(1, math.ceil(rate / capacity)))
    return fewest_replicas(meets, start, MAX_REPLICAS, give_up=lambda R: rate / R / capacity < IDLE_UTILISATION)


def aggregated(servers: list[GpuServer], workload: Workload, rate: float, slo: Slo) -> Side:
    """The fewest GPUs of R replicas x one TP width meeting the SLO, with its steps' facts."""
    best: Side | None = None
    for server in servers:
        runs = {}  # offered rate -> (result, meter): the chosen size's run is one of them

        def ok(r: float, server=server, runs=runs) -> bool:
            runs[r] = run_metered(server, workload.trace(r))
            return slo.met(*_p99s(runs[r][0].records, runs[r][0].wall_s)[:2])

        R = _fewest(ok, rate, workload.burst(), server)
        if R is None or (best is not None and R * server.tp >= best.gpus):
            continue
        result, meter = runs[rate / R]
        ttft, tpot, out = _p99s(result.records, result.wall_s)
        best = Side(f"aggregated {R} x TP {server.tp}", R * server.tp, ttft, tpot, out * R, step_facts([meter]))
    return best or Side("aggregated", None)


def disaggregated(pre: list[GpuServer], dec: list[GpuServer], workload: Workload, rate: float, slo: Slo, link: Link):
    """The fewest GPUs of x prefill and y decode instances meeting the SLO (see the module docstring)."""
    first = [SimRequest(r.arrival_s, r.prompt_tokens, 1) for r in workload.burst()]
    sized_p = [(x * s.tp, x, s) for s in pre if (x := _fewest(_ttft_ok(s, workload, slo), rate, first, s))]
    arrived = [
        SimRequest(0.0, r.prompt_tokens + 1, r.output_tokens - 1) for r in workload.burst() if r.output_tokens > 1
    ]
    sized_d = [
        (y * s.tp, y, s)
        for s in dec
        if (y := _fewest(_tpot_ok(s, workload, slo, link, pre[0]), rate, arrived, s, True))
    ]
    if not sized_p or not sized_d:
        return Side("disaggregated", None)
    (_, x, ps), (_, y, ds) = min(sized_p, key=lambda t: t[0]), min(sized_d, key=lambda t: t[0])
    for _ in range(GROW_TRIES + 1):
        d = Disagg(ps, ds, x, y, link)
        result = simulate_disagg(d, workload.trace(rate))
        ttft, tpot, out = _p99s(result.records, result.wall_s)
        if slo.met(ttft, tpot):
            return _disagg_side(d, result, (ttft, tpot, out), workload)
        x, y = x + (not slo.met(ttft, 0.0)), y + (not slo.met(0.0, tpot))
    return Side(f"disaggregated (tried up to {d.x}P{d.y}D)", None)


def _ttft_ok(server: GpuServer, workload: Workload, slo: Slo):
    def ok(r: float) -> bool:  # a prefill instance alone: each request's first token
        result, _ = run_metered(server, [SimRequest(q.arrival_s, q.prompt_tokens, 1) for q in workload.trace(r)])
        return slo.met(_p99s(result.records, result.wall_s)[0], 0.0)

    return ok


def _tpot_ok(server: GpuServer, workload: Workload, slo: Slo, link: Link, pre: GpuServer):
    def ok(r: float) -> bool:  # a decode instance alone: the K/V lands at arrival; TPOT counts its transfer too
        trace = [SimRequest(q.arrival_s, q.prompt_tokens + 1, q.output_tokens - 1) for q in workload.trace(r)]
        result, _ = run_metered(server, [q for q in trace if q.output_tokens >= 1], arrived=True)
        d = Disagg(pre, server, 1, 1, link)
        tpots = sorted(
            (rec.end - rec.start + d.transfer_s(rec.usage_prompt_tokens - 1)) / rec.n_out
            for rec in result.records
            if rec.ok
        )
        return bool(tpots) and slo.met(0.0, tpots[min(len(tpots) - 1, math.ceil(0.99 * len(tpots)) - 1)])

    return ok


def _disagg_side(d: Disagg, result, p99s, workload: Workload) -> Side:
    facts = step_facts(result.decode_meters)
    pre = step_facts(result.prefill_meters)
    prompts = [r.usage_prompt_tokens for r in result.records if r.ok and r.n_out >= 2]
    kvb = d.prefill.layout.kv_bytes
    mean_bytes = fmean(kv_transfer_bytes(d.prefill.spec, P, kvb, 1, 1) for P in prompts) if prompts else 0.0
    facts |= {
        "prefill_step_s": pre["prefill_step_s"],
        "prefill_tokens": pre["prefill_tokens"],
        "transfer_s": fmean(result.transfer_s) if result.transfer_s else 0.0,
        "transfer_bytes": mean_bytes,
        "prefill_busy": result.busy(result.prefill_meters),
        "decode_busy": result.busy(result.decode_meters),
        "link": d.link.name,
    }
    name = f"disaggregated {d.x}P{d.y}D (prefill TP {d.prefill.tp}, decode TP {d.decode.tp})"
    return Side(name, d.gpus, *p99s, facts)


def compare(
    spec: ModelSpec,
    workload: Workload,
    rate: float,
    slo: Slo,
    gpu: str,
    engine: str,
    link: Link,
    weights: str = "bfloat16",
    kv: str | None = None,
    tps: tuple[int, ...] = (1, 2, 4, 8),
) -> Verdict:
    """Aggregated against disaggregated for `workload` at `rate` requests/s (Poisson) within `slo`, on `gpu`
    served by `engine`, every TP width in `tps` tried for each pool; see the module docstring."""
    if rate <= 0:
        raise BadInput(f"--disagg plans at a Poisson --rate > 0, got {rate}")
    servers = []
    for T in tps:
        try:
            servers.append(GpuServer.of(spec, gpu, engine, weights, kv, T))
        except BadInput:  # the heads do not split T ways, or the weights leave no KV cache
            continue
    longest = workload.prompts.hi + workload.outputs.hi
    servers = [s for s in servers if s.tokens >= longest]
    if not servers:
        raise BadInput(f"no TP width in {tps} holds {spec.name}'s longest request ({longest:,} tokens) on {gpu}")
    agg = aggregated(servers, workload, rate, slo)
    dis = disaggregated(servers, servers, workload, rate, slo, link)
    if agg.gpus is None and dis.gpus is None:
        return Verdict(agg, dis, "neither", ["no aggregated or disaggregated size tried meets the SLO"], rate)
    winner = "disaggregated" if agg.gpus is None or (dis.gpus is not None and dis.gpus < agg.gpus) else "aggregated"
    return Verdict(agg, dis, winner, explain(agg, dis, winner, slo), rate)


def explain(agg: Side, dis: Side, winner: str, slo: Slo) -> list[str]:
    """Why `winner` won, in the step model's numbers: what a prefill chunk does to the decode rows sharing its step
    (aggregated) against the transfer and the idle GPUs a split pays for (disaggregated)."""
    why = []
    if agg.gpus is None:
        why.append("aggregated: no replica count tried meets the SLO (each replica's steps mix prefill into decode)")
    else:
        a = {k: v * 1e3 if k.endswith("_s") else v for k, v in agg.facts.items()}  # seconds as ms
        stall = a["prefill_step_s"] - a["decode_step_s"]
        why.append(
            f"aggregated: {a['prefill_share']:.0%} of steps carry prompt tokens (mean {a['prefill_tokens']:,.0f}); "
            f"such a step takes {a['prefill_step_s']:.1f} ms against {a['decode_step_s']:.1f} ms for a decode-only "
            f"step of {_rows(a['decode_rows'])}, so each decode row in it ({a['stalled_rows']:.0f} on average) "
            f"waits {stall:.1f} ms more: p99 TPOT {agg.tpot_p99_s * 1e3:.1f} ms"
        )
    if dis.gpus is None:
        why.append("disaggregated: no xPyD size tried meets the SLO")
    else:
        d = {k: v * 1e3 if k.endswith("_s") else v for k, v in dis.facts.items()}
        why.append(
            f"disaggregated: a decode step takes {d['decode_step_s']:.1f} ms at {_rows(d['decode_rows'])} with no "
            f"prefill in it; a prompt's K/V ({d['transfer_bytes'] / 1e6:,.0f} MB) takes {d['transfer_s']:.2f} ms over "
            f"{d['link']}; the prefill GPUs run steps {d['prefill_busy']:.0%} of the time (idle the rest), the decode "
            f"GPUs {d['decode_busy']:.0%}: p99 TPOT {dis.tpot_p99_s * 1e3:.1f} ms"
        )
    if agg.gpus is not None and dis.gpus is not None:
        fewer, more = sorted((agg.gpus, dis.gpus))
        if winner == "disaggregated":
            why.append(f"so disaggregated needs {_gpus(fewer)} against {more}: the stalls cost more than the split")
        elif fewer == more:
            why.append(f"both need {_gpus(fewer)}: aggregated wins the tie (no transfer, one pool to run)")
        else:
            why.append(
                f"so aggregated needs {_gpus(fewer)} against {more}: the split's idle GPUs and transfers cost more"
            )
    return why
