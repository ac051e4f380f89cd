"""The command line: thin. It parses, calls the library, and prints; the work happens elsewhere.

Each command lives in this file as a small function; errors a user can meet become one line and exit 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from prefill.errors import PrefillError

app = typer.Typer(
    name="prefill",
    help="See, measure and predict LLM prefill: cost model, engine, proofs, benchmark, server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    """Print one error line and exit with `code`: never a traceback."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


# ---- commands are added below this line (one function each) ----


# ---- calculator: estimate, kv, mask (cost model only; no torch unless --hardware cpu) ----


def _calc_errors(fn):
    """Turn the errors a user can meet inside a calculator command into one line and exit 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (PrefillError, ValueError) as e:
            fail(str(e))

    return wrapper


def _spec_from(model: str | None, config: str | None, gguf: str | None, params: float | None = None):
    """The ModelSpec named by exactly one of --model / --config / --gguf (None when only --params is given)."""
    from prefill.costmodel.specs import ModelSpec, load_spec
    from prefill.errors import BadInput

    given = [
        name
        for name, v in (("--model", model), ("--config", config), ("--gguf", gguf), ("--params", params))
        if v is not None
    ]
    if len(given) != 1:
        raise BadInput(f"give exactly one of --model, --config, --gguf, --params (got {', '.join(given) or 'none'})")
    if model is not None:
        return load_spec(model)
    if config is not None:
        return ModelSpec.from_hf_config(config)
    return ModelSpec.from_gguf(gguf) if gguf is not None else None


def _eng(x: float, unit: str) -> str:
    """1.4e13, 'FLOP' -> '1.4e+13 FLOP (14 TFLOP)'."""
    for power, prefix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if abs(x) >= 10**power:
            return f"{x:.4g} {unit} ({x / 10**power:.4g} {prefix}{unit})"
    return f"{x:.4g} {unit}"


def _secs(s: float) -> str:
    """0.093333 -> '0.0933 s (93.3 ms)'."""
    return f"{s:.3g} s ({s * 1e3:.3g} ms)" if s < 1 else f"{s:.3g} s"


def _print_report(sections: dict[str, list[tuple[str, str]]], captions: dict[str, str] | None = None) -> None:
    """One two-column rich table per section; an optional caption under a section."""
    from rich.table import Table

    for name, rows in sections.items():
        table = Table(title=name, title_justify="left", caption=(captions or {}).get(name), caption_justify="left",
                      show_header=False)  # fmt: skip
        table.add_column("quantity", style="cyan")
        table.add_column("value")
        for label, value in rows:
            table.add_row(label, value)
        console.print(table)


@app.command()
@_calc_errors
def estimate(
    model: str | None = typer.Option(None, "--model", "-m", help="Preset (e.g. llama-3-8b) or .gguf/config.json."),
    params: float | None = typer.Option(None, "--params", help="Only a parameter count N, e.g. 7e9 (no shapes)."),
    config: str | None = typer.Option(None, "--config", help="A Hugging Face config.json or its folder."),
    gguf: str | None = typer.Option(None, "--gguf", help="A GGUF file (metadata only)."),
    prompt_tokens: int = typer.Option(1000, "--prompt-tokens", "-p", help="P, prompt tokens per sequence."),
    hardware: str = typer.Option(
        "h100", "--hardware", help="h100, h200, a100-40gb, a100-80gb, l4, rtx-4090, mi300x, or cpu (measured now)."
    ),
    peak_flops: float | None = typer.Option(None, "--peak-flops", help="Override the hardware's peak FLOP/s."),
    mfu: float | None = typer.Option(
        None,
        "--mfu",
        help="Fraction of peak achieved, in (0, 1]. Default 0.5; 1.0 on cpu, whose peak is a measured GEMM.",
    ),
    dtype: str = typer.Option("bf16", "--dtype", help="float32, bf16, fp16 or fp8: peak and bytes per element."),
    batch: int = typer.Option(1, "--batch", "-b", help="B, sequences prefilled together."),
    tp: int = typer.Option(1, "--tp", help="T, tensor-parallel GPUs."),
    network_ms: float = typer.Option(0.0, "--network-ms", help="Network latency added to TTFT (ms)."),
    tokenize_ms: float = typer.Option(0.0, "--tokenize-ms", help="Tokenization time added to TTFT (ms)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Predict a prefill: FLOPs (2*N*P and exact), seconds, TTFT, KV cache, compute- or memory-bound."""
    import json

    from prefill.costmodel import costs
    from prefill.costmodel.hardware import calibration_path, get_hardware, load_calibration
    from prefill.errors import BadInput

    spec = _spec_from(model, config, gguf, params)
    P, B, T = prompt_tokens, batch, tp
    if P < 1 or B < 1 or T < 1:
        raise BadInput("--prompt-tokens, --batch and --tp must be >= 1")
    dt, b = costs.canonical_dtype(dtype), costs.dtype_bytes(dtype)
    is_cpu = hardware.lower() == "cpu"
    if is_cpu and not json_out:
        err_console.print("measuring this CPU's GEMM rate and memory bandwidth ...")
    hw = get_hardware(hardware)
    peak = peak_flops if peak_flops is not None else hw.peak(dt)
    util = mfu if mfu is not None else (1.0 if is_cpu else 0.5)
    N = spec.N if spec is not None else params
    if T > 1 and spec is None:
        raise BadInput("--tp needs model shapes (--model, --config or --gguf), not only --params")

    r: dict[str, object] = {
        "model": spec.name if spec else None,
        "N": N,
        "P": P,
        "B": B,
        "dtype": dt,
        "hardware": hw.name,
        "peak_flops_per_s": peak,
        "mfu": util,
        "tp": T,
    }
    r["flops_2NP"] = costs.prefill_flops(N, B * P)
    r["prefill_s_2NP"] = costs.prefill_seconds(N, B * P, peak, util)
    count = costs.prefill_flops_exact(spec, P, B=B) if spec else None
    flops = count.total if count else r["flops_2NP"]
    if count:
        r["flops_exact"] = {
            "linear": count.linear,
            "attention": count.attention,
            "unembed": count.unembed,
            "total": count.total,
        }
        r["flops_exact_minus_2NP"] = count.total - r["flops_2NP"]
        r["prefill_s_exact"] = costs.compute_seconds(count.total, peak, util)
    prefill_s = r.get("prefill_s_exact", r["prefill_s_2NP"])
    if T > 1:
        payload = costs.tp_allreduce_payload_bytes(spec, P, b, B)
        link = hw.link_bytes_per_s
        r["tp_flops_per_gpu"] = costs.tp_flops_per_gpu(flops, T)
        r["tp_allreduce_bytes_per_gpu"] = costs.ring_allreduce_bytes_per_gpu(payload, T)
        r["tp_allreduce_s"] = costs.tp_allreduce_seconds(payload, T, link) if link else None
        r["tp_prefill_s"] = costs.compute_seconds(r["tp_flops_per_gpu"], peak, util) + (r["tp_allreduce_s"] or 0)
        prefill_s = r["tp_prefill_s"]
    r["network_s"], r["tokenize_s"] = network_ms / 1e3, tokenize_ms / 1e3
    r["ttft_s"] = costs.ttft_seconds(prefill_s, r["network_s"], r["tokenize_s"])
    cal = load_calibration() if is_cpu and count else None
    r["calibrated_prefill_s"] = costs.calibrated_prefill_seconds(count, cal) if cal else None
    if spec:
        r["kv_cache_bytes"] = costs.kv_cache_bytes_for(spec, P, b, B)
        r["kv_bytes_per_token"] = costs.kv_cache_bytes_for(spec, 1, b, B)
        r["kv_cache_bytes_per_gpu"] = costs.tp_kv_cache_bytes_per_gpu(spec, P, b, T, B)
    ridge = costs.ridge_point(peak, hw.bandwidth_bytes_per_s)
    r["prefill_intensity"] = costs.prefill_intensity(spec, P, b, B)
    r["decode_intensity"] = costs.decode_intensity(b)
    r["ridge_point"] = ridge
    r["prefill_bound"] = costs.bound(r["prefill_intensity"], ridge)
    r["decode_bound"] = costs.bound(r["decode_intensity"], ridge)
    r["compute_bound_from_P"] = costs.compute_bound_prompt_length(spec, b, ridge, B)
    if json_out:
        typer.echo(json.dumps(r, indent=2))
        return

    setup = [
        ("model", f"{spec.name} ({spec.arch})" if spec else "only N given (no shapes)"),
        ("N parameters", f"{N:,.0f}" + (f" ({spec.N_non_embedding:,} non-embedding)" if spec else "")),
        ("prompt", f"P = {P:,} tokens x B = {B}"),
        ("hardware", f"{hw.name}" + (f" x {T} (tensor parallel)" if T > 1 else "")),
        ("peak x MFU", f"{_eng(peak, 'FLOP/s')} x {util:g} ({dt})"),
    ]
    flop_rows = [("2*N*P", _eng(r["flops_2NP"], "FLOP"))]
    time_rows = [("prefill at peak x MFU (2*N*P)", _secs(r["prefill_s_2NP"]))]
    if count:
        diff = r["flops_exact_minus_2NP"]
        flop_rows += [
            ("exact: linear (2*N_non_emb*P)", _eng(count.linear, "FLOP")),
            (
                "exact: attention (" + ("windowed " if spec.windowed else "") + "causal pairs)",
                _eng(count.attention, "FLOP"),
            ),
            ("exact: unembed (last position)", _eng(count.unembed, "FLOP")),
            ("exact total", _eng(count.total, "FLOP")),
            ("exact - 2*N*P", f"{diff:+.4g} FLOP ({diff / r['flops_2NP']:+.2%})"),
        ]
        time_rows.append(("prefill at peak x MFU (exact)", _secs(r["prefill_s_exact"])))
    if T > 1:
        allreduce = _secs(r["tp_allreduce_s"]) if r["tp_allreduce_s"] is not None else "no link bandwidth known"
        time_rows += [
            (f"FLOPs per GPU (/{T})", _eng(r["tp_flops_per_gpu"], "FLOP")),
            ("all-reduce bytes per GPU (ring)", _eng(r["tp_allreduce_bytes_per_gpu"], "B")),
            ("all-reduce time", allreduce),
            (f"prefill on {T} GPUs", _secs(r["tp_prefill_s"])),
        ]
    if is_cpu and count:
        if cal:
            calibrated = f"{_secs(r['calibrated_prefill_s'])} ({cal.dtype}, {cal.threads} threads, {cal.source})"
        else:
            calibrated = f"none saved at {calibration_path()}"
        time_rows.append(("calibrated prediction", calibrated))
    ttft_rows = [
        ("network", _secs(r["network_s"])),
        ("tokenization", _secs(r["tokenize_s"])),
        ("prefill", _secs(prefill_s)),
        ("TTFT", _secs(r["ttft_s"])),
    ]
    sections = {"Setup": setup, "Prefill FLOPs": flop_rows, "Prefill time": time_rows, "TTFT": ttft_rows}
    if spec:
        kv_rows = [
            ("after prefill", costs.format_bytes(r["kv_cache_bytes"])),
            ("per token", f"{r['kv_bytes_per_token']:,} B"),
        ]
        if T > 1:
            kv_rows.append((f"per GPU ({-(-spec.H_kv // T)} of {spec.H_kv} KV heads)",
                            costs.format_bytes(r["kv_cache_bytes_per_gpu"])))  # fmt: skip
        sections["KV cache"] = kv_rows
    crossover = r["compute_bound_from_P"]
    weights_only = "" if spec else " (weight bytes only)"
    sections["Roofline"] = [
        ("prefill intensity" + weights_only, f"{r['prefill_intensity']:,.1f} FLOP/B -> {r['prefill_bound']}"),
        ("decode step intensity (~2/b)", f"{r['decode_intensity']:,.1f} FLOP/B -> {r['decode_bound']}"),
        ("ridge point (peak / bandwidth)", f"{ridge:,.1f} FLOP/B"),
        ("prefill compute-bound from", f"P >= {crossover:,} tokens" if crossover else "never (below max P)"),
    ]
    captions = {}
    if count:
        captions["Prefill FLOPs"] = (
            "2*N*P also counts the (un)embedding for every token and no attention; exact counts "
            "attention over the causal triangle and logits for the last position only."
        )
    if T > 1:
        captions["Prefill time"] = (
            f"On {T} GPUs: FLOPs per GPU at peak x MFU, plus the ring all-reduces (2 per layer) at "
            "the link bandwidth, not overlapped."
        )
    _print_report(sections, captions)


@app.command()
@_calc_errors
def kv(
    model: str | None = typer.Option(None, "--model", "-m", help="Preset (e.g. llama-3-8b) or .gguf/config.json."),
    config: str | None = typer.Option(None, "--config", help="A Hugging Face config.json or its folder."),
    gguf: str | None = typer.Option(None, "--gguf", help="A GGUF file (metadata only)."),
    layers: int | None = typer.Option(None, "--layers", help="L, instead of a model."),
    kv_heads: int | None = typer.Option(None, "--kv-heads", help="H_kv, instead of a model."),
    head_dim: int | None = typer.Option(None, "--head-dim", help="d_head, instead of a model."),
    prompt_tokens: int = typer.Option(2048, "--prompt-tokens", "-p", help="P, tokens cached per sequence."),
    dtype: str = typer.Option("bf16", "--dtype", help="Cache dtype: float32, bf16, fp16, fp8."),
    batch: int = typer.Option(1, "--batch", "-b", help="B, sequences."),
    memory_gib: float = typer.Option(24.0, "--memory-gib", help="Memory for the cache (GiB): longest context."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """KV-cache size after a prefill: bytes, MiB, MB, per token, and the longest context that fits."""
    import json

    from prefill.costmodel import costs
    from prefill.costmodel.specs import ModelSpec
    from prefill.errors import BadInput

    shapes = (layers, kv_heads, head_dim)
    if any(v is not None for v in shapes):
        if None in shapes or any(v is not None for v in (model, config, gguf)):
            raise BadInput("give --layers, --kv-heads and --head-dim together, and no model")
        L, H_kv, d_head = shapes
        spec = ModelSpec(name="custom shapes", arch="llama", L=L, d_model=H_kv * d_head, H_q=H_kv, H_kv=H_kv,
                         d_head=d_head, d_ff=1, vocab_size=1, context_length=1, tied_embeddings=True,
                         rope_theta=1.0, norm_eps=1.0)  # fmt: skip
    else:
        spec = _spec_from(model, config, gguf)
    name, L, H_kv, d_head = spec.name, spec.L, spec.H_kv, spec.d_head
    b = costs.dtype_bytes(dtype)
    total = costs.kv_cache_bytes_for(spec, prompt_tokens, b, batch)
    per_token = costs.kv_cache_bytes_for(spec, 1, b, batch)
    longest = costs.max_context_tokens_for(spec, memory_gib * 2**30, b, batch)
    full = costs.kv_cache_bytes(L, H_kv, d_head, prompt_tokens, b, batch)  # as if no layer had a window
    r = {
        "model": name,
        "L": L,
        "H_kv": H_kv,
        "d_head": d_head,
        "windows": list(spec.windows) if spec.windowed else None,
        "P": prompt_tokens,
        "B": batch,
        "dtype": costs.canonical_dtype(dtype),
        "bytes": total,
        "MiB": costs.bytes_to_mib(total),
        "MB": costs.bytes_to_mb(total),
        "bytes_per_token": per_token,
        "bytes_without_windows": full,
        "memory_gib": memory_gib,
        "max_context_tokens": longest,
    }
    if json_out:
        typer.echo(json.dumps(r, indent=2))
        return
    fits = "any length (every layer is windowed)" if longest is None else f"{longest:,} tokens"
    rows = [
        ("model", name),
        ("shapes", f"L={L}, H_kv={H_kv}, d_head={d_head}, {r['dtype']} ({b} B)"),
        ("K, V per layer", f"2 x [B={batch}, H_kv={H_kv}, P={prompt_tokens:,}, d_head={d_head}]"),
    ]
    if spec.windowed:
        rows[-1] = ("K, V per layer", f"2 x [B={batch}, H_kv={H_kv}, min(P, W_l), d_head={d_head}]")
        rows.append(("windows", _windows_text(spec.windows)))
    rows += [
        ("bytes", f"{total:,} B"),
        ("MiB (2^20 B)", f"{r['MiB']:,.1f} MiB"),
        ("MB (10^6 B)", f"{r['MB']:,.1f} MB"),
        ("per token" + (" (first W)" if spec.windowed else ""), f"{per_token:,} B"),
        (f"longest context in {memory_gib:g} GiB", fits + (f" x B={batch}" if batch > 1 and longest else "")),
    ]
    if spec.windowed:
        rows.append(("without windows", costs.format_bytes(full)))
    title = "KV cache = sum over layers of 2*B*H_kv*min(P, W_l)*d_head*b" if spec.windowed else None
    _print_report({title or "KV cache = 2*L*B*H_kv*P*d_head*b": rows})


def _windows_text(windows) -> str:
    """(512, 512, None, ...) -> '15 layers window 512, 3 layers full attention'."""
    from collections import Counter

    counts = Counter(windows)
    parts = [f"{n} layers window {w:,}" for w, n in sorted(counts.items(), key=lambda kv: kv[0] or 0) if w]
    return ", ".join(parts + ([f"{counts[None]} layers full attention"] if counts[None] else []))


MASK_GRID_CAP = 32  # positions drawn; the pair count and the last position are reported for any P


@app.command()
@_calc_errors
def mask(
    text: str | None = typer.Argument(None, help='A prompt, e.g. "AI is fast".'),
    tokens: int | None = typer.Option(None, "--tokens", "-n", help="P, instead of a prompt."),
    whitespace: bool = typer.Option(False, "--whitespace", help="Split on spaces instead of the model's tokenizer."),
) -> None:
    """The causal mask of a prompt: which key positions each query position attends (1) or not (0)."""
    from prefill.costmodel.causal import causal_mask, causal_pairs
    from prefill.errors import BadInput

    if (text is None) == (tokens is None):
        raise BadInput('give either a prompt ("AI is fast") or --tokens P')
    if text is not None and not text.strip():
        raise BadInput("the prompt is empty; give some text or --tokens P")
    if text is None:
        labels = [""] * tokens
    elif whitespace:
        labels = text.split()
    else:
        from prefill.loading.tokenizer import default_tokenize

        labels = default_tokenize(text)  # the embedded SmolLM2's tokenizer
    P = len(labels)
    if P < 1:
        raise BadInput("the prompt has no tokens; give some text or --tokens >= 1")
    shown = min(P, MASK_GRID_CAP)
    grid = causal_mask(shown)  # [shown, shown]: the top-left corner of the full (P, P) mask
    heads = [f"{j}" + (f" {labels[j].strip()[:8]}" if labels[j].strip() else "") for j in range(shown)]
    widths = [len(h) + 2 for h in heads]
    rows = [f"{i} {labels[i].strip()[:8]}".rstrip() for i in range(shown)]
    pad = max(len("query \\ key"), *map(len, rows)) + 1
    console.print("causal mask: rows = query position, columns = key position (1 = attends)", highlight=False)
    console.print("query \\ key".ljust(pad) + "".join(h.center(w) for h, w in zip(heads, widths, strict=True)),
                  style="bold", highlight=False, soft_wrap=True)  # fmt: skip
    for i in range(shown):
        cells = ("[bold green]1[/]" if grid[i, j] else "[dim]0[/]" for j in range(shown))
        line = "".join(
            " " * ((w - 1) // 2) + c + " " * (w - 1 - (w - 1) // 2) for c, w in zip(cells, widths, strict=True)
        )
        console.print(f"[cyan]{rows[i].ljust(pad)}[/]" + line, highlight=False, soft_wrap=True)
    if shown < P:
        console.print(f"(showing positions 0-{shown - 1} of {P}; the mask continues the same way)")
    last = f"{P - 1} ({labels[-1]!r})" if labels[-1] else f"{P - 1}"
    console.print(
        f"{causal_pairs(P):,} (query, key) pairs computed = P(P+1)/2 for P = {P:,}, of P^2 = {P * P:,}.\n"
        f"Position {last} is the last prompt position: it attends to all {P:,} positions, and its final-layer "
        "hidden state, through the unembedding, gives the logits of the first new token.",
        highlight=False,
    )


# ---- bench: our prefill against its peers, the cost model beside every point ----


@app.command()
def bench(
    model: str | None = typer.Option(None, "--model", "-m", help=".gguf file or HF folder; default: SmolLM2."),
    prompt_lengths: str = typer.Option("32,128,512,1024,2048,4096", "--prompt-lengths", help="P values."),
    dtypes: str = typer.Option("auto", "--dtypes", help="Comma-separated dtypes; auto: the ones native here."),
    repeats: int = typer.Option(5, "--repeats", help="Timed warm runs per point (median and p90)."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed runs after the cold run."),
    peers: str = typer.Option("transformers,llamacpp", "--peers", help="Peers to run beside ours, or 'none'."),
    threads: int | None = typer.Option(None, "--threads", help="Threads for every engine (default: all cores)."),
    calibrate: bool = typer.Option(False, "--calibrate", help="Fit overhead + linear/attention rates and save."),
    calibrate_on: str | None = typer.Option(
        None, "--calibrate-on", help="Prompt lengths to fit on (default: the 2nd-shortest and the longest)."
    ),
    chunk_size: str | None = typer.Option(
        None, "--chunk-size", help="Chunk sizes C to sweep at the longest P, e.g. 256,512,1024."
    ),
    out: str = typer.Option("bench-results", "--out", help="Folder for bench.json and the PNG plots."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    compile: bool = typer.Option(False, "--compile", help="Also time ours with torch.compile (eager and compiled)."),
    force: bool = typer.Option(False, "--force", help="Measure an emulated dtype at every P, not just the smallest."),
) -> None:
    """Benchmark prefill: our engine and its peers on the same tokens, dtypes and threads, with predictions."""
    from pathlib import Path

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from prefill.bench import plot, report
    from prefill.bench.peers import parse_peers
    from prefill.bench.plan import duration_text
    from prefill.bench.runner import BenchConfig, parse_dtypes, parse_ints, prepare, run_bench
    from prefill.costmodel.hardware import save_calibration

    config = BenchConfig(
        model=model,
        prompt_lengths=parse_ints(prompt_lengths, "--prompt-lengths"),
        dtypes=("auto",) if dtypes.strip().lower() == "auto" else parse_dtypes(dtypes),
        repeats=repeats,
        warmup=warmup,
        peers=parse_peers(peers),
        threads=threads,
        calibrate=calibrate,
        calibrate_on=parse_ints(calibrate_on, "--calibrate-on") if calibrate_on else None,
        chunk_sizes=parse_ints(chunk_size, "--chunk-size") if chunk_size else (),
        device=device,
        compile=compile,
        force=force,
    )
    config, plan, _, _ = prepare(config)
    wide = console if console.is_terminal else Console(width=140)  # logs and READMEs get whole tables
    wide.print(report.device_line(config.device), highlight=False)
    for note in plan.notes:
        wide.print(f"note: {note}", highlight=False)
    lengths = ", ".join(map(str, sorted({P for v in plan.lengths.values() for P in v})))
    wide.print(f"estimated duration: {duration_text(plan.seconds)} ({', '.join(config.dtypes)}; P = {lengths})")
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("left"),
               TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("measuring GEMM rates, loading", total=plan.seconds)
        result = run_bench(config, on_step=lambda d, s: bar.update(task, advance=s, description=d), prepared=plan)
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
    out_dir = Path(out)
    written = [report.write_json(result, out_dir), plot.plot_times(result, out_dir), plot.plot_chunks(result, out_dir)]
    if result.calibrations:
        dt = "bfloat16" if "bfloat16" in result.calibrations else next(iter(result.calibrations))
        written.append(save_calibration(result.calibrations[dt].calibration))
        console.print(f"saved the {dt} calibration for `prefill estimate --hardware cpu`", highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in written if p is not None), highlight=False)


@app.command()
def serve(
    model: str = typer.Option(None, help="a .gguf file or Hugging Face folder (default: embedded SmolLM2)"),
    host: str = typer.Option("127.0.0.1", help="address to bind (loopback by default)"),
    port: int = typer.Option(8000, help="TCP port"),
    dtype: str = typer.Option("auto", help="auto (the fastest dtype native here), float32 or bfloat16"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    kv_cache_mb: float = typer.Option(
        None, help="the KV pool shared by all requests, in MiB (default: a quarter of free memory, at most 2 GiB)"
    ),
    prefix_cache_mb: float = typer.Option(256.0, help="prefix cache's share of the KV pool in MiB (0 disables it)"),
    max_queue: int = typer.Option(64, help="requests that may wait; more get HTTP 429"),
    max_running: int = typer.Option(32, help="requests running at once (their decode steps share one batch)"),
    chunk_size: int = typer.Option(256, help="prefill chunk in tokens, interleaved with decode steps"),
    threads: int = typer.Option(None, help="torch CPU threads"),
) -> None:
    """OpenAI-compatible server: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
    from prefill.engine.engine import Engine
    from prefill.machine.native import resolve_dtype
    from prefill.server.app import ServeConfig, create_app, model_id_of
    from prefill.server.server import run_server

    dtype = resolve_dtype(dtype, device, echo=_echo)
    engine = Engine.load(model, dtype=dtype, device=device, threads=threads)
    if kv_cache_mb is not None and kv_cache_mb <= 0:
        fail(f"--kv-cache-mb must be > 0, got {kv_cache_mb}")
    cfg = ServeConfig(model_id_of(engine), prefix_cache_mb, kv_cache_mb, max_queue, max_running, chunk_size)
    app = create_app(engine, cfg)
    pool = app.state.scheduler.loop.pool
    tokens = pool.n_blocks * pool.block_size
    console.print(f"KV pool: {pool.allocated_bytes() / 1024**2:,.0f} MiB = {pool.n_blocks:,} blocks of "
                  f"{pool.block_size} tokens ({tokens:,} tokens)", highlight=False)  # fmt: skip
    console.print(f"serving [bold]{cfg.model_id}[/] ({dtype}) at http://{host}:{port}/v1", highlight=False)
    code = run_server(app, host, port)
    if code:
        fail("the server stopped because its scheduler could not serve (see the log above)", code)


@app.command()
def loadtest(
    url: str = typer.Option("http://127.0.0.1:8000", help="server root (without /v1)"),
    model: str = typer.Option(None, help="model id (default: the first of GET /v1/models)"),
    chat: bool = typer.Option(False, help="use /v1/chat/completions instead of /v1/completions"),
    concurrency: int = typer.Option(4, help="clients in flight (fixed-concurrency mode, or the cap with --rate)"),
    rate: float = typer.Option(None, help="Poisson arrival rate in requests/s (default: fixed concurrency)"),
    duration: float = typer.Option(60.0, help="stop after this many seconds"),
    requests: int = typer.Option(100, help="stop after this many requests"),
    prompt_len: str = typer.Option("128", help="prompt tokens: 128, 64:512 (uniform) or @file (one per line)"),
    prompts_file: str = typer.Option(None, help="real prompts, one per line (overrides --prompt-len)"),
    system_prompt_file: str = typer.Option(None, help="a system prompt shared by every request (prefix caching)"),
    max_tokens: int = typer.Option(64, help="output tokens asked per request"),
    temperature: float = typer.Option(0.0, help="sampling temperature"),
    slo_ttft_ms: float = typer.Option(None, help="goodput SLO on TTFT, ms"),
    slo_tpot_ms: float = typer.Option(None, help="goodput SLO on TPOT, ms"),
    no_usage: bool = typer.Option(False, help="do not ask for stream_options.include_usage"),
    ignore_eos: bool = typer.Option(False, help="ask for exactly --max-tokens (ignore_eos, as vLLM's benchmarks do)"),
    seed: int = typer.Option(0, help="seed of prompt lengths and words"),
    out: str = typer.Option("loadtest.json", help="JSON report (config, summary, every request)"),
    plot: str = typer.Option("loadtest.png", help="PNG plot"),
) -> None:
    """Load-test any OpenAI-compatible server: TTFT, ITL, TPOT, E2E percentiles, throughput, goodput."""
    import asyncio
    import dataclasses
    from pathlib import Path

    from rich.table import Table

    from prefill.bench import loadtest_report as report
    from prefill.bench.loadtest import LoadTestConfig, PromptLengths, run_load_test

    prompts = ()
    if prompts_file is not None:
        prompts = tuple(line for line in Path(prompts_file).read_text().splitlines() if line.strip())
    system = Path(system_prompt_file).read_text() if system_prompt_file else None
    cfg = LoadTestConfig(url.rstrip("/"), model=model, chat=chat, concurrency=concurrency, rate=rate,
                         duration_s=duration, max_requests=requests, prompt_lengths=PromptLengths.parse(prompt_len),
                         prompts=prompts, system_prompt=system, max_tokens=max_tokens, temperature=temperature,
                         seed=seed, include_usage=not no_usage, ignore_eos=ignore_eos)  # fmt: skip
    mode = f"Poisson {rate} req/s (cap {concurrency})" if rate else f"concurrency {concurrency}"
    lengths = "from file" if prompts else cfg.prompt_lengths.describe()
    console.print(f"load test of {cfg.url}: {mode}, prompts {lengths} tokens, max_tokens {max_tokens}", highlight=False)
    records, wall, model_id = asyncio.run(run_load_test(cfg))
    slo_ttft = slo_ttft_ms / 1e3 if slo_ttft_ms is not None else None
    slo_tpot = slo_tpot_ms / 1e3 if slo_tpot_ms is not None else None
    summary = report.summarize(records, wall, slo_ttft, slo_tpot)
    table = Table(title=f"{model_id}: {summary['successful']}/{summary['requests']} requests ok in {wall:.1f} s")
    for col in ("metric (ms)", "mean", "p50", "p90", "p99", "n"):
        table.add_column(col, justify="right")
    for name, key in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s")):
        st = summary["latency"][key]
        cells = [f"{st[k] * 1e3:.1f}" for k in ("mean", "p50", "p90", "p99")] + [str(st["n"])] if st else ["-"] * 5
        table.add_row(name, *cells)
    console.print(table)
    console.print(
        f"throughput {summary['throughput_req_per_s']:.2f} req/s, {summary['throughput_output_tok_per_s']:.1f} "
        f"output tok/s; goodput {summary['goodput_req_per_s']:.2f} req/s "
        f"(SLO TTFT <= {slo_ttft_ms} ms, TPOT <= {slo_tpot_ms} ms; {summary['slo_attainment']:.0%} of requests)",
        highlight=False,
    )
    for err, n in summary["errors"].items():
        console.print(f"[red]{n} x {err}[/]", highlight=False)
    console.print("definitions: " + "; ".join(f"{k}: {v}" for k, v in report.DEFINITIONS.items()), highlight=False)
    config = {**dataclasses.asdict(cfg), "model": model_id, "prompts": len(prompts)}
    report.write_json(Path(out), config, summary, records)
    report.plot(Path(plot), records, f"{model_id} at {cfg.url}: {mode}")
    console.print(f"wrote {out} and {plot}", highlight=False)


# ---- engine: run, demo, verify (the real model) ----

DEMO_PROMPT = "What is the capital of France?"


def _echo(line: str) -> None:
    console.print(line, highlight=False, markup=False)


def _load_engine(model: str | None, dtype: str, threads: int | None, device: str = "cpu", compile: bool = False):
    from prefill.engine.engine import Engine
    from prefill.machine.native import keep_compile, resolve_dtype

    dtype = resolve_dtype(dtype, device, echo=_echo)  # "auto" -> the fastest native dtype, said in one line
    compile = compile and keep_compile(dtype, device, echo=_echo)  # unless the last bench found it slower here
    engine = Engine.load(model, dtype=dtype, device=device, threads=threads, progress=True)
    if compile:  # compiling ends with the warm-up runs
        with console.status("compiling the block functions (torch.compile)"):
            console.print(f"compiled in {engine.compile():.1f} s")
    else:
        engine.warmup()  # so the timings below are of the steady state, not of first-call set-up
    return engine


@app.command()
def run(
    prompt: str = typer.Argument(..., help="The prompt; the chat template is applied unless --raw."),
    model: str = typer.Option(None, "--model", "-m", help=".gguf file or Hugging Face folder (default: SmolLM2)"),
    dtype: str = typer.Option("auto", help="auto (the fastest dtype native here), float32 or bfloat16"),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", help="Most tokens to generate"),
    temperature: float = typer.Option(0.0, help="0 = greedy"),
    top_k: int = typer.Option(0, help="0 = no top-k cut"),
    top_p: float = typer.Option(1.0, help="1.0 = no nucleus cut"),
    seed: int = typer.Option(None, help="Seed for sampling"),
    stop: list[str] = typer.Option([], "--stop", help="Stop string (repeatable)"),
    raw: bool = typer.Option(False, "--raw", help="Skip the chat template"),
    chunk_size: int = typer.Option(None, "--chunk-size", help="Prefill in chunks of this many tokens"),
    threads: int = typer.Option(None, help="CPU threads (default: torch's choice)"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    compile: bool = typer.Option(False, "--compile", help="torch.compile the block functions first (~15 s)"),
    chat: bool = typer.Option(False, "--chat", help="Require the chat template (an error if the model has none)"),
) -> None:
    """Prefill a prompt in one pass, show the cache and TTFT (measured beside predicted), then decode."""
    from prefill.cli.report import show_run
    from prefill.engine.sampling import SamplingParams

    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    if max_new_tokens < 0:
        fail(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    if chat and raw:
        fail("--chat and --raw contradict each other: give one")
    engine = _load_engine(model, dtype, threads, device, compile)
    if not raw and not (engine.tokenizer and engine.tokenizer.chat_template):
        if chat:
            fail(f"{engine.source} has no chat template: drop --chat to run the prompt raw")
        console.print("note: this model has no chat template, so the prompt runs raw")
    events = engine.generate(
        prompt, chat=not raw, max_new_tokens=max_new_tokens, sampling=sampling, stop=tuple(stop), chunk_size=chunk_size
    )
    show_run(console, engine, events, chunk_size)


@app.command()
def demo(
    dtype: str = typer.Option("float32", help="float32 (the demo's fixed answer), bfloat16 or auto"),
    threads: int = typer.Option(None, help="CPU threads"),
) -> None:
    """The main job on the embedded SmolLM2-135M-Instruct: `prefill run` on a fixed prompt."""
    console.print(f"[bold]prefill demo[/]: prefill of {DEMO_PROMPT!r} on the embedded SmolLM2-135M-Instruct")
    run(DEMO_PROMPT, model=None, dtype=dtype, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seed=None,
        stop=[], raw=False, chunk_size=None, threads=threads, device="cpu", compile=False)  # fmt: skip


@app.command()
def verify(
    prompt: str = typer.Argument(DEMO_PROMPT, help="Prompt to check on (chat template applied)"),
    model: str = typer.Option(None, "--model", "-m", help=".gguf file or Hugging Face folder (default: SmolLM2)"),
    chunk_size: int = typer.Option(7, help="Chunk size for the chunked-prefill check"),
    reference: bool = typer.Option(True, help="Also compare with Hugging Face transformers (if installed)"),
) -> None:
    """The proofs, in float32: parallel == sequential, chunks == one pass, KV bytes == formula, batched decode ==
    alone, logits == HF."""
    from rich.table import Table

    from prefill.engine import proofs

    engine = _load_engine(model, "float32", None)
    ids = engine.encode_prompt(prompt)
    checks = proofs.parallel_vs_sequential(engine, ids) + proofs.chunked_vs_single(engine, ids, chunk_size)
    checks.append(proofs.kv_bytes_match_formula(engine, len(ids)))
    P = len(ids)
    others = [ids[: max(1, P // 3)], ids[: max(1, 2 * P // 3)], (ids * 3)[: min(3 * P, engine.spec.context_length - 8)]]
    checks += proofs.batched_vs_alone(engine, [ids, *others])
    if reference:
        try:
            import transformers  # noqa: F401
        except ImportError:
            console.print("[yellow]transformers is not installed: skipping the reference comparison[/]")
        else:
            with console.status("loading the same weights in transformers"):
                ref = proofs.load_reference(engine.source)
            checks += proofs.parity_with_reference(engine, ref, ids)
    table = Table(title=f"proofs on {engine.source} (P = {len(ids)} tokens, float32)", title_justify="left")
    table.caption = (
        "tolerance = u * sqrt(K) * L * max|values compared| (float32 roundoff, longest GEMM inner "
        "dimension, layers): what two correct runs summing in another order may differ by"
    )
    for col in ("check", "max |difference|", "tolerance", "result"):
        table.add_column(col)
    for c in checks:
        measured = f"{c.measured:.3g}" + (f" ({c.detail})" if c.detail else "")
        table.add_row(c.name, measured, f"{c.tolerance:g}", "[green]PASS[/]" if c.ok else "[red]FAIL[/]")
    console.print(table)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


# ---- the interactive lesson: lab, exercise ----


@app.command()
def lab(
    model: str = typer.Option(None, help="a .gguf file or Hugging Face folder (default: embedded SmolLM2)"),
    host: str = typer.Option("127.0.0.1", help="address to bind (loopback by default)"),
    port: int = typer.Option(8000, help="TCP port"),
    open_browser: bool = typer.Option(True, "--open/--no-open", help="open the page in a browser"),
) -> None:
    """`prefill serve` plus the lesson page opened in a browser (the URL is printed when none can be opened)."""
    from prefill.lesson.lab import open_when_up
    from prefill.server.app import ServeConfig, create_app, model_id_of
    from prefill.server.server import run_server

    engine = _load_engine(model, "float32", None)  # warmed up: the page's timeline shows the steady state
    url = f"http://{host}:{port}/"
    console.print(f"the prefill lesson, live on [bold]{model_id_of(engine)}[/]: {url}", highlight=False)
    if open_browser:
        open_when_up(url, lambda ok: None if ok else console.print(f"no browser could be opened: visit {url}"))
    run_server(create_app(engine, ServeConfig(model_id_of(engine))), host, port)


exercise_app = typer.Typer(help="The lesson's coding exercise: write five functions, check them locally.")
app.add_typer(exercise_app, name="exercise")


@exercise_app.callback(invoke_without_command=True)
def exercise(
    ctx: typer.Context,
    out: str = typer.Option("prefill_exercise.py", "--out", "-o", help="where to write the skeleton"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing file"),
) -> None:
    """Write the five empty functions to a file; then `prefill exercise check FILE`."""
    from pathlib import Path

    from prefill.lesson.exercise import write_skeleton

    if ctx.invoked_subcommand is not None:
        return
    try:
        path = write_skeleton(Path(out), force)
    except PrefillError as e:
        fail(str(e))
    console.print(f"wrote {path}: fill in the five functions, then run `prefill exercise check {path}`")


@exercise_app.command("check")
def exercise_check(file: str = typer.Argument(..., help="your solution, a .py file")) -> None:
    """Run the project's checks against the five functions in FILE; exit 1 if any fails."""
    from pathlib import Path

    from prefill.lesson.exercise import load_solution, run_checks

    try:
        checks = run_checks(load_solution(Path(file)))
    except PrefillError as e:
        fail(str(e))
    for c in checks:
        mark = "[green]PASS[/]" if c.ok else "[red]FAIL[/]"
        console.print(f"{mark} {c.function}: {c.name}" + (f" ({c.detail})" if c.detail else ""), highlight=False)
    passed = sum(c.ok for c in checks)
    console.print(f"{passed} of {len(checks)} checks pass", highlight=False)
    if passed < len(checks):
        raise typer.Exit(1)


@app.command()
def score(
    file: str = typer.Argument(..., help="A text file, or - for standard input."),
    model: str = typer.Option(None, "--model", "-m", help=".gguf file or Hugging Face folder (default: SmolLM2)"),
    dtype: str = typer.Option("float32", help="float32 or bfloat16"),
    window: int = typer.Option(None, help="Tokens per window (default: the whole text, up to the context length)"),
    stride: int = typer.Option(None, help="Tokens between window starts (default: the window)"),
    chunk_size: int = typer.Option(None, "--chunk-size", help="Prefill each window in chunks of this many tokens"),
    tokens: bool = typer.Option(False, "--tokens", help="Show every token with its log-probability"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables"),
    threads: int = typer.Option(None, help="CPU threads (default: torch's choice)"),
) -> None:
    """Perplexity of a text in one prefill per window: every position's log-probability, FLOPs beside time."""
    import json
    from pathlib import Path

    from prefill.cli import score_report
    from prefill.engine.scoring import perplexity
    from prefill.engine.scoring import score as score_tokens

    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {file}: {e.strerror if isinstance(e, OSError) else e}")
    if not text.strip():
        fail(f"{'standard input' if file == '-' else file} is empty: there is no text to score")
    try:
        engine = _load_engine(model, dtype, threads)
        ids = engine.need_tokenizer().encode(text, add_special_tokens=True)
        score_tokens(engine, ids[:2])  # warm-up: the all-position unembedding's kernels, not timed
        result = perplexity(engine, ids, window, stride, chunk_size)
    except PrefillError as e:
        fail(str(e))
    r = score_report.summary(engine, ids, result, with_tokens=tokens)
    if json_out:
        typer.echo(json.dumps(r, indent=2))
        return
    console.print(score_report.summary_table(r))
    if tokens:
        pieces = score_report.token_pieces(engine, ids)
        console.print(score_report.coloured_text(pieces, result.logprobs))
        console.print(score_report.tokens_table(pieces, ids, result.logprobs))


from prefill.cli.calibrate import calibrate  # noqa: E402 - one module per command as the CLI splits

app.command()(calibrate)


def main() -> None:
    """Console-script entry point: run the app, turning our errors into one line and exit code 2."""
    try:
        app()
    except (PrefillError, ValueError, FileNotFoundError) as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
