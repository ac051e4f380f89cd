"""`prefill simulate --plan`'s report: one row per tensor-parallel width, and the cheapest that meets the SLO."""

from __future__ import annotations

import contextlib

from prefill.cli.common import console, err_console, ms
from prefill.plan.capacity import PlanRow, cheapest


def _or_dash(value, fmt) -> str:
    return "-" if value is None else fmt(value)


def _ms(s: float) -> str:
    return f"{s * 1e3:,.0f} ms"


def print_plan(name: str, rate: float, slo_ttft_ms: float, rows: list[PlanRow]) -> None:
    t = _table(f"{name}: replicas for p99 TTFT <= {slo_ttft_ms:,.0f} ms at {rate:g} req/s (simulated)")
    for col in ("TP", "replicas", "GPUs", "KV pool", "max req/s", "TTFT p50", "TTFT p99", "ITL p50"):
        t.add_column(col, justify="right", overflow="fold")  # a cell too wide wraps, never cut
    t.add_column("note", overflow="fold")
    for r in rows:
        t.add_row(
            str(r.tp),
            _or_dash(r.replicas, str),
            _or_dash(r.gpus, str),
            f"{r.pool_tokens / 1e3:,.0f}k",
            _or_dash(r.capacity_req_per_s, lambda x: f"{x:.3g}"),
            _or_dash(r.ttft_p50_s, _ms),
            _or_dash(r.ttft_p99_s, _ms),
            _or_dash(r.itl_p50_s, ms),
            r.note,
        )
    console.print(t)
    console.print(
        "KV pool: positions per replica; max req/s: one replica's throughput with every request queued at once",
        highlight=False,
    )
    best = cheapest(rows)
    if best is None:
        console.print("no tensor-parallel width tried meets the SLO", highlight=False)
    else:
        console.print(
            f"fewest GPUs: TP {best.tp} x {_n(best.replicas, 'replica')} = {_n(best.gpus, 'GPU')} "
            f"(p99 TTFT {ms(best.ttft_p99_s)}, each replica at {rate / best.replicas:.3g} req/s)",
            highlight=False,
        )


def print_deployments(options, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> None:
    """`prefill plan`'s ranking: every candidate deployment, cheapest first, why each is bound, and the command
    that launches the best. Narrower than the terminal, a cell wraps; nothing is cut."""
    slo = ", ".join(x for x in (_slo("TTFT", slo_ttft_ms), _slo("TPOT", slo_tpot_ms)) if x)
    t = _table(f"deployments meeting p99 {slo} (simulated), cheapest first")
    names = {"GPU", "engine"}  # never wrapped: the numbers' cells wrap first where the terminal is narrow
    for col in ("#", "GPU", "TP", "engine", "weights/KV", "replicas", "$/h", "$/M out", "TTFT p99", "TPOT p99"):
        t.add_column(col, justify="right", overflow="fold", no_wrap=col in names)
    for i, o in enumerate(options, 1):
        r = o.run
        t.add_row(
            str(i), o.gpu, str(o.tp), o.engine, f"{_short(o.weights)}/{_short(o.kv)}", _or_dash(o.replicas, str),
            _or_dash(o.usd_per_hour, lambda x: f"{x:,.2f}"), _or_dash(o.usd_per_m_output, lambda x: f"{x:,.3f}"),
            _or_dash(r and r.ttft_p99_s, _ms), _or_dash(r and r.tpot_p99_s, ms),
        )  # fmt: skip
    console.print(t)
    for i, o in enumerate(options, 1):  # each row's bound or note, as long as it needs, below the table
        console.print(f"{i:>2}: {o.note or (o.run.bound if o.run else '')}", highlight=False, markup=False)
    best = next((o for o in options if o.replicas is not None), None)
    if best is None:
        console.print("no candidate meets the SLO: relax it, or try more GPUs per replica (--tps)", highlight=False)
        return
    console.print(
        f"cheapest: {best.replicas} x {best.engine} on {best.tp} x {best.gpu} ({_n(best.gpus, 'GPU')}, "
        f"${best.usd_per_hour:,.2f}/h, ${best.usd_per_m_output:,.3f} per million output tokens); each replica:",
        highlight=False,
    )
    for name, text in best.files:
        console.print(f"  {name}:", highlight=False)
        for line in text.splitlines():
            console.print(f"    {line}", highlight=False, markup=False)
    console.print(f"  {best.command or best.note}", highlight=False, markup=False, soft_wrap=True)


@contextlib.contextmanager
def searching():
    """A progress bar of the candidates searched, on stderr and only at a terminal (stdout keeps the results,
    JSON included); yields the planner's progress callback (done, total)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("simulating candidates"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True, disable=not err_console.is_terminal) as bar:
        task = bar.add_task("plan", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


def _table(title: str):
    """A table that keeps to the terminal: a rule under the header, one space between columns."""
    from rich import box
    from rich.table import Table

    return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def _slo(name: str, value: float | None) -> str:
    return "" if value is None else f"{name} <= {value:,.0f} ms"
