"""`prefill plan`: the cheapest GPU deployment for a model, a workload and a latency SLO
(prefill.plan.planner), and the command that launches it."""

from __future__ import annotations

from typing import Annotated

import typer

from prefill.bench.results import parse_ints
from prefill.cli.common import console, note
from prefill.cli.disagg_report import disagg_report, pareto_report
from prefill.costmodel.engines import gpu_weights_help

Model = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", help="the model: a preset (llama-3.1-8b, ...) or a config.json (--fit on cpu: the report's)"
    ),
]
PromptLen = Annotated[str, typer.Option(help="prompt tokens a request: 1000, 200:2000 (uniform) or @file (one a line)")]
OutputLen = Annotated[str, typer.Option(help="output tokens per request: 200, 50:400 (uniform) or @file")]
Rate = Annotated[float | None, typer.Option(help="requests arriving per second (Poisson); or give --concurrency")]
Concurrency = Annotated[int | None, typer.Option(help="users sending one request after another; or give --rate")]
SloTtft = Annotated[float | None, typer.Option("--slo-ttft-ms", help="p99 time to first token to stay under, ms")]
SloTpot = Annotated[float | None, typer.Option("--slo-tpot-ms", help="p99 time per output token to stay under, ms")]
Prices = Annotated[
    str, typer.Option(help="$ per GPU-hour of each GPU to consider, e.g. h100=2.99,h200=3.29 (the GPUs tried)")
]
Engines = Annotated[str, typer.Option(help="engines to consider: vllm, sglang, trtllm, prefill (comma-separated)")]
Weights = Annotated[str, typer.Option(help=f"weight precisions to consider, comma-separated: {gpu_weights_help()}")]
KvDtype = Annotated[str | None, typer.Option("--kv-dtype", help="KV cache precision: bfloat16, float16 or fp8")]
Tps = Annotated[str, typer.Option(help="tensor-parallel widths to consider (GPUs per replica), e.g. 1,2,4,8")]
Requests = Annotated[int, typer.Option(help="requests simulated per candidate (more: steadier p99s, slower)")]
Seed = Annotated[int, typer.Option(help="seed of the simulated arrivals and lengths")]
JsonOut = Annotated[bool, typer.Option("--json", help="print the ranked options as JSON")]
Fit = Annotated[
    str | None,
    typer.Option(
        help="a `prefill loadtest --out` report measured on your deployment: refit the engine's bandwidth and GEMM "
        "efficiencies to it (with --hardware, --engine, --tps, --weights as deployed) and say how far they moved"
    ),
]
Hardware = Annotated[
    str, typer.Option(help="with --fit: the GPU the load test ran on (h100, h200, ...), or cpu (this machine)")
]
FitEngine = Annotated[str, typer.Option("--engine", help="with --fit: the engine the load test measured")]
Disagg = Annotated[
    bool, typer.Option("--disagg", help="compare aggregated and disaggregated (xPyD) deployments: which wins and why")
]
Link = Annotated[
    str, typer.Option(help="with --disagg/--pareto: the K/V link: nvlink, nvlink3, ib-ndr, roce-400g, ib-hdr, eth-25g")
]
Pareto = Annotated[
    str | None,
    typer.Option(help="write the Pareto frontier (tokens/s per GPU against per user) to this PNG, and JSON beside it"),
]
Splits = Annotated[str, typer.Option(help="with --pareto: xPyD splits to sweep as well, e.g. 1P1D,2P1D (none: '')")]
MaxRunning = Annotated[
    str, typer.Option(help="with --pareto: caps on running requests to sweep beside each engine's own, e.g. 16,64")
]


def plan(
    model: Model = None,
    prompt_len: PromptLen = "1000",
    output_len: OutputLen = "200",
    rate: Rate = None,
    concurrency: Concurrency = None,
    slo_ttft_ms: SloTtft = None,
    slo_tpot_ms: SloTpot = None,
    usd_per_gpu_hour: Prices = "h100=2.99,h200=3.29",
    engines: Engines = "vllm,sglang",
    weights: Weights = "bfloat16",
    kv_dtype: KvDtype = None,
    tps: Tps = "1,2,4,8",
    requests: Requests = 200,
    seed: Seed = 0,
    json_out: JsonOut = False,
    fit: Fit = None,
    hardware: Hardware = "h100",
    engine: FitEngine = "vllm",
    disagg: Disagg = False,
    link: Link = "nvlink",
    pareto: Pareto = None,
    splits: Splits = "1P1D,2P1D,1P2D",
    max_running: MaxRunning = "",
) -> None:
    """Which GPU, how many per replica (TP), how many replicas and which engine serve your workload within its
    latency SLO at the lowest cost per million output tokens: each candidate is simulated under the load."""
    if fit is not None:
        return fit_command(model, fit, hardware, engine, weights, kv_dtype, tps)
    lengths = (prompt_len, output_len)
    workload, load, slo = plan_inputs(model, lengths, requests, seed, (rate, concurrency), (slo_ttft_ms, slo_tpot_ms))
    choices = (parse_prices(usd_per_gpu_hour), _names(engines), _names(weights), kv_dtype, parse_ints(tps, "--tps"))
    if disagg:  # prefill.cli.disagg_report
        return disagg_report(model, workload, load, slo, choices, link, json_out)
    if pareto is not None:
        return pareto_report(model, workload, slo, choices, link, pareto, splits, max_running)
    run_plan(model, workload, load, slo, choices, json_out, f"prompts {prompt_len}, outputs {output_len}")


def plan_inputs(model: str | None, lengths: tuple[str, str], requests: int, seed: int, load: tuple, slos: tuple):
    """(Workload, Load, Slo) of plan's options: `lengths` the prompt and output lengths' texts, `load` (rate,
    concurrency), `slos` (TTFT, TPOT) in ms or None; BadInput without a model."""
    from prefill.errors import BadInput
    from prefill.loadtest.client import PromptLengths
    from prefill.plan.capacity import Workload
    from prefill.plan.planner import Load, Slo

    if model is None:
        raise BadInput("prefill plan needs --model (a preset such as llama-3.1-8b, or a config.json)")
    workload = Workload(requests, *(PromptLengths.parse(text) for text in lengths), seed)
    return workload, Load(*load), Slo(*(None if x is None else x / 1e3 for x in slos))


def fit_command(model: str | None, fit: str, hardware: str, engine: str, weights: str, kv_dtype, tps: str) -> None:
    """--fit: our own CPU server's prediction refit to a load test's records (--hardware cpu), or an engine's
    efficiencies on a catalog GPU refit to them."""
    from prefill.errors import BadInput

    if hardware.lower() == "cpu":
        return cpu_fit_report(fit)
    if model is None:
        raise BadInput("prefill plan --fit on a GPU needs --model (a preset such as llama-3.1-8b, or a config.json)")
    return fit_report(model, fit, hardware, engine, _names(weights)[0], kv_dtype, parse_ints(tps, "--tps")[0])


def run_plan(model: str, workload, load, slo, choices: tuple, json_out: bool, lengths: str) -> None:
    """The ranked options (prefill.plan.planner.plan_deployments), printed or as JSON, the search's progress on
    stderr; exit code 1 when no candidate meets the SLO."""
    import dataclasses
    import json

    from prefill.cli.plan_report import print_deployments, searching
    from prefill.costmodel.specs import load_spec
    from prefill.plan.planner import plan_deployments, reachable

    spec = load_spec(model)
    with searching() as progress:
        options = plan_deployments(spec, workload, load, slo, *choices, progress=progress)
    met = any(o.replicas is not None for o in options)
    if json_out:
        typer.echo(json.dumps([{**dataclasses.asdict(o), "gpus": o.gpus} for o in options], indent=2))
    else:
        console.print(f"{spec.name}: {_load_text(load)}, {lengths}", highlight=False)
        print_deployments(options, *(None if x is None else x * 1e3 for x in (slo.ttft_p99_s, slo.tpot_p99_s)))
    if not met:
        note(f"no candidate meets the SLO; {reachable(options)}")
        raise typer.Exit(1)


def fit_report(model: str, path: str, hardware: str, engine: str, weights: str, kv: str | None, tp: int) -> None:
    """--fit: the load test's trace simulated before and after refitting the engine's efficiencies."""
    from pathlib import Path

    from prefill.costmodel.specs import load_spec
    from prefill.plan.engine_fit import fit_engine, read_records
    from prefill.plan.gpu_serving import GpuServer

    records, config = read_records(Path(path))
    server = GpuServer.of(load_spec(model), hardware, engine, weights, kv, tp)
    note(f"refitting {server.name} to {len(records)} measured requests ({path})")
    result = fit_engine(server, records, config.get("concurrency") if config.get("rate") is None else None)
    console.print(result.describe(), highlight=False)


def cpu_fit_report(path: str) -> None:
    """--fit --hardware cpu: the load test's own CPU prediction (the report keeps it) refit (bench.cpu_fit)."""
    import json
    from pathlib import Path

    from prefill.plan.cpu_fit import fit_cpu, saved_server
    from prefill.plan.engine_fit import read_records

    records, config = read_records(Path(path))
    server = saved_server(json.loads(Path(path).read_text()), echo=note)
    note(f"refitting {server.name} to {len(records)} measured requests ({path})")
    result = fit_cpu(server, records, config.get("concurrency") if config.get("rate") is None else None)
    console.print(result.describe(), highlight=False)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_prices(text: str) -> dict[str, float]:
    """'h100=2.99,h200=3.29' -> {"h100": 2.99, "h200": 3.29}; BadInput on anything else."""
    from prefill.costmodel.hardware import get_hardware, hardware_names
    from prefill.errors import BadInput

    out = {}
    for item in _names(text):
        gpu, _, price = item.partition("=")
        try:
            out[gpu.strip().lower()] = float(price)
        except ValueError:
            raise BadInput(f"--usd-per-gpu-hour wants gpu=dollars pairs like h100=2.99, got {item!r}") from None
        if out[gpu.strip().lower()] <= 0:
            raise BadInput(f"a GPU-hour costs more than $0, got {item!r}")
        try:
            get_hardware(gpu.strip())
        except BadInput:
            gpus = ", ".join(n for n in hardware_names() if n != "cpu")
            raise BadInput(f"--usd-per-gpu-hour: {gpu.strip()!r} is not in the GPU catalog; known: {gpus}") from None
    if not out:
        raise BadInput("--usd-per-gpu-hour names no GPU; e.g. h100=2.99")
    return out


def _load_text(load) -> str:
    return f"Poisson {load.rate:g} req/s" if load.rate is not None else f"{load.concurrency} users at once"
