"""What `prefill score` shows: perplexity, tokens/s, the scoring prefill's FLOPs beside the measured time, and a
per-token view coloured by surprise.

Rendering only: the numbers come from `prefill.engine.scoring` (measured) and `prefill.costmodel.costs` (predicted).
"""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from prefill.costmodel import costs
from prefill.engine.llm import Engine
from prefill.engine.scoring import Perplexity

# Surprise (-log p, nats) -> colour: expected, plausible, surprising, very surprising.
SURPRISE = ((1.0, "green"), (3.0, "yellow"), (6.0, "dark_orange"), (float("inf"), "red"))


def scoring_flops(engine: Engine, result: Perplexity) -> costs.FlopCount:
    """FLOPs of every window's scoring prefill: each unembeds its targets' predecessors and its last position."""
    parts = []
    for w in result.windows:
        n = w.end - w.begin
        first = max(1, n - w.new)
        parts.append(costs.scoring_flops_exact(engine.spec, n, unembedded=n - first + 1))
    return costs.FlopCount(*(sum(getattr(c, f) for c in parts) for f in ("linear", "attention", "unembed")))


def summary(engine: Engine, ids: list[int], result: Perplexity, with_tokens: bool = False) -> dict:
    """Everything `prefill score --json` prints: measured figures and the cost model's FLOPs."""
    count = scoring_flops(engine, result)
    generation = sum(costs.prefill_flops_exact(engine.spec, w.end - w.begin).total for w in result.windows)
    out = {
        "model": engine.source,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "path": engine.path_label,
        "tokens": len(ids),
        "window": result.window,
        "stride": result.stride,
        "windows": len(result.windows),
        "scored_tokens": sum(lp is not None for lp in result.logprobs),
        "perplexity": result.ppl,
        "nll_per_token": result.nll,
        "guide_n_tokens": result.tokens,
        "seconds": result.seconds,
        "prefilled_tokens": (prefilled := sum(w.end - w.begin for w in result.windows)),  # overlaps counted again
        "tokens_per_s": prefilled / result.seconds,
        "flops": count.to_dict() | {"unembed_share": count.unembed_share},
        "generation_prefill_flops": generation,
        "achieved_flops_per_s": count.total / result.seconds,
    }
    if with_tokens:
        pieces = token_pieces(engine, ids)
        out["token_logprobs"] = [
            {"id": i, "token": p, "logprob": lp} for i, p, lp in zip(ids, pieces, result.logprobs, strict=True)
        ]
    return out


def token_pieces(engine: Engine, ids: list[int]) -> list[str]:
    tok = engine.need_tokenizer()
    return [tok.decode([i], skip_special=False) for i in ids]


def summary_table(r: dict) -> Table:
    t = Table(title="scoring", title_justify="left", show_header=False)
    t.add_column("quantity", style="cyan")
    t.add_column("value")
    f = r["flops"]
    one = r["windows"] == 1 and r["window"] == r["tokens"]
    windows = (
        "one window (the whole text)" if one else f"{r['windows']} windows of {r['window']:,} every {r['stride']:,}"
    )
    t.add_row("path", r["path"])
    t.add_row("text", f"{r['tokens']:,} tokens, {windows}")
    t.add_row(
        "perplexity",
        f"{r['perplexity']:.4f} (mean NLL {r['nll_per_token']:.4f} nats/token, {r['scored_tokens']:,} tokens scored)",
    )
    t.add_row(
        "prefill (measured)",
        f"{r['seconds'] * 1e3:,.1f} ms for {r['prefilled_tokens']:,} tokens "
        f"(all windows): {r['tokens_per_s']:,.0f} tokens/s",
    )
    t.add_row(
        "FLOPs of the scoring",
        f"{f['total']:.4g} (linear {f['linear']:.3g}, attention {f['attention']:.3g}, unembed {f['unembed']:.3g})",
    )
    t.add_row(
        "unembedding share",
        f"{f['unembed_share']:.1%} (every position's logits; a generation prefill of the "
        f"same windows: {r['generation_prefill_flops']:.4g} FLOPs)",
    )
    t.add_row("achieved", f"{r['achieved_flops_per_s'] / 1e9:,.1f} GFLOP/s ({r['dtype']})")
    return t


def colour(logprob: float | None) -> str:
    if logprob is None:
        return "dim"
    return next(c for limit, c in SURPRISE if -logprob < limit)


def coloured_text(pieces: list[str], logprobs: list[float | None]) -> Text:
    """The text itself, each token coloured by its surprise."""
    text = Text()
    for piece, lp in zip(pieces, logprobs, strict=True):
        text.append(piece, style=colour(lp))
    return text


def tokens_table(pieces: list[str], ids: list[int], logprobs: list[float | None]) -> Table:
    t = Table(title="tokens", caption="-log p (nats): green <1, yellow <3, orange <6, red >=6", title_justify="left")
    for col in ("position", "id", "token", "log p", "p"):
        t.add_column(col, justify="right" if col != "token" else "left")
    for j, (piece, i, lp) in enumerate(zip(pieces, ids, logprobs, strict=True)):
        style = colour(lp)
        cells = ("-", "-") if lp is None else (f"{lp:.4f}", f"{math.exp(lp):.4f}")
        t.add_row(str(j), str(i), repr(piece), *(Text(c, style=style) for c in cells))
    return t
