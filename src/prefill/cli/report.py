"""What `prefill run` shows: the model, the prefill, the cache, TTFT and ITL measured beside predicted, the answer.

Rendering only: every number comes from the engine's measurements, from `prefill.costmodel.costs`, or from the
time model (`Engine.predict_prefill` / `predict_decode`), each prediction with its error and what dominates.
"""

from __future__ import annotations

import statistics

from rich.console import Console
from rich.table import Table

from prefill.cli.common import ms
from prefill.costmodel import costs
from prefill.costmodel.kv_store import load_seconds
from prefill.engine.llm import Engine
from prefill.engine.request import Generation


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", show_header=len(columns) > 2)
    for c in columns:
        t.add_column(c)
    return t


def _err(measured: float, predicted: float) -> str:
    """The prediction's error relative to the measurement."""
    return f"{predicted / measured - 1:+.0%}" if measured > 0 else "-"


def model_table(engine: Engine) -> Table:
    s = engine.spec
    t = _table("model", "quantity", "value")
    t.add_row("source", engine.source)
    t.add_row("architecture", f"{s.arch}: L={s.L}, d_model={s.d_model}, d_ff={s.d_ff}, vocab={s.vocab_size:,}")
    t.add_row("attention", f"H_q={s.H_q}, H_kv={s.H_kv} (GQA {s.H_q // s.H_kv}:1), d_head={s.d_head}")
    t.add_row("parameters N", f"{s.N:,} ({s.N_non_embedding:,} non-embedding)")
    t.add_row("path", engine.path_label)
    t.add_row("device / threads", f"{engine.device} / {engine.threads()}")
    return t


def prompt_table(engine: Engine, gen: Generation, chunk_size: int | None) -> Table:
    """The prefill: P tokens in one pass, its FLOPs, the cache it built (measured bytes beside the formula)."""
    s, P = engine.spec, gen.P
    new = P - gen.cached_tokens
    count = costs.prefill_flops_exact(s, new, gen.cached_tokens)
    b = engine.kv_bytes
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
    """TTFT = network + tokenization + prefill (+ sampling the first token), measured (warm) beside predicted,
    with the error and the part that dominates; the cold first prefill after load on its own line."""
    new, cached = gen.P - gen.cached_tokens, gen.cached_tokens
    pred = engine.predict_prefill(new, cached, chunk_size)
    predicted_ttft = costs.ttft_seconds(pred.seconds, network_s=0.0, tokenize_s=gen.tokenize_s)
    t = _table("time to first token (warm: after the warm-up)", "part", "measured", "predicted", "error")
    t.add_row("network", "0 (in-process)", "0", "")
    t.add_row("tokenization", ms(gen.tokenize_s), ms(gen.tokenize_s), "")
    what = f"prefill of {new} tokens" + (f" after {cached} cached" if cached else "")
    t.add_row(what, ms(gen.prefill_s), ms(pred.seconds), _err(gen.prefill_s, pred.seconds))
    if (use := gen.kv_store) is not None and use.decision.n_tokens:  # a stored prefix was found
        d = use.decision
        measured = f"{ms(use.load_s)} ({use.loaded_tokens} tokens loaded)" if use.loaded_tokens else "-"
        both = f" vs both {ms(d.both_s)}" if d.both_s is not None else ""
        t.add_row(
            f"KV store: {d.choice} {d.n_tokens} tokens" + (f" (head {d.split} computed)" if d.choice == "both" else ""),
            measured,
            f"load {ms(d.load_s)} vs compute {ms(d.compute_s)}{both}",
            "",
        )
    t.add_row("first-token sampling", ms(gen.first_token_s), "-", "")
    t.add_row(
        "[bold]TTFT[/]",
        f"[bold]{ms(gen.ttft_s)}[/]",
        f"[bold]{ms(predicted_ttft)}[/]",
        _err(gen.ttft_s, predicted_ttft),
    )
    profile = engine.profile()
    t.caption = f"prefill: {pred.explain()}\ntime model on the {profile.kind} profile: {profile.source}"
    if engine.cold_prefill_s is not None:
        t.caption += (
            f"\ncold (the first prefill after load, the warm-up's prompt): "
            f"{ms(engine.cold_prefill_s)}, beside a warm prediction of "
            f"{ms(engine.predict_prefill(16).seconds)}; not part of the figures above"
        )
    return t


def store_table(engine: Engine, gen: Generation) -> Table | None:
    """For a prompt whose prefix the KV store holds: computing those tokens, reading them from the page cache and
    from the disk, each predicted (the store's read rates were measured when it opened), beside the path taken,
    measured, and where its bytes came from (the files' pages resident before the read). None otherwise."""
    use, tier = gen.kv_store, engine.kv_store
    if use is None or tier is None or not use.decision.n_tokens:
        return None
    d, bw = use.decision, tier.bandwidth
    tier_read = None if not use.loaded_tokens or use.resident_share is None else use.resident_share >= 0.5
    t = _table(f"KV store: {d.n_tokens:,} stored tokens, compute or load", "path", "predicted", "measured")
    t.add_row("compute (prefill them)", ms(d.compute_s), "" if use.loaded_tokens else "in the prefill above")
    ram, disk = bw.ram_bytes_per_s, bw.disk_bytes_per_s
    loaded = ms(use.load_s) if tier_read and d.choice == "load" else ""
    t.add_row("load from the page cache", ms(load_seconds(d.load_bytes, ram)), loaded)
    t.add_row(
        "load from the disk",
        ms(load_seconds(d.load_bytes, disk)) if disk else "not measurable here",
        ms(use.load_s) if tier_read is False and d.choice == "load" else "",
    )
    if d.both_s is None:  # compute_or_load saw that it could not beat one path alone
        t.add_row("both: compute the head, load the tail meanwhile", "cannot win here", "")
    else:
        t.add_row(
            f"both: compute {d.split:,}, load {d.n_tokens - d.split:,} meanwhile",
            ms(d.both_s),
            f"{ms(use.load_s)} (the tail's load)" if d.choice == "both" and use.loaded_tokens else "",
        )
    t.caption = f"chosen: {d.choice} ({d.load_bytes / 1e6:,.1f} MB of block files; decided at the disk's rate)"
    if use.loaded_tokens and use.resident_share is not None:
        t.caption += f"; {use.resident_share:.0%} of their pages were in the page cache before the read"
    return t


def predicted_itls(engine: Engine, gen: Generation) -> list[float]:
    """The time model's seconds of each decode step of `gen`: one row at context P, P + 1, ..."""
    return [engine.predict_decode([gen.P + i]).seconds for i in range(len(gen.itl_s))]


def decode_table(engine: Engine, gen: Generation, chunk_size: int | None = None) -> Table:
    """ITL percentiles, request time beside TTFT + (n-1)*ITL, achieved FLOP/s and MFU of the prefill."""
    n = len(gen.token_ids)
    t = _table("decode and the whole request", "quantity", "value")
    t.add_row("output tokens n", f"{n} (finish: {gen.finish_reason})")
    if gen.itl_s:
        q = statistics.quantiles(gen.itl_s, n=10) if len(gen.itl_s) > 1 else [gen.itl_s[0]] * 9
        mean_itl = statistics.fmean(gen.itl_s)
        t.add_row("ITL p50 / p90", f"{ms(statistics.median(gen.itl_s))} / {ms(q[8])}")
        itls = predicted_itls(engine, gen)
        step = engine.predict_decode([gen.P + len(itls) // 2])
        p50 = statistics.median(itls)
        t.add_row("ITL p50 predicted", f"{ms(p50)} ({_err(statistics.median(gen.itl_s), p50)}; {step.explain()})")
        t.add_row("steady decode rate 1/ITL", f"{costs.decode_rate(mean_itl):,.1f} tok/s")
        t.add_row(
            "request time: measured / TTFT + (n-1)·ITL",
            f"{ms(gen.total_s)} / {ms(costs.request_seconds(gen.ttft_s, n, mean_itl))}",
        )
        ttft = costs.ttft_seconds(
            engine.predict_prefill(gen.P - gen.cached_tokens, gen.cached_tokens, chunk_size).seconds,
            tokenize_s=gen.tokenize_s,
        )
        predicted = costs.request_seconds(ttft, n, statistics.fmean(itls))
        t.add_row("request time predicted (TTFT + (n-1)·ITL)", f"{ms(predicted)} ({_err(gen.total_s, predicted)})")
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
            f"(the best GEMM rate probed at the model's shapes in {engine.dtype_name})",
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
    engine.profile(echo=lambda line: console.print(f"note: {line}", highlight=False))  # probed on first need
    console.print(prompt_table(engine, gen, chunk_size))
    console.print(ttft_table(engine, gen, chunk_size))
    if (stored := store_table(engine, gen)) is not None:
        console.print(stored)
    console.print(decode_table(engine, gen, chunk_size))
    return gen
