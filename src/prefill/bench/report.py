"""What a benchmark run shows: rich tables, and the JSON file that holds every sample."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from prefill.bench.calibrate import CalibrationReport
from prefill.bench.results import LLAMA_DENSE, OURS, OURS_COMPILED, BenchResult
from prefill.costmodel.costs import bytes_to_mib


def short(dtype: str) -> str:
    """'float32' -> 'fp32', 'bfloat16' -> 'bf16' (table cells)."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def device_line(device: str = "cpu") -> str:
    """The first line of a bench: the processor, its matrix capability and the dtypes native on it."""
    from prefill.device.capability import capability

    cap = capability("cuda" if device.startswith("cuda") else "cpu")
    return f"{cap.name}: {cap.kind} (torch CPU capability {cap.isa}); native dtypes: {', '.join(cap.native_dtypes())}"


def machine_line(result: BenchResult) -> str:
    """One line: CPU/GPU, threads and versions the figures were measured with."""
    m = result.machine
    gemm = ", ".join(f"{dt} {rate / 1e9:.0f} GFLOP/s" for dt, rate in result.gemm_flops_per_s.items())
    parts = [
        f"{m['device'] if m['device'] != 'cpu' else m['cpu']} ({m['cores']} cores), {m['threads']} threads",
        f"{m.get('capability')}, native {', '.join(m.get('native_dtypes', []))}",
        f"torch {m['torch']}",
        f"transformers {m['transformers']}" if m.get("transformers") else "",
        f"llama-cpp-python {m['llama_cpp']}" if m.get("llama_cpp") else "",
        f"GEMM rate measured: {gemm}",
    ]
    return "; ".join(p for p in parts if p)


def ours_table(result: BenchResult) -> Table:
    """Our engine at every (dtype, P): times, rates, MFU, memory, and the cost model beside the measurement."""
    t = Table(title=f"prefill: {result.spec.name}")
    for col in ("dtype", "P", "mode", "cold ms", "median ms", "p90 ms", "tok/s", "GFLOP/s", "MFU", "peak MiB", "+MiB"):
        t.add_column(col, justify="right")
    t.add_column("pred. ms", justify="right")  # the time model on this machine's profile
    t.add_column("error", justify="right")
    t.add_column("dominant", justify="right")
    if result.calibrations:
        t.add_column("calibrated ms", justify="right")
    t.caption = (
        "cold: first call; median, p90: warm repeats; MFU against the GEMM rate measured in the run; "
        "+MiB: peak memory rise during one call; pred.: the time model (per-operation roofline plus launch "
        "overhead) on this machine's profile, its error against the median and the part that dominates"
    )
    for m in (m for m in result.measurements if m.engine in (OURS, OURS_COMPILED) and m.chunk_size is None):
        row = [
            short(m.dtype),
            str(m.P),
            "compiled" if m.engine == OURS_COMPILED else "eager",
            f"{m.cold_s * 1e3:.1f}",
            f"{m.median_s * 1e3:.1f}",
            f"{m.p90_s * 1e3:.1f}",
            f"{m.tokens_per_s:,.0f}",
            f"{m.flops_per_s / 1e9:.1f}",
            f"{m.mfu:.0%}" if m.mfu is not None else "-",
            f"{bytes_to_mib(m.peak_bytes):,.0f}",
            f"{bytes_to_mib(m.peak_delta_bytes):,.0f}",
            f"{m.predicted_s * 1e3:.1f}",
            f"{m.predicted_s / m.median_s - 1:+.0%}",
            m.predicted_bound or "-",
        ]
        if result.calibrations:
            err = "" if m.calibrated_s is None else f" ({100 * (m.calibrated_s - m.median_s) / m.median_s:+.1f}%)"
            row.append("-" if m.calibrated_s is None else f"{m.calibrated_s * 1e3:.1f}{err}")
        t.add_row(*row)
    return t


# The side-by-side columns: (engine, which of its runs, header). "same": the run in our dtype; "gguf": llama.cpp
# on the GGUF's own (quantized) types.
PEER_COLUMNS = (
    (OURS_COMPILED, "same", "ours compiled"),
    ("transformers", "same", "transformers"),
    (LLAMA_DENSE, "same", "llama.cpp same dtype"),
    ("llamacpp", "gguf", "llama.cpp own types"),
)


def peer_columns(engines: set[str]) -> list[tuple[str, str, str]]:
    """The PEER_COLUMNS whose engine ran."""
    return [c for c in PEER_COLUMNS if c[0] in engines]


def peer_cells(result: BenchResult, engine: str, which: str, dtype: str, P: int) -> tuple[str, str]:
    """(tok/s, ratio) cells: ours eager over the peer's tokens/s, or compiled over eager for ours compiled."""
    ours = result.find(OURS, dtype, P)
    theirs = result.find(engine, dtype if which == "same" else "gguf", P)
    if ours is not None and theirs is None and (crash := result.crash_of(engine, dtype, P)):
        return crash.reason, "-"
    if ours is None or theirs is None:
        return "-", "-"
    ratio = (
        theirs.tokens_per_s / ours.tokens_per_s if engine == OURS_COMPILED else ours.tokens_per_s / theirs.tokens_per_s
    )
    return f"{theirs.tokens_per_s:,.0f}", f"{ratio:.2f}x"


def peers_table(result: BenchResult) -> Table:
    """Tokens/s of every engine at every (dtype, P) and our (eager) speed-up over each peer."""
    cols = peer_columns({m.engine for m in result.measurements} | {c.engine for c in result.crashes})
    t = Table(
        title="side by side: the same tokens and threads, tokens/s of the median run",
        caption="x: our eager tokens/s over the peer's (ours compiled: compiled over eager); llama.cpp same dtype: "
        "an F32 / BF16 GGUF of the same weights; own types: the GGUF as shipped (Q4_1)",
    )
    t.add_column("dtype", justify="right")
    t.add_column("P", justify="right")
    t.add_column("prefill tok/s", justify="right")
    for _, _, header in cols:
        t.add_column(f"{header} tok/s", justify="right")
        t.add_column("x", justify="right")
    for m in (m for m in result.measurements if m.engine == OURS and m.chunk_size is None):
        row = [short(m.dtype), str(m.P), f"{m.tokens_per_s:,.0f}"]
        for engine, which, _ in cols:
            row += peer_cells(result, engine, which, m.dtype, m.P)
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
        "crashes": [dataclasses.asdict(c) for c in result.crashes],
    }


def write_json(result: BenchResult, out_dir: Path) -> Path:
    """Write bench.json into `out_dir`; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench.json"
    path.write_text(json.dumps(to_json(result), indent=2) + "\n")
    return path


def bench_table(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The columns and rows of a bench.json's table (as loaded): ours at each (dtype, P) beside each peer, the
    time model and the calibration (the Performance page's table)."""
    ms = data["measurements"]
    crashes = data.get("crashes", [])
    cols = peer_columns({m["engine"] for m in ms} | {c["engine"] for c in crashes})

    def find(engine: str, dtype: str, P: int) -> dict | None:
        return next(
            (m for m in ms if (m["engine"], m["dtype"], m["P"], m["chunk_size"]) == (engine, dtype, P, None)), None
        )

    def cells(engine: str, which: str, m: dict) -> list[str]:
        theirs = find(engine, m["dtype"] if which == "same" else "gguf", m["P"])
        if theirs is None:
            crash = next((c for c in crashes if c["engine"] == engine and (c["P"] or 0) <= m["P"]), None)
            return [crash["reason"], "-"] if crash else ["-", "-"]
        a, b = m["tokens_per_s"], theirs["tokens_per_s"]
        return [f"{b:,.0f}", f"{(b / a if engine == OURS_COMPILED else a / b):.2f}x"]

    columns = ["dtype", "P", "prefill ms (median / p90)", "prefill tok/s", "MFU"]
    for engine, _, head in cols:
        columns += [f"{head} tok/s", "vs eager" if engine == OURS_COMPILED else f"vs {head}"]
    columns += ["predicted ms (time model, error, dominant)", "calibrated ms (error)"]
    rows = []
    for m in (m for m in ms if m["engine"] == OURS and m["chunk_size"] is None):
        row = [short(m["dtype"]), str(m["P"]), f"{m['median_s'] * 1e3:.1f} / {m['p90_s'] * 1e3:.1f}"]
        row += [f"{m['tokens_per_s']:,.0f}", f"{m['mfu']:.0%}"]
        for engine, which, _ in cols:
            row += cells(engine, which, m)
        cal = m["calibrated_s"]
        err = "" if cal is None else f" ({100 * (cal - m['median_s']) / m['median_s']:+.1f}%)"
        error = m["predicted_s"] / m["median_s"] - 1
        pred = f"{m['predicted_s'] * 1e3:.1f} ({error:+.0%}, {m.get('predicted_bound', '-')})"
        rows.append(row + [pred, "-" if cal is None else f"{cal * 1e3:.1f}{err}"])
    return columns, rows


def machine_sentence(data: dict[str, Any]) -> str:
    """One sentence: the machine, its versions and the GEMM rates a bench.json was measured with."""
    m0 = data["machine"]
    gemm = ", ".join(f"{short(dt)} {r / 1e9:.0f} GFLOP/s" for dt, r in data["gemm_flops_per_s"].items())
    return (
        f"Machine: {m0['cpu']} ({m0.get('capability', '?')}, torch CPU capability {m0.get('isa', '?')}; native "
        f"dtypes: {', '.join(m0.get('native_dtypes', []))}), {m0['cores']} cores, {m0['threads']} threads; torch "
        f"{m0['torch']}, transformers {m0['transformers']}, llama-cpp-python {m0['llama_cpp']}; measured GEMM rate: "
        f"{gemm}; 5-minute load average {m0.get('load_average_5min', float('nan')):.1f}."
    )


def markdown(data: dict[str, Any]) -> str:
    """README tables from a bench.json (as loaded): machine line, ours beside each peer, calibration."""
    columns, rows = bench_table(data)
    lines = [machine_sentence(data), "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    ms = data["measurements"]
    lines += _calibration_lines(data["calibrations"]) + _chunk_lines([m for m in ms if m["chunk_size"] is not None])
    lines += [f"\nNote: {n}" for n in data["notes"]]
    return "\n".join(lines) + "\n"


def _calibration_lines(calibrations: dict[str, dict]) -> list[str]:
    """A paragraph per dtype: the fitted overhead and rates, and their error over all and held-out points."""
    lines = []
    for dt, c in calibrations.items():
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
    return lines


def _chunk_lines(chunks: list[dict]) -> list[str]:
    """The chunked-prefill table (time and peak memory by chunk size), or nothing."""
    if not chunks:
        return []
    lines = ["", "| dtype | P | chunk C | ms (median) | peak memory rise MiB |", "|---|---|---|---|---|"]
    for m in chunks:
        lines.append(
            f"| {short(m['dtype'])} | {m['P']} | {m['chunk_size']} | {m['median_s'] * 1e3:.1f} | "
            f"{bytes_to_mib(m['peak_delta_bytes']):,.0f} |"
        )
    return lines


def bench_command(config: dict[str, Any]) -> str:
    """The `prefill bench` command line that a bench.json's config reproduces."""
    args = ["prefill", "bench", "--prompt-lengths", ",".join(map(str, config["prompt_lengths"]))]
    args += ["--dtypes", ",".join(config["dtypes"]), "--repeats", str(config["repeats"])]
    args += ["--peers", ",".join(config["peers"]) or "none"]
    args += ["--threads", str(config["threads"])] if config.get("threads") else []
    if config.get("calibrate"):
        args += ["--calibrate"] + (
            ["--calibrate-on", ",".join(map(str, config["calibrate_on"]))] if config.get("calibrate_on") else []
        )
    args += ["--compile"] * bool(config.get("compile")) + ["--force"] * bool(config.get("force"))
    return " ".join(args)


def publish(data: dict[str, Any], root: str | Path, **fields: Any) -> Path:
    """A bench.json (as loaded) as the results file root/<kind>/bench.json, with the machine it names (not this
    one). fields override kind, date, commit, command and conditions; a run of today's tree needs none."""
    import datetime

    from prefill.bench import published

    m0 = data["machine"]
    load, cores = m0.get("load_average_5min"), m0.get("cores") or 1
    said = "" if load is None else f"5-minute load average {load:.1f} on {cores} cores"
    machine = published.Machine(
        name=m0["device"] if m0.get("device", "cpu") != "cpu" else m0["cpu"],
        kind=m0.get("capability", "?"),
        flags=tuple(m0.get("flags", ())),
        cores=m0.get("cores"),
        threads=m0.get("threads"),
        torch=m0["torch"],
        shared=load is not None and load > cores / 2,
        conditions=fields.pop("conditions", None) or said,
    )
    columns, rows = bench_table(data)
    kind = fields.pop("kind", None) or published.kind_slug(machine.name, machine.kind, m0.get("cpu_family"))
    result = published.Result(
        benchmark="bench",
        kind=kind,
        title=f"Prefill by P: {Path(data['model'] or 'the embedded model').stem}, ours beside its peers",
        machine=machine,
        command=fields.pop("command", None) or bench_command(data["config"]),
        date=fields.pop("date", None) or datetime.date.today().isoformat(),
        commit=fields.pop("commit", None) or published.git_commit(),
        columns=tuple(columns),
        rows=tuple(map(tuple, rows)),
        notes=" ".join(
            [*_calibration_lines(data["calibrations"]), *(f"{n[0].upper()}{n[1:]}." for n in data["notes"])]
        ).strip(),
        plot={"x": "P", "y": [c for c in columns if c.endswith("tok/s")], "group": "dtype", "ylabel": "tok/s"},
        **fields,
    )
    return published.write(result, root)


def main(argv: list[str] | None = None) -> int:
    """python -m prefill.bench.report BENCH_JSON [--publish [DIR]]: the tables as markdown, or the results file."""
    from prefill.bench.published import publish_main

    return publish_main(argv, "prefill.bench.report", "bench.json", publish, show=markdown)


if __name__ == "__main__":
    raise SystemExit(main())
