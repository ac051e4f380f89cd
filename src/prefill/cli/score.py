"""`prefill score`: the perplexity of a text, every position's log-probability from one prefill per window."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from prefill.cli.common import KV_STORE_MB, Activations, KVStoreDir, KVStoreMb, ModelPath, console, fail, load_engine

Window = Annotated[
    int | None, typer.Option(help="Tokens per window (default: the whole text, up to the context length)")
]
Stride = Annotated[int | None, typer.Option(help="Tokens between window starts (default: the window)")]
ChunkSize = Annotated[
    int | None, typer.Option("--chunk-size", help="Prefill each window in chunks of this many tokens")
]
Tokens = Annotated[bool, typer.Option("--tokens", help="Show every token with its log-probability")]


def score(
    file: Annotated[str, typer.Argument(help="A text file, or - for standard input.")],
    model: ModelPath = None,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16")] = "float32",
    window: Window = None,
    stride: Stride = None,
    chunk_size: ChunkSize = None,
    tokens: Tokens = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables")] = False,
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: torch's choice)")] = None,
    kv_store: KVStoreDir = None,
    kv_store_mb: KVStoreMb = KV_STORE_MB,
    activations: Activations = "f32",
) -> None:
    """Perplexity of a text in one prefill per window: every position's log-probability, FLOPs beside time.
    Exact unless asked otherwise: float32 activations and K/V (`--activations` and `--dtype` name another path).
    With --kv-store, a window's context that it does not score (--stride below --window) is loaded from an
    earlier run of the same text when faster."""
    from prefill.cli import score_report
    from prefill.engine.scoring import perplexity, windows
    from prefill.engine.scoring import score as score_tokens

    text = read_text(file)
    if window is not None:
        windows(1, window, stride or window)  # a bad window or stride fails before the model loads
    engine = load_engine(model, dtype, threads, activations=activations, kv_store=kv_store, kv_store_mb=kv_store_mb)
    ids = engine.need_tokenizer().encode(text, add_special_tokens=True)
    score_tokens(engine, ids[:2])  # warm-up: the all-position unembedding's kernels, not timed
    result = perplexity(engine, ids, window, stride, chunk_size, engine.kv_store)
    if engine.kv_store is not None:
        engine.kv_store.close()  # the windows' blocks reach the directory before the process ends
    r = score_report.summary(engine, ids, result, with_tokens=tokens)
    if json_out:
        typer.echo(json.dumps(r, indent=2))
        return
    console.print(score_report.summary_table(r))
    if tokens:
        pieces = score_report.token_pieces(engine, ids)
        console.print(score_report.coloured_text(pieces, result.logprobs))
        console.print(score_report.tokens_table(pieces, ids, result.logprobs))


def read_text(file: str) -> str:
    """The text of `file` (- for standard input); one error line when it cannot be read or holds no text."""
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {file}: {e.strerror if isinstance(e, OSError) else e}")
    if not text.strip():
        fail(f"{'standard input' if file == '-' else file} is empty: there is no text to score")
    return text
