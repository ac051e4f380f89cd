"""`prefill simulate --plan`'s report: one row per tensor-parallel width, and the cheapest that meets the SLO."""

from __future__ import annotations

from prefill.bench.capacity import PlanRow, cheapest
from prefill.cli.common import console, ms


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
