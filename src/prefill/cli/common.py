"""What the commands share: the consoles, the one-line error, loading an engine, number formatting, report tables.

Nothing heavy at import: torch and the engine load inside the functions that need them, so `prefill estimate` and
`prefill mask` start fast.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from prefill.costmodel.kv_store import DEFAULT_STORE_MB as KV_STORE_MB
from prefill.errors import PrefillError

console = Console()
err_console = Console(stderr=True)


def wide_console(width: int = 150) -> Console:
    """The console for a wide table: the terminal's, else one `width` columns wide (logs and READMEs get whole
    tables, not rows wrapped to 80 columns)."""
    return console if console.is_terminal else Console(width=width)


# What a user can cause (a bad argument, a missing file, a model we cannot read): one line, never a traceback.
USER_ERRORS = (PrefillError, ValueError, FileNotFoundError)

F = TypeVar("F", bound=Callable)

# Options the engine commands share.
ModelPath = Annotated[
    str | None, typer.Option("--model", "-m", help=".gguf file or Hugging Face folder (default: SmolLM2)")
]
AutoDtype = Annotated[str, typer.Option(help="auto (the fastest dtype native here), float32 or bfloat16")]
Weights = Annotated[str, typer.Option(help="auto, native (the GGUF's own blocks), float32 or bfloat16")]
WorkloadOpt = Annotated[
    str | None,
    typer.Option("--workload", help="P,n: the request auto optimises for (default 256,128: prompt tokens, out)"),
]
Activations = Annotated[
    str,
    typer.Option(
        "--activations",
        help="what native blocks' products take: f32 (float32, the reference), q8 (8-bit) or auto (float32 unless "
        "q8 is measured near-lossless on this file by `prefill verify --quality` and predicted 10% faster)",
    ),
]
KVStoreDir = Annotated[
    str | None, typer.Option("--kv-store", help="a directory keeping K/V of prompts across runs (loaded when faster)")
]
KVStoreMb = Annotated[float, typer.Option("--kv-store-mb", help="the KV store's size cap in MiB (LRU beyond)")]
KVDtype = Annotated[
    str,
    typer.Option(
        "--kv-dtype",
        help="K/V in the pool: auto (float16 where predicted 10% faster for --workload, else float32; float32 "
        "under --deterministic), float32, bfloat16, float16 or q8_0",
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one `error:` line to stderr and exit with `code`."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def user_errors(command: F) -> F:
    """`command`, with every error a user can meet turned into one `error:` line and exit code 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except USER_ERRORS as e:
            fail(str(e))

    return wrapper


def note(line: str) -> None:
    """A line about how the command runs (the dtype chosen, a warning), on stderr so stdout keeps the results."""
    err_console.print(line, highlight=False, markup=False, soft_wrap=True)


def load_engine(
    model: str | None,
    dtype: str,
    threads: int | None,
    device: str = "cpu",
    compile: bool = False,
    deterministic: bool = False,
    weights: str = "auto",
    kv_store: str | None = None,
    kv_store_mb: float = KV_STORE_MB,
    kv_dtype: str | None = None,
    activations: str = "auto",
):
    """The engine of `model` (None: the embedded SmolLM2), warmed up or compiled, so timings are of the steady
    state; `dtype`, `weights` and `activations` as resolve_storage says, K/V stored as `kv_dtype`; with
    `kv_store`, the KV store attached after the warm-up (so it stores no warm-up prompt)."""
    from prefill.machine.native import keep_compile

    check_store_size(kv_store, kv_store_mb)
    how = {"kv_dtype": kv_dtype, "activations": activations}
    engine, dtype, weights = open_engine(model, dtype, weights, device, threads, deterministic, **how)
    if compile and weights == "native":
        note("native GGUF weights already run fused block operators; not compiling")
        compile = False
    compile = compile and keep_compile(dtype, device, echo=note)  # unless the last bench found it slower here
    if compile:  # compiling ends with the warm-up runs
        with console.status("compiling the block functions (torch.compile)"):
            console.print(f"compiled in {engine.compile():.1f} s")
    else:
        engine.warmup()  # so the timings are of the steady state, not of first-call set-up
    if kv_store is not None:
        attach_store(engine, kv_store, kv_store_mb)
    return engine


def open_engine(
    model: str | None,
    dtype: str,
    weights: str,
    device: str,
    threads: int | None,
    deterministic: bool,
    workload: str | None = None,
    kv_dtype: str | None = None,
    activations: str = "auto",
):
    """(engine, dtype, weights): Engine.load with the dtype, weights and activations resolve_storage chose for
    `workload` ("P,n"; default: the typical request), said in a line each, the model file parsed once for both;
    K/V stored as `kv_dtype` (None: the compute dtype; "auto": engine.weights.choose_kv_dtype's for `workload`,
    said in a line; the compute dtype under `deterministic`)."""
    from prefill.costmodel.gguf_file import reading_once
    from prefill.engine.kvcache import kv_torch_dtype
    from prefill.engine.llm import Engine
    from prefill.engine.weights import choose_kv_dtype
    from prefill.machine.paths import Workload

    auto_kv = kv_dtype is not None and kv_dtype.lower() == "auto"
    if kv_dtype is not None and not auto_kv:
        kv_torch_dtype(kv_dtype)  # a bad name is one line before anything loads
    with reading_once():
        how = (device, deterministic, threads, workload, activations)
        dtype, weights, acts = resolve_storage(model, dtype, weights, *how)
        load = {"device": device, "threads": threads, "deterministic": deterministic, "weights": weights}
        load["kv_dtype"] = None if auto_kv else kv_dtype
        engine = Engine.load(model, dtype=dtype, activations=acts, **load)
    if auto_kv and not deterministic:
        choose_kv_dtype(engine, Workload.parse(workload), echo=note)
    return engine, dtype, weights


def resolve_storage(
    model: str | None,
    dtype: str,
    weights: str,
    device: str,
    deterministic: bool,
    threads: int | None = None,
    workload: str | None = None,
    activations: str = "auto",
) -> tuple[str, str, str | None]:
    """(dtype, weights, activations) to load `model` with: "auto" takes the path auto_path takes for `workload`
    ("P,n", default the typical request) among those open here (prefill.engine.weights), said in one line; an
    explicit `activations` (f32 | q8) is kept; the batch-invariant mode (`deterministic`) runs dense float32
    (activations f32)."""
    from prefill.engine.weights import resolve_path as resolve
    from prefill.loading.resolve import model_path
    from prefill.machine.paths import Workload

    model_path(model)  # a wrong path fails now, before the probe measures this machine
    load = Workload.parse(workload)
    check_activations(activations)
    if deterministic:
        if weights not in ("auto", "float32"):
            fail(f"--deterministic runs dense float32 weights; drop --weights {weights}")
        if activations == "q8":
            fail("--deterministic runs float32 activations; drop --activations q8")
        return deterministic_dtype(dtype), "float32", "f32"
    if activations == "q8" and dtype.lower() not in ("auto", "float32", "fp32", "f32"):
        fail(f"--activations q8 runs on native blocks computing in float32; drop --dtype {dtype}")
    return resolve(model, dtype, weights, device, echo=note, threads=threads, workload=load, activations=activations)


def check_activations(activations: str) -> str:
    """--activations must be f32, q8 or auto: one line otherwise, before anything loads."""
    if activations not in ("auto", "f32", "q8"):
        fail(f"--activations must be f32, q8 or auto, got {activations!r}")
    return activations


def check_store_size(directory: str | None, max_mb: float, kv_cache_mb: float | None = None) -> None:
    """--kv-store-mb, when a store is asked for, and --kv-cache-mb, when given, must be > 0: checked before the
    model loads."""
    if directory is not None and max_mb <= 0:
        fail(f"--kv-store-mb must be > 0, got {max_mb}")
    if kv_cache_mb is not None and kv_cache_mb <= 0:
        fail(f"--kv-cache-mb must be > 0, got {kv_cache_mb}")


def attach_store(engine, directory: str, max_mb: float) -> None:
    """Attach the KV store at `directory` to `engine` (its size checked by check_store_size), saying in one line
    on stderr (stdout may be JSON) what it measured, or that it could not be used (the warning above says why)."""
    tier = engine.attach_kv_store(directory, max_mb)
    if tier is None:
        err_console.print(f"KV store: {directory} cannot be used; running without it", highlight=False, markup=False)
        return
    bw = tier.bandwidth
    disk = f"{bw.disk_bytes_per_s / 1e9:.2f} GB/s disk, " if bw.disk_bytes_per_s else ""
    cap = tier.store.max_bytes / 2**20  # max_mb, or less where the disk holds less (the warning above says so)
    mode = "" if tier.store.writable else " (load-only)"
    line = (
        f"KV store: {directory}{mode}, at most {cap:,.0f} MiB; loads at {disk}{bw.ram_bytes_per_s / 1e9:.2f} GB/s RAM"
    )
    err_console.print(line, highlight=False, markup=False)


def deterministic_dtype(dtype: str) -> str:
    """The dtype of the batch-invariant mode: float32 (its kernels' only dtype); 'auto' means it."""
    if dtype not in ("auto", "float32", "fp32"):
        fail(f"--deterministic runs in float32; drop --dtype {dtype}")
    return "float32"


# ---- numbers -----------------------------------------------------------------------------------------


def eng(x: float, unit: str) -> str:
    """1.4e13, 'FLOP' -> '1.4e+13 FLOP (14 TFLOP)'."""
    for power, prefix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if abs(x) >= 10**power:
            return f"{x:.4g} {unit} ({x / 10**power:.4g} {prefix}{unit})"
    return f"{x:.4g} {unit}"


def secs(s: float) -> str:
    """0.093333 -> '0.0933 s (93.3 ms)'."""
    return f"{s:.3g} s ({s * 1e3:.3g} ms)" if s < 1 else f"{s:.3g} s"


def ms(s: float) -> str:
    """0.0123 s -> '12.3 ms'."""
    return f"{s * 1e3:,.1f} ms"


def print_sections(sections: dict[str, list[tuple[str, str]]], captions: dict[str, str] | None = None) -> None:
    """One two-column table (quantity, value) per section, with an optional caption under it."""
    from rich.table import Table

    for name, rows in sections.items():
        caption = (captions or {}).get(name)
        table = Table(title=name, title_justify="left", caption=caption, caption_justify="left", show_header=False)
        table.add_column("quantity", style="cyan")
        table.add_column("value")
        for label, value in rows:
            table.add_row(label, value)
        console.print(table)
