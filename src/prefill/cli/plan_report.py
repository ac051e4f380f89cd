"""`prefill simulate --plan`'s report: one row per tensor-parallel width, and the cheapest that meets the SLO."""

from __future__ import annotations

from prefill.cli.common import console, ms
from prefill.plan.capacity import PlanRow, cheapest


def _or_dash(value, fmt) -> str:
    return "-" if value is None else fmt(value)


def _ms(s: float) -> str:
    return f"{s * 1e3:,.0f} ms"


def print_plan(name: str, rate: float, slo_ttft_ms: float, rows: list[PlanRow]) -> None:
    from rich.table import Table

    t = Table(title=f"{name}: replicas for p99 TTFT <= {slo_ttft_ms:,.0f} ms at {rate:g} req/s (simulated)")
    for col in ("TP", "replicas", "GPUs", "KV pool", "max req/s", "TTFT p50", "TTFT p99", "ITL p50"):
        t.add_column(col, justify="right")
    t.add_column("note")
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
            f"fewest GPUs: TP {best.tp} x {best.replicas} replicas = {best.gpus} GPUs "
            f"(p99 TTFT {ms(best.ttft_p99_s)}, each replica at {rate / best.replicas:.3g} req/s)",
            highlight=False,
        )


def print_deployments(options, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> None:
    """`prefill plan`'s ranking: every candidate deployment, cheapest first, why each is bound, and the command
    that launches the best."""
    from rich.table import Table

    slo = ", ".join(x for x in (_slo("TTFT", slo_ttft_ms), _slo("TPOT", slo_tpot_ms)) if x)
    t = Table(title=f"deployments meeting p99 {slo} (simulated), cheapest first")
    for col in ("GPU", "TP", "engine", "weights/KV", "replicas", "$/h", "$/M out", "TTFT p99", "TPOT p99"):
        t.add_column(col, justify="right")
    t.add_column("bound by / note")
    for o in options:
        r = o.run
        t.add_row(
            o.gpu, str(o.tp), o.engine, f"{_short(o.weights)}/{_short(o.kv)}", _or_dash(o.replicas, str),
            _or_dash(o.usd_per_hour, lambda x: f"{x:,.2f}"), _or_dash(o.usd_per_m_output, lambda x: f"{x:,.3f}"),
            _or_dash(r and r.ttft_p99_s, _ms), _or_dash(r and r.tpot_p99_s, ms), o.note or (r.bound if r else ""),
        )  # fmt: skip
    console.print(t)
    best = next((o for o in options if o.replicas is not None), None)
    if best is None:
        console.print("no candidate meets the SLO: relax it, or try more GPUs per replica (--tps)", highlight=False)
        return
    console.print(
        f"cheapest: {best.replicas} x {best.engine} on {best.tp} x {best.gpu} ({best.gpus} GPUs, "
        f"${best.usd_per_hour:,.2f}/h, ${best.usd_per_m_output:,.3f} per million output tokens); each replica:",
        highlight=False,
    )
    console.print(f"  {best.command}", highlight=False, soft_wrap=True)


def _short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def _slo(name: str, value: float | None) -> str:
    return "" if value is None else f"{name} <= {value:,.0f} ms"
