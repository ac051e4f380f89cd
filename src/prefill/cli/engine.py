"""The real model: `prefill run`, `prefill demo` and `prefill verify`."""

from __future__ import annotations

from typing import Annotated

import typer

from prefill.cli.common import (
    KV_STORE_MB,
    Activations,
    AutoDtype,
    KVDtype,
    KVStoreDir,
    KVStoreMb,
    ModelPath,
    Weights,
    console,
    fail,
    load_engine,
    wide_console,
)

DEMO_PROMPT = "What is the capital of France?"

Temperature = Annotated[float, typer.Option(help="0 = greedy")]
TopK = Annotated[int, typer.Option(help="0 = no top-k cut")]
TopP = Annotated[float, typer.Option(help="1.0 = no nucleus cut")]
Stop = Annotated[list[str] | None, typer.Option("--stop", help="Stop string (repeatable)")]
Raw = Annotated[bool, typer.Option("--raw", help="Skip the chat template")]
Threads = Annotated[int | None, typer.Option(help="CPU threads (default: torch's choice)")]
Compile = Annotated[bool, typer.Option("--compile", help="torch.compile the block functions first (~15 s)")]
ChunkSize = Annotated[int | None, typer.Option("--chunk-size", help="Prefill in chunks of this many tokens")]
Chat = Annotated[bool, typer.Option("--chat", help="Require the chat template (an error if the model has none)")]
Deterministic = Annotated[
    bool, typer.Option("--deterministic", help="Batch-invariant: bitwise the same logits alone, batched or chunked")
]


def run(
    prompt: Annotated[str, typer.Argument(help="The prompt; the chat template is applied unless --raw.")],
    model: ModelPath = None,
    dtype: AutoDtype = "auto",
    weights: Weights = "auto",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Most tokens to generate")] = 64,
    temperature: Temperature = 0.0,
    top_k: TopK = 0,
    top_p: TopP = 1.0,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling")] = None,
    stop: Stop = None,
    raw: Raw = False,
    chunk_size: ChunkSize = None,
    threads: Threads = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    compile: Compile = False,
    chat: Chat = False,
    deterministic: Deterministic = False,
    kv_store: KVStoreDir = None,
    kv_store_mb: KVStoreMb = KV_STORE_MB,
    kv_dtype: KVDtype = "auto",
    activations: Activations = "auto",
) -> None:
    """Prefill a prompt in one pass, show the cache and TTFT (measured beside predicted), then decode."""
    from prefill.engine.sampling import SamplingParams

    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    load = {"model": model, "dtype": dtype, "weights": weights, "threads": threads, "device": device}
    store = {"kv_store": kv_store, "kv_store_mb": kv_store_mb, "kv_dtype": kv_dtype, "activations": activations}
    how = {"raw": raw, "chat": chat, "chunk_size": chunk_size, "compile": compile, "deterministic": deterministic}
    run_prompt(prompt, max_new_tokens=max_new_tokens, sampling=sampling, stop=tuple(stop or ()), **how, **load, **store)


def demo(
    dtype: Annotated[str, typer.Option(help="float32 (the demo's fixed answer), bfloat16 or auto")] = "float32",
    threads: Annotated[int | None, typer.Option(help="CPU threads")] = None,
) -> None:
    """The main job on the embedded SmolLM2-135M-Instruct: `prefill run` on a fixed prompt."""
    console.print(f"[bold]prefill demo[/]: prefill of {DEMO_PROMPT!r} on the embedded SmolLM2-135M-Instruct")
    run_prompt(DEMO_PROMPT, dtype=dtype, max_new_tokens=32, threads=threads)


def run_prompt(
    prompt: str,
    *,
    model: str | None = None,
    dtype: str = "auto",
    max_new_tokens: int = 64,
    sampling=None,
    stop: tuple[str, ...] = (),
    raw: bool = False,
    chat: bool = False,
    chunk_size: int | None = None,
    threads: int | None = None,
    device: str = "cpu",
    compile: bool = False,
    deterministic: bool = False,
    weights: str = "auto",
    kv_store: str | None = None,
    kv_store_mb: float = KV_STORE_MB,
    kv_dtype: str | None = None,
    activations: str = "auto",
) -> None:
    """Load the model, generate from `prompt` (chat template unless `raw`; `chat` requires one) and show the
    answer as it streams, then the prefill, the cache, TTFT measured beside predicted, and decode."""
    from prefill.cli.report import show_run
    from prefill.engine.prompt import check_text
    from prefill.engine.sampling import SamplingParams

    if max_new_tokens < 0:
        fail(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    if chat and raw:
        fail("--chat and --raw contradict each other: give one")
    check_text(prompt)  # bad input fails before the model loads
    store = {"kv_store": kv_store, "kv_store_mb": kv_store_mb, "kv_dtype": kv_dtype, "activations": activations}
    engine = load_engine(model, dtype, threads, device, compile, deterministic, weights, **store)
    if not raw and not (engine.tokenizer and engine.tokenizer.chat_template):
        if chat:
            fail(f"{engine.source} has no chat template: drop --chat to run the prompt raw")
        console.print("note: this model has no chat template, so the prompt runs raw")
    sampling = sampling or SamplingParams()
    events = engine.generate(
        prompt, chat=not raw, max_new_tokens=max_new_tokens, sampling=sampling, stop=stop, chunk_size=chunk_size
    )
    show_run(console, engine, events, chunk_size)
    if engine.kv_store is not None:
        engine.kv_store.close()  # the prompt's blocks reach the directory before the process ends


def verify(
    prompt: Annotated[str, typer.Argument(help="Prompt to check on (chat template applied)")] = DEMO_PROMPT,
    model: ModelPath = None,
    chunk_size: Annotated[int, typer.Option(help="Chunk size for the chunked-prefill check")] = 7,
    reference: Annotated[bool, typer.Option(help="Also compare with Hugging Face transformers (if installed)")] = True,
    deterministic: Deterministic = False,
    quality: Annotated[
        bool, typer.Option("--quality", help="The quality gate instead: every path vs float32, beside llama.cpp")
    ] = False,
    tokens: Annotated[int | None, typer.Option(help="--quality: tokens of the held-out text (default 10,240)")] = None,
    window: Annotated[int, typer.Option(help="--quality: tokens per window (its second half is scored)")] = 512,
    threads: Threads = None,
) -> None:
    """The proofs, in float32: parallel == sequential, chunks == one pass, KV bytes == formula, batched decode ==
    alone, logits == HF; with --deterministic also batched and chunked == alone, bitwise. With --quality: each
    reduced-precision path's KL divergence, top-1 agreement and perplexity against the float32-activation
    reference on a held-out text, whether it is near-lossless (the gate `auto` reads, cached per model file), and
    llama.cpp's own beside them."""
    if quality:
        verify_quality(model, tokens, window, threads)
        return
    from prefill.model.quant import set_activations

    engine = load_engine(model, "float32", None, deterministic=deterministic)
    set_activations(engine.model, "f32")  # the proofs hold the float32 reference, whatever PREFILL_ACTIVATIONS says
    ids = engine.encode_prompt(prompt)
    checks = run_proofs(engine, ids, chunk_size, reference)
    if deterministic:
        from prefill.engine import proofs

        P = len(ids)
        checks += proofs.batch_invariance(engine, [ids, ids[: max(1, P // 2)], ids[: max(1, P // 3)]], 3, (chunk_size,))
    console.print(proofs_table(engine.source, len(ids), checks))
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


def verify_quality(model: str | None, tokens: int | None, window: int, threads: int | None) -> None:
    """`prefill verify --quality`: the table, each path's figures cached for the quality gate (`auto` reads them)."""
    from prefill.bench.quality import QUALITY_TOKENS, TEXT_SOURCE, quality_table, run_quality
    from prefill.device.capability import capability

    tokens = QUALITY_TOKENS if tokens is None else tokens
    with console.status(f"scoring {tokens:,} tokens of the held-out text on every path"):
        rep = run_quality(model, tokens, window, threads)
    cpu = capability("cpu")
    title = f"quality on {cpu.name} ({cpu.kind}): {rep.tokens:,} tokens of {TEXT_SOURCE}, windows of {rep.window}"
    wide_console(170).print(
        quality_table([*rep.rows, *([rep.llama] if rep.llama else [])], rep.reference, rep.llama, title)
    )
    for note in rep.notes:
        console.print(note, highlight=False)
    console.print("cached for the quality gate: `auto` weighs a reduced-precision path only where it is near-lossless")


def run_proofs(engine, ids: list[int], chunk_size: int, reference: bool) -> list:
    """Every proof on the prompt `ids`: prefill paths, cache bytes (for every K/V dtype), batched decode, and
    (when `reference` and transformers is installed) parity with the same weights in transformers."""
    from prefill.costmodel.costs import KV_DTYPES
    from prefill.engine import proofs

    checks = proofs.parallel_vs_sequential(engine, ids) + proofs.chunked_vs_single(engine, ids, chunk_size)
    checks += [proofs.kv_bytes_match_formula(engine, len(ids), kv) for kv in KV_DTYPES]
    P = len(ids)
    others = [ids[: max(1, P // 3)], ids[: max(1, 2 * P // 3)], (ids * 3)[: min(3 * P, engine.spec.context_length - 8)]]
    checks += proofs.batched_vs_alone(engine, [ids, *others])
    if not reference:
        return checks
    try:
        import transformers  # noqa: F401
    except ImportError:
        console.print("[yellow]transformers is not installed: skipping the reference comparison[/]")
        return checks
    with console.status("loading the same weights in transformers"):
        ref = proofs.load_reference(engine.source)
    return checks + proofs.parity_with_reference(engine, ref, ids)


def proofs_table(source: str, P: int, checks: list):
    """One row per check: the largest difference, its tolerance, PASS or FAIL."""
    from rich.table import Table

    table = Table(title=f"proofs on {source} (P = {P} tokens, float32)", title_justify="left")
    table.caption = (
        "tolerance = u * sqrt(K) * L * max|values compared| (float32 roundoff, longest GEMM inner "
        "dimension, layers): what two correct runs summing in another order may differ by"
    )
    for col in ("check", "max |difference|", "tolerance", "result"):
        table.add_column(col)
    for c in checks:
        measured = f"{c.measured:.3g}" + (f" ({c.detail})" if c.detail else "")
        table.add_row(c.name, measured, f"{c.tolerance:g}", "[green]PASS[/]" if c.ok else "[red]FAIL[/]")
    return table
