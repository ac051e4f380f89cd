"""What a benchmark run shows: rich tables, and the JSON file that holds every sample."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from prefill.bench.calibrate import CalibrationReport
from prefill.bench.runner import OURS, BenchResult
from prefill.costs import bytes_to_mib


def short(dtype: str) -> str:
    """'float32' -> 'fp32', 'bfloat16' -> 'bf16' (table cells)."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def machine_line(result: BenchResult) -> str:
    """One line: CPU/GPU, threads and versions the figures were measured with."""
    m = result.machine
    gemm = ", ".join(f"{dt} {rate / 1e9:.0f} GFLOP/s" for dt, rate in result.gemm_flops_per_s.items())
    parts = [
        f"{m['device'] if m['device'] != 'cpu' else m['cpu']} ({m['cores']} cores), {m['threads']} threads",
        f"torch {m['torch']}",
        f"transformers {m['transformers']}" if m.get("transformers") else "",
        f"llama-cpp-python {m['llama_cpp']}" if m.get("llama_cpp") else "",
        f"GEMM rate measured: {gemm}",
    ]
    return "; ".join(p for p in parts if p)


def ours_table(result: BenchResult) -> Table:
    """Our engine at every (dtype, P): times, rates, MFU, memory, and the cost model beside the measurement."""
    t = Table(title=f"prefill: {result.spec.name}")
    for col in ("dtype", "P", "cold ms", "median ms", "p90 ms", "tok/s", "GFLOP/s", "MFU", "peak MiB", "+MiB"):
        t.add_column(col, justify="right")
    t.add_column("pred. ms", justify="right")  # exact FLOPs at the GEMM rate measured in the run
    if result.calibrations:
        t.add_column("calibrated ms", justify="right")
    t.caption = (
        "cold: first call; median, p90: warm repeats; MFU against the GEMM rate measured in the run; "
        "+MiB: peak memory rise during one call; pred.: exact FLOPs at that GEMM rate"
    )
    for m in (m for m in result.measurements if m.engine == OURS and m.chunk_size is None):
        row = [
            short(m.dtype),
            str(m.P),
            f"{m.cold_s * 1e3:.1f}",
            f"{m.median_s * 1e3:.1f}",
            f"{m.p90_s * 1e3:.1f}",
            f"{m.tokens_per_s:,.0f}",
            f"{m.flops_per_s / 1e9:.1f}",
            f"{m.mfu:.0%}" if m.mfu is not None else "-",
            f"{bytes_to_mib(m.peak_bytes):,.0f}",
            f"{bytes_to_mib(m.peak_delta_bytes):,.0f}",
            f"{m.predicted_s * 1e3:.1f}",
        ]
        if result.calibrations:
            err = "" if m.calibrated_s is None else f" ({100 * (m.calibrated_s - m.median_s) / m.median_s:+.1f}%)"
            row.append("-" if m.calibrated_s is None else f"{m.calibrated_s * 1e3:.1f}{err}")
        t.add_row(*row)
    return t


def peers_table(result: BenchResult) -> Table:
    """Tokens/s of every engine at every (dtype, P) and our speed-up over each peer."""
    peers = sorted({m.engine for m in result.measurements} - {OURS})
    t = Table(
        title="side by side: the same tokens and threads, tokens/s of the median run",
        caption="speed-up = our tokens/s over the peer's; llama.cpp runs the GGUF's own quantized types",
    )
    t.add_column("dtype", justify="right")
    t.add_column("P", justify="right")
    t.add_column("prefill tok/s", justify="right")
    for p in peers:
        t.add_column(f"{p} tok/s", justify="right")
        t.add_column("speed-up", justify="right")
    for m in (m for m in result.measurements if m.engine == OURS and m.chunk_size is None):
        row = [short(m.dtype), str(m.P), f"{m.tokens_per_s:,.0f}"]
        for p in peers:
            theirs = result.find(p, m.dtype, m.P) or result.find(p, "gguf", m.P)
            speedup = result.speedup(p, m.dtype, m.P)
            row += [
                "-" if theirs is None else f"{theirs.tokens_per_s:,.0f}",
                "-" if speedup is None else f"{speedup:.2f}x",
            ]
        t.add_row(*row)
    return t


def calibration_table(dtype: str, rep: CalibrationReport) -> Table:
    """Predicted vs measured seconds for every P, with the fitted rates in the title."""
    c = rep.calibration
    held = rep.holdout_mape_pct
    t = Table(
        title=f"calibration {dtype}: fitted on P = {', '.join(map(str, rep.fitted_on))}",
        caption=(
            f"overhead {c.overhead_s * 1e3:.2f} ms, linear {c.linear_flops_per_s / 1e9:.1f} GFLOP/s, attention "
            f"{c.attention_flops_per_s / 1e9:.1f} GFLOP/s; MAPE {rep.mape_pct:.1f}% over all points"
            + ("" if held is None else f", {held:.1f}% over the held-out ones")
        ),
    )
    for col in ("P", "measured ms", "predicted ms", "error", "fit point"):
        t.add_column(col, justify="right")
    for r in rep.rows:
        t.add_row(
            str(r.P) if r.past == 0 else f"{r.P} after {r.past} cached",
            f"{r.measured_s * 1e3:.1f}",
            f"{r.predicted_s * 1e3:.1f}",
            f"{r.error_pct:+.1f}%",
            "yes" if r.fitted else "",
        )
    return t


def chunk_table(result: BenchResult) -> Table | None:
    """Time and peak memory against chunk size C (None: no chunk sweep ran)."""
    rows = [m for m in result.measurements if m.engine == OURS and m.chunk_size is not None]
    if not rows:
        return None
    t = Table(title="chunked prefill: time and memory against chunk size C")
    for col in ("dtype", "P", "C", "median ms", "tok/s", "peak MiB", "+MiB", "one pass ms", "one pass +MiB"):
        t.add_column(col, justify="right")
    for m in rows:
        whole = result.find(OURS, m.dtype, m.P)
        t.add_row(
            short(m.dtype),
            str(m.P),
            str(m.chunk_size),
            f"{m.median_s * 1e3:.1f}",
            f"{m.tokens_per_s:,.0f}",
            f"{bytes_to_mib(m.peak_bytes):,.0f}",
            f"{bytes_to_mib(m.peak_delta_bytes):,.0f}",
            "-" if whole is None else f"{whole.median_s * 1e3:.1f}",
            "-" if whole is None else f"{bytes_to_mib(whole.peak_delta_bytes):,.0f}",
        )
    return t


def to_json(result: BenchResult) -> dict[str, Any]:
    """The whole run as plain JSON data: config, machine, GEMM rates, every sample, calibrations."""
    return {
        "model": result.model,
        "spec": dataclasses.asdict(result.spec),
        "config": dataclasses.asdict(result.config),
        "machine": result.machine,
        "gemm_flops_per_s": result.gemm_flops_per_s,
        "measurements": [dataclasses.asdict(m) for m in result.measurements],
        "speedups": [
            {"peer": p, "dtype": m.dtype, "P": m.P, "speedup": result.speedup(p, m.dtype, m.P)}
            for m in result.measurements
            if m.engine == OURS and m.chunk_size is None
            for p in sorted({x.engine for x in result.measurements} - {OURS})
        ],
        "calibrations": {
            dt: {
                "calibration": dataclasses.asdict(rep.calibration),
                "fitted_on": list(rep.fitted_on),
                "mape_pct": rep.mape_pct,
                "holdout_mape_pct": rep.holdout_mape_pct,
                "rows": [dataclasses.asdict(r) | {"error_pct": r.error_pct} for r in rep.rows],
            }
            for dt, rep in result.calibrations.items()
        },
        "notes": result.notes,
    }


def write_json(result: BenchResult, out_dir: Path) -> Path:
    """Write bench.json into `out_dir`; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench.json"
    path.write_text(json.dumps(to_json(result), indent=2) + "\n")
    return path


def markdown(data: dict[str, Any]) -> str:
    """README tables from a bench.json (as loaded): machine line, ours beside each peer, calibration."""
    ms = data["measurements"]
    ours = [m for m in ms if m["engine"] == OURS and m["chunk_size"] is None]
    peers = sorted({m["engine"] for m in ms} - {OURS})
    speed = {(s["peer"], s["dtype"], s["P"]): s["speedup"] for s in data["speedups"]}

    def tok(engine: str, dtype: str, P: int) -> str:
        hit = [m for m in ms if m["engine"] == engine and m["P"] == P and m["dtype"] in (dtype, "gguf")]
        return f"{hit[0]['tokens_per_s']:,.0f}" if hit else "-"

    m0 = data["machine"]
    gemm = ", ".join(f"{short(dt)} {r / 1e9:.0f} GFLOP/s" for dt, r in data["gemm_flops_per_s"].items())
    lines = [
        f"Machine: {m0['cpu']}, {m0['cores']} cores, {m0['threads']} threads; torch {m0['torch']}, "
        f"transformers {m0['transformers']}, llama-cpp-python {m0['llama_cpp']}; measured GEMM rate: {gemm}; "
        f"5-minute load average {m0.get('load_average_5min', float('nan')):.1f}.",
        "",
        "| dtype | P | prefill ms (median / p90) | prefill tok/s | MFU | "
        + " | ".join(f"{p} tok/s | speed-up" for p in peers)
        + " | predicted ms (GEMM rate) | calibrated ms (error) |",
        "|" + "---|" * (7 + 2 * len(peers)),
    ]
    for m in ours:
        cells = [short(m["dtype"]), str(m["P"]), f"{m['median_s'] * 1e3:.1f} / {m['p90_s'] * 1e3:.1f}",
                 f"{m['tokens_per_s']:,.0f}", f"{m['mfu']:.0%}"]  # fmt: skip
        for p in peers:
            s = speed.get((p, m["dtype"], m["P"]))
            cells += [tok(p, m["dtype"], m["P"]), "-" if s is None else f"{s:.2f}x"]
        cal = m["calibrated_s"]
        err = "" if cal is None else f" ({100 * (cal - m['median_s']) / m['median_s']:+.1f}%)"
        cells += [f"{m['predicted_s'] * 1e3:.1f}", "-" if cal is None else f"{cal * 1e3:.1f}{err}"]
        lines.append("| " + " | ".join(cells) + " |")
    for dt, c in data["calibrations"].items():
        cal = c["calibration"]
        held = c["holdout_mape_pct"]
        lines += [
            "",
            f"Calibration {short(dt)} (fitted on P = {', '.join(map(str, c['fitted_on']))}): overhead "
            f"{cal['overhead_s'] * 1e3:.2f} ms, linear {cal['linear_flops_per_s'] / 1e9:.1f} GFLOP/s, attention "
            f"{cal['attention_flops_per_s'] / 1e9:.1f} GFLOP/s; MAPE {c['mape_pct']:.1f}% over all points"
            + ("" if held is None else f", {held:.1f}% over the held-out ones")
            + ".",
        ]
    chunks = [m for m in ms if m["chunk_size"] is not None]
    if chunks:
        lines += ["", "| dtype | P | chunk C | ms (median) | peak memory rise MiB |", "|---|---|---|---|---|"]
        for m in chunks:
            lines.append(f"| {short(m['dtype'])} | {m['P']} | {m['chunk_size']} | {m['median_s'] * 1e3:.1f} | "
                         f"{bytes_to_mib(m['peak_delta_bytes']):,.0f} |")  # fmt: skip
    lines += [f"\nNote: {n}" for n in data["notes"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(markdown(json.loads(Path(sys.argv[1]).read_text())))
