"""`prefill plan --disagg` and `--pareto`'s reports, and `prefill simulate --disagg`'s deployment: each calls one
function of prefill.plan (disagg_plan.compare, pareto.sweep, disagg.simulate_disagg) and prints it."""

from __future__ import annotations

import json

import typer

from prefill.bench.results import parse_ints
from prefill.cli.common import console, note


def disagg_report(model: str, workload, load, slo, choices: tuple, link: str, as_json: bool) -> None:
    """--disagg: aggregated against disaggregated (prefill.plan.disagg_plan.compare) for each GPU and engine of
    `choices` (prices, engines, weights, kv, tps, as plan's)."""
    import dataclasses

    from prefill.costmodel.links import get_link
    from prefill.costmodel.specs import load_spec
    from prefill.errors import BadInput
    from prefill.plan.disagg_plan import compare

    if load.rate is None:
        raise BadInput("--disagg plans at a Poisson --rate (a closed loop spans both pools); give --rate")
    spec, lk = load_spec(model), get_link(link)
    prices, engines, weights, kv, tps = choices
    verdicts = []
    for gpu in prices:
        for engine in engines:
            if not as_json:
                note(f"{gpu}, {engine}: sizing aggregated and disaggregated deployments (simulated)")
            v = compare(spec, workload, load.rate, slo, gpu, engine, lk, weights[0], kv, tps)
            verdicts.append((gpu, engine, v))
    if as_json:
        rows = [{"gpu": g, "engine": e, **dataclasses.asdict(v)} for g, e, v in verdicts]
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    for gpu, engine, v in verdicts:
        console.print(f"{spec.name} on {gpu} ({engine}), Poisson {load.rate:g} req/s: {v.describe()}", highlight=False)


def pareto_report(model: str, workload, slo, choices: tuple, link: str, path: str, splits: str, caps: str = "") -> None:
    """--pareto: the frontier of tokens/s per GPU against tokens/s per user (prefill.plan.pareto), written as a
    PNG at `path` and JSON beside it, the cheapest point meeting the SLO printed; `splits`: xPyD, comma-separated;
    `caps`: max running requests to sweep beside each engine's default, comma-separated ("": none)."""
    from pathlib import Path

    from prefill.costmodel.links import get_link
    from prefill.costmodel.specs import load_spec
    from prefill.plan.disagg import parse_xpyd
    from prefill.plan.pareto import Space, cheapest, frontier, plot, sweep, usd_per_million, write_json

    spec = load_spec(model)
    prices, engines, weights, kv, tps = choices
    gpu, price = next(iter(prices.items()))
    xpyd = tuple(parse_xpyd(s) for s in splits.split(",") if s.strip())
    caps_n = parse_ints(caps, "--max-running") if caps.strip() else ()
    space = Space(gpu, engines, tps, (None, *caps_n), xpyd, link=get_link(link), weights=weights[0], kv=kv)
    note(
        f"sweeping {spec.name} on {gpu}: engines {', '.join(engines)}, TP {tps}, splits {splits or 'none'} (simulated)"
    )
    points = sweep(spec, workload, space, slo)
    png = plot(path, points, slo, f"{spec.name} on {gpu}: output tokens/s per GPU against per user (simulated)")
    data = write_json(Path(path).with_suffix(".json"), points, slo)
    front, best = frontier(points), cheapest(points)
    console.print(f"{len(points)} points, {len(front)} on the frontier: {png}, {data}", highlight=False)
    for p in front:
        mark = " <- cheapest meeting the SLO" if p == best else ""
        console.print(
            f"  {p.config} at {p.rate:.3g} req/s: {p.tok_s_per_gpu:,.0f} tok/s per GPU, {p.tok_s_per_user:,.1f} tok/s "
            f"per user, p99 TTFT {p.ttft_p99_s * 1e3:,.0f} ms, TPOT {p.tpot_p99_s * 1e3:,.1f} ms{mark}",
            highlight=False,
        )
    if best is None:
        console.print("no point meets the SLO", highlight=False)
    else:
        console.print(
            f"cheapest meeting the SLO: {best.config} at {best.rate:.3g} req/s, {best.tok_s_per_gpu:,.0f} tok/s per "
            f"GPU (${usd_per_million(best, price):.3f} per million output tokens at ${price}/GPU-hour)",
            highlight=False,
        )


def simulate_disagg_engine(
    model, hardware: str, engine: str, weights, kv, tps: tuple[int, int], xpyd: str, link: str, trace
):
    """simulate --disagg xPyD: the trace on x prefill and y decode instances (prefill.plan.disagg)."""
    from prefill.costmodel.links import get_link
    from prefill.costmodel.specs import load_spec
    from prefill.errors import BadInput
    from prefill.plan.disagg import Disagg, parse_xpyd, simulate_disagg
    from prefill.plan.gpu_serving import GpuServer

    if model is None:
        raise BadInput("--disagg simulates a GPU deployment: give --model (a preset such as llama-3.1-8b)")
    x, y = parse_xpyd(xpyd)
    spec = load_spec(model)
    pre, dec = (GpuServer.of(spec, hardware, engine, weights or "bfloat16", kv, t) for t in tps)
    d = Disagg(pre, dec, x, y, get_link(link))
    return simulate_disagg(d, trace), d.name
