"""`prefill calibrate`: measure this machine again with its one probe, at a model's shapes, and show the profile
every prediction then uses (GEMM rate by M, attention, bandwidth, overhead). Parse, call, print."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefill.cli.common import AutoDtype, Weights, console, fail, note, open_engine

MODEL_HELP = "Preset, .gguf or HF folder (default: the embedded SmolLM2)"


def calibrate(
    model: Annotated[str | None, typer.Option("--model", "-m", help=MODEL_HELP)] = None,
    dtype: AutoDtype = "auto",
    weights: Weights = "auto",
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: torch's choice)")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile as one JSON object")] = False,
) -> None:
    """Probe this machine again (a few seconds): GEMM rates by row count at the model's shapes, attention,
    streaming bandwidth and per-operation overhead; cached for every later prediction."""
    import json

    from prefill.device.cache import cache_dir
    from prefill.machine.native import resolve_dtype
    from prefill.machine.profiles import PROFILE_FILE, probe_profile, profile_for

    if threads is not None and threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    echo = None if json_out else note
    if model is None or Path(model).exists():  # a model file: probe the kernels its engine runs (GGUF blocks too)
        engine, dtype, _ = open_engine(model, dtype, weights, device, threads, deterministic=False)
        spec, qtypes = engine.spec, engine.weight_types()
    else:  # a preset: its shapes only
        from prefill.costmodel.specs import load_spec

        spec, qtypes, dtype = load_spec(model), {}, resolve_dtype(dtype, device, echo=echo)
    profile = probe_profile(spec, dtype, device, threads, refresh=True, echo=echo, qtypes=qtypes)
    used = profile_for(spec, dtype, device, threads, qtypes=qtypes)  # the profile just probed, with any fit
    if json_out:
        typer.echo(json.dumps(profile.to_json(), indent=2))
        return
    console.print(profile_table(profile))
    console.print(f"saved in {cache_dir() / PROFILE_FILE}", highlight=False)
    if used.kind == "fitted":
        console.print(
            f"predictions for {spec.name} apply a fit on top of it ({used.source}); rerun "
            "benchmarks/predict.py to fit again",
            highlight=False,
        )


def profile_table(p):
    """A rich table of a MachineProfile: each GEMM shape's rate by M, then attention and the memory system."""
    from rich.table import Table

    Ms = sorted({m for c in p.gemm for m, _ in c.points})
    title = f"{p.name}: GEMM GFLOP/s by rows M (weights streamed)"
    t = Table(title=title, title_justify="left", caption=_caption(p), caption_justify="left")
    t.add_column("[M, K] x [K, N]")
    for M in Ms:
        t.add_column(f"M={M}", justify="right")
    for c in p.gemm:
        rates = dict(c.points)
        t.add_row(f"K={c.K}, N={c.N}", *(f"{rates[M] / 1e9:.1f}" if M in rates else "-" for M in Ms))
    return t


def _caption(p) -> str:
    prefill = ", ".join(f"P={n} {r / 1e9:.1f}" for n, r in p.attention)
    decode = ", ".join(f"S={n} {r / 1e9:.1f}" for n, r in p.attention_decode)
    memory = f"{p.bandwidth_bytes_per_s / 1e9:.1f} GB/s streaming"
    if p.cache_bandwidth_bytes_per_s:
        memory += f", {p.cache_bandwidth_bytes_per_s / 1e9:.1f} GB/s within {p.cache_bytes / 2**20:.0f} MiB of cache"
    return (
        f"attention GFLOP/s: causal prefill {prefill}; one decode query over S keys {decode}\n"
        f"memory: {memory}; per launch {p.op_overhead_s * 1e6:.2f} us\n{p.source}"
    )
