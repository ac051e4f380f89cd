"""`prefill simulate`: a loaded server predicted, the step loop's own policy on a simulated clock
(prefill.bench.simulate), reported as `prefill loadtest` reports a measured one."""

from __future__ import annotations

from typing import Annotated

import typer

from prefill.cli.common import console, note
from prefill.cli.loadtest import PromptLen, SloTpotMs, SloTtftMs, print_summary, seconds

SimModel = Annotated[str | None, typer.Option("--model", "-m", help="Preset, .gguf or config.json (default: SmolLM2)")]
SimHardware = Annotated[
    str, typer.Option(help="cpu (this machine's profile, probed once) or a catalog GPU (h100, ...)")
]
SimDtype = Annotated[str | None, typer.Option(help="compute dtype (default: float32 on cpu, bfloat16 on a GPU)")]
SimWeights = Annotated[str | None, typer.Option(help="weights stored as a dtype or GGUF type (default: the dtype)")]
Rate = Annotated[float, typer.Option(help="Poisson arrival rate, requests/s")]
Requests = Annotated[int, typer.Option(help="requests in the trace")]
OutputLen = Annotated[str, typer.Option(help="output tokens: 64, 16:128 (uniform) or @file")]
ChunkSize = Annotated[int, typer.Option(help="prefill chunk in tokens (as prefill serve --chunk-size)")]
MaxRunning = Annotated[int, typer.Option(help="requests running at once (as prefill serve --max-running)")]
KvCacheMb = Annotated[float, typer.Option(help="the KV pool in MiB (as prefill serve --kv-cache-mb)")]
Seed = Annotated[int, typer.Option(help="seed of arrivals and lengths")]
JsonOut = Annotated[bool, typer.Option("--json", help="print the summary as one JSON object")]


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
) -> None:
    """Predict TTFT, ITL and E2E percentiles of a server under Poisson load: its own scheduler, the time model."""
    import json

    from prefill.bench.loadtest import PromptLengths
    from prefill.bench.loadtest_report import summarize
    from prefill.bench.simulate import poisson_trace, simulate_server

    trace = poisson_trace(rate, requests, PromptLengths.parse(prompt_len), PromptLengths.parse(output_len), seed)
    result, name = simulate_server(
        model, hardware, dtype, weights, trace, chunk_size, max_running, kv_cache_mb, echo=None if json_out else note
    )
    summary = summarize(result.records, result.wall_s, seconds(slo_ttft_ms), seconds(slo_tpot_ms))
    summary["preemptions"], summary["steps"] = result.preemptions, len(result.steps)
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
        return
    console.print(
        f"simulated: {name}, Poisson {rate} req/s, prompts {prompt_len}, outputs {output_len}", highlight=False
    )
    print_summary(name, summary, result.wall_s, slo_ttft_ms, slo_tpot_ms)
    console.print(f"{len(result.steps):,} steps, {result.preemptions} preemptions (simulated time)", highlight=False)
