"""What `prefill run` shows: the model, the prefill, the cache, TTFT measured beside predicted, the answer.

Rendering only: every number comes from the engine's measurements or from `prefill.costmodel.costs`.
"""

from __future__ import annotations

import statistics

from rich.console import Console
from rich.table import Table

from prefill.cli.common import ms
from prefill.costmodel import costs
from prefill.engine.llm import Engine
from prefill.engine.request import Generation


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", show_header=len(columns) > 2)
    for c in columns:
        t.add_column(c)
    return t


def model_table(engine: Engine) -> Table:
    s = engine.spec
    t = _table("model", "quantity", "value")
    t.add_row("source", engine.source)
    t.add_row("architecture", f"{s.arch}: L={s.L}, d_model={s.d_model}, d_ff={s.d_ff}, vocab={s.vocab_size:,}")
    t.add_row("attention", f"H_q={s.H_q}, H_kv={s.H_kv} (GQA {s.H_q // s.H_kv}:1), d_head={s.d_head}")
    t.add_row("parameters N", f"{s.N:,} ({s.N_non_embedding:,} non-embedding)")
    t.add_row(
        "dtype / device / threads", f"{str(engine.dtype).removeprefix('torch.')} / {engine.device} / {engine.threads()}"
    )
    return t


def prompt_table(engine: Engine, gen: Generation, chunk_size: int | None) -> Table:
    """The prefill: P tokens in one pass, its FLOPs, the cache it built (measured bytes beside the formula)."""
    s, P = engine.spec, gen.P
    new = P - gen.cached_tokens
    count = costs.prefill_flops_exact(s, new, gen.cached_tokens)
    b = engine.dtype.itemsize
    t = _table("prefill", "quantity", "value")
    t.add_row("prompt tokens P", f"{P}" + (f" ({gen.cached_tokens} reused from a cache)" if gen.cached_tokens else ""))
    passes = "one forward pass" if not chunk_size or chunk_size >= new else f"chunks of {chunk_size}"
    t.add_row("prefill", f"{new} tokens in {passes}, causal mask, logits of position {P - 1} only")
    t.add_row("FLOPs 2·N·P", f"{costs.prefill_flops(s.N, new):.4g}")
    parts = f"linear {count.linear:.3g} + attention {count.attention:.3g} + unembed {count.unembed:.3g}"
    t.add_row("FLOPs exact", f"{count.total:.4g} ({parts})")
    shape = ", ".join(str(n) for n in gen.kv_shape)  # read off the cache, not derived
    t.add_row("KV cache per layer", f"K and V each [B, H_kv, P, d_head] = [{shape}]")
    measured = gen.kv_bytes
    formula = costs.kv_cache_bytes_for(s, P, b)
    verdict = "[green]equal[/]" if measured == formula else "[red]DIFFERENT[/]"
    t.add_row("KV bytes held (measured)", costs.format_bytes(measured))
    name = "Σ_l 2·B·H_kv·min(P, W_l)·d_head·b" if s.windowed else "2·L·B·H_kv·P·d_head·b"
    t.add_row(f"KV bytes {name}", f"{costs.format_bytes(formula)}  {verdict}")
    return t


def ttft_table(engine: Engine, gen: Generation, chunk_size: int | None) -> Table:
    """TTFT = network + tokenization + prefill (+ sampling the first token), measured beside predicted."""
    predicted_prefill, how = engine.predict_prefill_seconds(gen.P - gen.cached_tokens, gen.cached_tokens, chunk_size)
    predicted_ttft = costs.ttft_seconds(predicted_prefill, network_s=0.0, tokenize_s=gen.tokenize_s)
    t = _table("time to first token", "part", "measured", "predicted")
    t.add_row("network", "0 (in-process)", "0")
    t.add_row("tokenization", ms(gen.tokenize_s), ms(gen.tokenize_s))
    t.add_row("prefill compute", ms(gen.prefill_s), f"{ms(predicted_prefill)} ({how})")
    if (use := gen.kv_store) is not None and use.decision.n_tokens:  # a stored prefix was found
        d = use.decision
        measured = f"{ms(use.load_s)} ({use.loaded_tokens} tokens loaded)" if use.loaded_tokens else "-"
        t.add_row(f"KV store: {d.choice} {d.n_tokens} tokens", measured,
                  f"load {ms(d.load_s)} vs compute {ms(d.compute_s)}")  # fmt: skip
    t.add_row("first-token sampling", ms(gen.first_token_s), "-")
    t.add_row("[bold]TTFT[/]", f"[bold]{ms(gen.ttft_s)}[/]", f"[bold]{ms(predicted_ttft)}[/]")
    return t


def decode_table(engine: Engine, gen: Generation) -> Table:
    """ITL percentiles, request time beside TTFT + (n-1)*ITL, achieved FLOP/s and MFU of the prefill."""
    n = len(gen.token_ids)
    t = _table("decode and the whole request", "quantity", "value")
    t.add_row("output tokens n", f"{n} (finish: {gen.finish_reason})")
    if gen.itl_s:
        q = statistics.quantiles(gen.itl_s, n=10) if len(gen.itl_s) > 1 else [gen.itl_s[0]] * 9
        mean_itl = statistics.fmean(gen.itl_s)
        t.add_row("ITL p50 / p90", f"{ms(statistics.median(gen.itl_s))} / {ms(q[8])}")
        t.add_row("steady decode rate 1/ITL", f"{costs.decode_rate(mean_itl):,.1f} tok/s")
        t.add_row(
            "request time: measured / TTFT + (n-1)·ITL",
            f"{ms(gen.total_s)} / {ms(costs.request_seconds(gen.ttft_s, n, mean_itl))}",
        )
        t.add_row("request output rate n/T", f"{costs.request_output_rate(n, gen.total_s):,.1f} tok/s")
    count = costs.prefill_flops_exact(engine.spec, gen.P - gen.cached_tokens, gen.cached_tokens)
    if gen.prefill_s > 0:
        peak = engine.gemm_rate()
        t.add_row(
            "prefill achieved",
            f"{count.total / gen.prefill_s / 1e9:,.1f} GFLOP/s "
            f"({(gen.P - gen.cached_tokens) / gen.prefill_s:,.0f} tok/s)",
        )
        t.add_row(
            "MFU",
            f"{costs.mfu(count.total, gen.prefill_s, peak):.1%} of {peak / 1e9:,.0f} GFLOP/s "
            f"(GEMM rate measured now in {str(engine.dtype).removeprefix('torch.')})",
        )
    return t


def show_run(console: Console, engine: Engine, events, chunk_size: int | None = None) -> Generation:
    """Stream the answer as it is generated, then print the tables."""
    console.print(model_table(engine))
    gen = None
    first = True
    for ev in events:
        if isinstance(ev, Generation):
            gen = ev
            break
        if first:
            console.print(f"[bold]first token[/]: id {ev.token_id} {engine.tokenizer.decode([ev.token_id])!r}")
            console.print("[bold]answer[/]: ", end="")
            first = False
        console.print(ev.text, end="", highlight=False, markup=False, soft_wrap=True)
    console.print()
    console.print(prompt_table(engine, gen, chunk_size))
    console.print(ttft_table(engine, gen, chunk_size))
    console.print(decode_table(engine, gen))
    return gen
