"""`prefill simulate`: a loaded server predicted, the step loop's own policy on a simulated clock
(prefill.plan.simulate), reported as `prefill loadtest` reports a measured one."""

from __future__ import annotations

from typing import Annotated

import typer

from prefill.cli.common import console, note
from prefill.cli.disagg_report import simulate_disagg_engine
from prefill.cli.loadtest import PromptLen, SloTpotMs, SloTtftMs, print_summary, seconds
from prefill.costmodel.engines import gpu_weights_help

SimModel = Annotated[str | None, typer.Option("--model", "-m", help="Preset, .gguf or config.json (default: SmolLM2)")]
SimHardware = Annotated[
    str, typer.Option(help="cpu (this machine's profile, probed once) or a catalog GPU (h100, ...)")
]
SimDtype = Annotated[str | None, typer.Option(help="compute dtype (default: float32 on cpu, bfloat16 on a GPU)")]
SimWeights = Annotated[
    str | None,
    typer.Option(
        help=f"weights stored as: on cpu a dtype or GGUF type, on a GPU {gpu_weights_help()} (default: the dtype)"
    ),
]
Rate = Annotated[float, typer.Option(help="Poisson arrival rate, requests/s")]
Requests = Annotated[int, typer.Option(help="requests in the trace")]
OutputLen = Annotated[str, typer.Option(help="output tokens: 64, 16:128 (uniform) or @file")]
ChunkSize = Annotated[int, typer.Option(help="cpu: prefill chunk in tokens (as prefill serve --chunk-size)")]
MaxRunning = Annotated[int, typer.Option(help="cpu: requests running at once (as prefill serve --max-running)")]
KvCacheMb = Annotated[float, typer.Option(help="cpu: the KV pool in MiB (as prefill serve --kv-cache-mb)")]
Seed = Annotated[int, typer.Option(help="seed of arrivals and lengths")]
JsonOut = Annotated[bool, typer.Option("--json", help="print the summary as one JSON object")]
Engine = Annotated[
    str | None,
    typer.Option(
        help="a catalog GPU served by vllm (the default), sglang, trtllm or prefill: that engine's scheduling "
        "defaults, memory fraction and kernels (on a GPU these replace --chunk-size, --max-running, --kv-cache-mb)"
    ),
]
Tp = Annotated[int, typer.Option(help="with --engine: GPUs the model is split over (tensor parallelism)")]
KvDtype = Annotated[str | None, typer.Option("--kv-dtype", help="with --engine: KV cache as bfloat16, float16 or fp8")]
DEFAULT_GPU_ENGINE = "vllm"  # a catalog GPU without --engine: the engine most deployments run
Disagg = Annotated[
    str | None,
    typer.Option(help="xPyD: x prefill and y decode instances of --engine on --hardware, K/V shipped over --link"),
]
Link = Annotated[
    str, typer.Option(help="with --disagg: the K/V link: nvlink, nvlink3, ib-ndr, roce-400g, ib-hdr, eth-25g")
]
DecodeTp = Annotated[int | None, typer.Option(help="with --disagg: the decode instances' TP width (default --tp)")]
Plan = Annotated[
    bool, typer.Option("--plan", help="a catalog GPU: replicas per TP width for p99 TTFT <= --slo-ttft-ms at --rate")
]


def simulate(
    model: SimModel = None,
    hardware: SimHardware = "cpu",
    dtype: SimDtype = None,
    weights: SimWeights = None,
    rate: Rate = 1.0,
    requests: Requests = 200,
    prompt_len: PromptLen = "128",
    output_len: OutputLen = "64",
    chunk_size: ChunkSize = 256,
    max_running: MaxRunning = 32,
    kv_cache_mb: KvCacheMb = 2048.0,
    slo_ttft_ms: SloTtftMs = None,
    slo_tpot_ms: SloTpotMs = None,
    seed: Seed = 0,
    json_out: JsonOut = False,
    plan: Plan = False,
    engine: Engine = None,
    tp: Tp = 1,
    kv_dtype: KvDtype = None,
    disagg: Disagg = None,
    link: Link = "nvlink",
    decode_tp: DecodeTp = None,
) -> None:
    """Predict TTFT, ITL and E2E percentiles of a server under Poisson load: its own scheduler, the time model."""
    from prefill.loadtest.client import PromptLengths
    from prefill.plan.simulate import poisson_trace

    engine, work = (
        engine_of(hardware, engine, json_out),
        (PromptLengths.parse(prompt_len), PromptLengths.parse(output_len)),
    )
    if plan:
        deployment = (engine or DEFAULT_GPU_ENGINE, weights or dtype or "bfloat16", kv_dtype)
        return plan_deployment(model, hardware, deployment, rate, slo_ttft_ms, (requests, *work, seed), json_out)
    path, sizes = (engine, dtype, weights, kv_dtype), (chunk_size, max_running, kv_cache_mb)
    trace = poisson_trace(rate, requests, *work, seed)
    result, name = run_trace(model, hardware, path, (tp, decode_tp or tp), (disagg, link), sizes, trace, json_out)
    label = f"simulated: {name}, Poisson {rate} req/s, prompts {prompt_len}, outputs {output_len}"
    report_load(result, name, label, (slo_ttft_ms, slo_tpot_ms), json_out)


def engine_of(hardware: str, engine: str | None, quiet: bool) -> str | None:
    """The engine that runs the simulation: --engine, else on a catalog GPU DEFAULT_GPU_ENGINE (said unless
    `quiet`: a GPU is simulated as an engine runs it), else None (our own server on the CPU)."""
    if hardware.lower() == "cpu" or engine is not None:
        return engine
    if not quiet:
        others = "--engine sglang, trtllm or prefill"
        note(f"no --engine: {DEFAULT_GPU_ENGINE}'s profile and scheduler on {hardware} ({others})")
    return DEFAULT_GPU_ENGINE


def run_trace(model, hardware: str, path: tuple, tps: tuple[int, int], split: tuple, sizes: tuple, trace, quiet: bool):
    """(the simulated load, its name): the trace on what the options name: x prefill and y decode instances
    (split: --disagg xPyD and --link), one engine's GPU deployment, or our own server's scheduler (sizes: chunk,
    max running, KV MiB); path: (engine, dtype, weights, K/V dtype); tps: prefill and decode TP widths."""
    from prefill.plan.simulate import simulate_server

    engine, dtype, weights, kv_dtype = path
    if split[0] is not None:  # prefill.cli.disagg_report
        return simulate_disagg_engine(model, hardware, engine, weights or dtype, kv_dtype, tps, *split, trace)
    if engine is not None:
        return simulate_engine(model, hardware, engine, weights or dtype, kv_dtype, tps[0], trace)
    return simulate_server(model, hardware, dtype, weights, trace, *sizes, echo=None if quiet else note)


def simulate_engine(model, hardware: str, engine: str, weights, kv, tp: int, trace):
    """--engine: the trace on a catalog GPU deployment run by that engine (prefill.plan.gpu_serving)."""
    from prefill.costmodel.specs import load_spec
    from prefill.loading.resolve import default_model_path
    from prefill.plan.gpu_serving import GpuServer

    spec = load_spec(model if model is not None else default_model_path())
    server = GpuServer.of(spec, hardware, engine, weights or "bfloat16", kv, tp)
    return server.run(trace), server.name


def report_load(result, name: str, label: str, slos: tuple, as_json: bool) -> None:
    """The simulated load's summary as `prefill loadtest` prints a measured one (or as JSON); slos: TTFT and
    TPOT SLOs in ms, or None."""
    import json

    from prefill.loadtest.report import summarize

    summary = summarize(result.records, result.wall_s, *map(seconds, slos))
    summary["preemptions"], summary["steps"] = result.preemptions, len(result.steps)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    console.print(label, highlight=False)
    print_summary(name, summary, result.wall_s, *slos)
    console.print(f"{len(result.steps):,} steps, {result.preemptions} preemptions (simulated time)", highlight=False)


def plan_deployment(model, hardware, deployment: tuple, rate, slo_ttft_ms, work: tuple, as_json) -> None:
    """--plan: prefill.plan.capacity.plan on a catalog GPU, printed (or as JSON); deployment: (engine, weights,
    KV dtype); work: the Workload's fields (requests, prompt lengths, output lengths, seed)."""
    import dataclasses
    import json

    from prefill.cli.plan_report import print_plan
    from prefill.costmodel.specs import load_spec
    from prefill.errors import BadInput
    from prefill.loading.resolve import default_model_path
    from prefill.plan.capacity import Workload, plan

    if hardware.lower() == "cpu":
        raise BadInput("--plan sizes a GPU deployment: give a catalog GPU, e.g. --hardware h100")
    if slo_ttft_ms is None:
        raise BadInput("--plan needs --slo-ttft-ms, the p99 TTFT to keep under")
    spec = load_spec(model if model is not None else default_model_path())
    echo = None if as_json else note
    rows = plan(spec, hardware, *deployment, rate, slo_ttft_ms / 1e3, Workload(*work), echo=echo)
    if as_json:
        typer.echo(json.dumps([{**dataclasses.asdict(r), "gpus": r.gpus} for r in rows], indent=2))
        return
    print_plan(f"{spec.name} on {hardware.lower()}, {deployment[0]}", rate, slo_ttft_ms, rows)
