"""`prefill bench`: our prefill against its peers on the same tokens, dtypes and threads, the cost model beside
every point."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from prefill.cli.common import Activations, check_activations, console, err_console, wide_console

Model = Annotated[str | None, typer.Option("--model", "-m", help=".gguf file or HF folder; default: SmolLM2.")]
PromptLengths = Annotated[str, typer.Option("--prompt-lengths", help="P values.")]
Dtypes = Annotated[str, typer.Option("--dtypes", help="Comma-separated dtypes; auto: the ones native here.")]
Repeats = Annotated[int, typer.Option("--repeats", help="Timed warm runs per point (median and p90).")]
Warmup = Annotated[int, typer.Option("--warmup", help="Untimed runs after the cold run.")]
Peers = Annotated[str, typer.Option("--peers", help="Peers to run beside ours, or 'none'.")]
Threads = Annotated[int | None, typer.Option("--threads", help="Threads for every engine (default: all cores).")]
Calibrate = Annotated[bool, typer.Option("--calibrate", help="Fit overhead + linear/attention rates and save.")]
CALIBRATE_ON_HELP = "Prompt lengths to fit on (default: the 2nd-shortest and the longest)."
CalibrateOn = Annotated[str | None, typer.Option("--calibrate-on", help=CALIBRATE_ON_HELP)]
CHUNK_SIZE_HELP = "Chunk sizes C to sweep at the longest P, e.g. 256,512,1024."
ChunkSizes = Annotated[str | None, typer.Option("--chunk-size", help=CHUNK_SIZE_HELP)]
Out = Annotated[str, typer.Option("--out", help="Folder for bench.json and the PNG plots.")]
Device = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
Compile = Annotated[bool, typer.Option("--compile", help="Also time ours with torch.compile (eager and compiled).")]
Weights = Annotated[str, typer.Option(help="auto, native (the GGUF's own blocks), float32 or bfloat16")]
LLAMA_BENCH_HELP = "Instead: ours vs llama.cpp on the same GGUF, pp P and tg @ 64 / 1,024 tokens (llama-bench's)."
LlamaBench = Annotated[bool, typer.Option("--llama-bench", help=LLAMA_BENCH_HELP)]
CpuTime = Annotated[bool, typer.Option("--cpu-time", help="With --llama-bench --threads 1: thread CPU time.")]
Force = Annotated[bool, typer.Option("--force", help="Measure an emulated dtype at every P, not just the smallest.")]


def bench(
    model: Model = None,
    prompt_lengths: PromptLengths = "32,128,512,1024,2048,4096",
    dtypes: Dtypes = "auto",
    repeats: Repeats = 5,
    warmup: Warmup = 1,
    peers: Peers = "transformers,llamacpp",
    threads: Threads = None,
    calibrate: Calibrate = False,
    calibrate_on: CalibrateOn = None,
    chunk_size: ChunkSizes = None,
    out: Out = "bench-results",
    device: Device = "cpu",
    compile: Compile = False,
    force: Force = False,
    weights: Weights = "auto",
    llama_bench: LlamaBench = False,
    cpu_time: CpuTime = False,
    activations: Activations = "auto",
) -> None:
    """Benchmark prefill: our engine and its peers on the same tokens, dtypes and threads, with predictions."""
    from prefill.bench.results import BenchConfig
    from prefill.bench.runner import prepare

    check_activations(activations)
    if llama_bench:
        clock = "cpu" if cpu_time else "wall"
        return versus_llama(model, weights, threads, repeats, Path(out), clock, activations)
    lists = parse_lists(prompt_lengths, dtypes, peers, calibrate_on, chunk_size)
    runs = {"repeats": repeats, "warmup": warmup, "threads": threads, "device": device, "compile": compile}
    runs["weights"], runs["activations"] = weights, activations
    config, plan, _, _ = prepare(BenchConfig(model=model, calibrate=calibrate, force=force, **runs, **lists))
    wide = wide_console(140)
    print_plan(wide, config, plan)
    result = measure(config, plan)
    print_result(wide, result)
    save(result, Path(out))


def versus_llama(
    model: str | None, weights: str, threads: int | None, repeats: int, out: Path, clock: str, activations: str = "auto"
) -> None:
    """Ours vs llama.cpp on the same GGUF file (llama-bench's conventions), a table and out/versus.json: every
    path auto weighs, or the blocks on the one `activations` names."""
    import json
    import os

    from prefill.bench.versus import VersusConfig, run_versus, to_json, versus_table
    from prefill.engine.weights import quantized_types, resolve_path
    from prefill.machine.weights import check_weights
    from prefill.model.quant.activations import runs_q8

    counts = (threads,) if threads else tuple(sorted({1, os.cpu_count() or 1}))
    storages, said = (check_weights(weights),), []
    if weights == "auto":  # every path auto may weigh on a file of blocks (dense bfloat16: only if asked), auto's line
        from prefill.device.capability import capability

        q8 = any(runs_q8("q8", t) for t in quantized_types(model)) and activations != "f32"
        blocks = ("native:q8",) if activations == "q8" else ("native", *(("native:q8",) if q8 else ()))
        bf16 = ("bfloat16",) if capability("cpu").native("bfloat16") and activations == "auto" else ()  # not emulated
        storages = (*blocks, *bf16, "float32")
        resolve_path(model, "auto", "auto", echo=said.append, threads=counts[-1], activations=activations)
    config = VersusConfig(model=model, threads=counts, weights=storages, repeats=repeats, clock=clock)
    with err_console.status("ours vs llama.cpp") as status:
        result = run_versus(config, on_step=lambda s: status.update(f"ours vs llama.cpp: {s}"))
    result.notes.extend(said)
    wide_console().print(versus_table(result))
    for note in result.notes:
        console.print(note, highlight=False)
    out.mkdir(parents=True, exist_ok=True)
    (out / "versus.json").write_text(json.dumps(to_json(result), indent=1) + "\n")
    console.print(f"wrote {out / 'versus.json'}", highlight=False)


def parse_lists(prompt_lengths: str, dtypes: str, peers: str, calibrate_on: str | None, chunk_sizes: str | None):
    """The BenchConfig fields given as comma-separated lists; BadInput names the option at fault."""
    from prefill.bench.peers import parse_peers
    from prefill.bench.results import parse_dtypes, parse_ints

    return {
        "prompt_lengths": parse_ints(prompt_lengths, "--prompt-lengths"),
        "dtypes": ("auto",) if dtypes.strip().lower() == "auto" else parse_dtypes(dtypes),
        "peers": parse_peers(peers),
        "calibrate_on": parse_ints(calibrate_on, "--calibrate-on") if calibrate_on else None,
        "chunk_sizes": parse_ints(chunk_sizes, "--chunk-size") if chunk_sizes else (),
    }


def print_plan(wide: Console, config, plan) -> None:
    """The device, the plan's notes and how long the sweep should take."""
    from prefill.bench import report
    from prefill.bench.sweep import duration_text

    wide.print(report.device_line(config.device), highlight=False)
    for note in plan.notes:
        wide.print(f"note: {note}", highlight=False)
    lengths = ", ".join(map(str, sorted({P for v in plan.lengths.values() for P in v})))
    wide.print(f"estimated duration: {duration_text(plan.seconds)} ({', '.join(config.dtypes)}; P = {lengths})")


def measure(config, plan):
    """Run the sweep under a progress bar (on stderr, gone when done)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from prefill.bench.runner import run_bench

    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("left"))
    with Progress(*columns, TimeRemainingColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("measuring GEMM rates, loading", total=plan.seconds)
        return run_bench(config, on_step=lambda d, s: bar.update(task, advance=s, description=d), prepared=plan)


def print_result(wide: Console, result) -> None:
    """The machine, ours and the peers, the calibrations, the chunk sweep and the notes."""
    from prefill.bench import report

    wide.print(report.machine_line(result), highlight=False)
    wide.print(report.ours_table(result))
    wide.print(report.peers_table(result))
    for dt, rep in result.calibrations.items():
        wide.print(report.calibration_table(dt, rep))
    chunks = report.chunk_table(result)
    if chunks is not None:
        wide.print(chunks)
    for note in result.notes:
        wide.print(f"note: {note}", highlight=False)


def save(result, out_dir: Path) -> None:
    """bench.json and the plots in `out_dir`; the calibration (bfloat16's when there is one) for `prefill estimate`."""
    from prefill.bench import plot, report
    from prefill.costmodel.hardware import save_calibration

    written = [report.write_json(result, out_dir), plot.plot_times(result, out_dir), plot.plot_chunks(result, out_dir)]
    if result.calibrations:
        dt = "bfloat16" if "bfloat16" in result.calibrations else next(iter(result.calibrations))
        written.append(save_calibration(result.calibrations[dt].calibration))
        console.print(f"saved the {dt} calibration for `prefill estimate --hardware cpu`", highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in written if p is not None), highlight=False)
