"""The planner checked against published GPU serving results (tests/data/published_gpu.json).

    rows = load_rows()                      # the published figures, each with its source and workload
    checked = [check(row) for row in rows]  # simulated (bench.gpu_serving) and compared, metric by metric
    print(render_table(checked))            # the docs' table (scripts/gpu_validation.py writes it)

A row is simulated as its benchmark ran: at a fixed concurrency (a closed loop, its first `concurrency` requests
a warm-up left out), at a Poisson rate, or offline (every request at 0 s). Throughput metrics must land within
the data's throughput target (20%), latencies within the latency target (30%); a row the data marks
`unreached` is not simulated and says why, and one it marks `miss` is simulated and shown missing, with why.
A row's `engine_args` set the published run's own scheduler flags (max sequences, token budget, memory
fraction) on its engine's profile; nothing else of an engine can be set per row.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from prefill.costmodel.engines import get_engine
from prefill.costmodel.hardware import get_hardware
from prefill.costmodel.specs import PRESETS
from prefill.loadtest.client import PromptLengths
from prefill.loadtest.report import tpot, ttft
from prefill.plan.gpu_serving import GpuServer, closed_trace
from prefill.plan.simulate import SimResult, poisson_trace

DATA = Path(__file__).resolve().parents[3] / "tests" / "data" / "published_gpu.json"
THROUGHPUT = ("output_tok_s", "input_tok_s", "req_s")
LABELS = {
    "ttft_ms": "TTFT ms",
    "itl_ms": "ITL ms",
    "tpot_ms": "TPOT ms",
    "output_tok_s": "output tok/s",
    "input_tok_s": "input tok/s",
    "req_s": "req/s",
}


@dataclass
class Checked:
    """One row with its predictions (metric -> value) and relative errors (predicted / published - 1)."""

    row: dict
    predicted: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    targets: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.errors) and all(abs(e) <= self.targets[m] for m, e in self.errors.items())


def load_rows(path: Path = DATA) -> tuple[list[dict], dict[str, float]]:
    """The published rows and the targets ({"throughput": 0.2, "latency": 0.3})."""
    data = json.loads(Path(path).read_text())
    return data["rows"], data["targets"]


ENGINE_ARGS = ("max_seqs", "token_budget", "memory_fraction")  # the scheduler flags a row may set


def server_of(row: dict) -> GpuServer:
    """The row's deployment: its engine's profile with the published run's own flags (`engine_args`), if any."""
    args = row.get("engine_args", {})
    unknown = set(args) - set(ENGINE_ARGS)
    if unknown:
        raise ValueError(f"{row['id']}: engine_args may set {ENGINE_ARGS}, not {sorted(unknown)}")
    if "memory_fraction" in args:  # the run's own fraction wins over the engine's by TP width
        args = {**args, "fraction_by_tp": ()}
    engine = dataclasses.replace(get_engine(row["engine"]), **args)
    spec, hw = PRESETS[row["model"]], get_hardware(row["hardware"])
    return GpuServer.on(spec, hw, engine, row["weights"], row["kv"], row["tp"])


def simulate_row(row: dict) -> tuple[SimResult, list]:
    """The row's benchmark on its deployment; returns the result and the records its statistics cover."""
    server = server_of(row)
    w = row["workload"]
    prompts, outputs = PromptLengths.parse(w["prompt"]), PromptLengths.parse(w["output"])
    if w["kind"] == "concurrency":
        result = server.run(closed_trace(w["requests"], prompts, outputs), in_flight=w["concurrency"])
        return result, result.records[w["concurrency"] :]
    if w["kind"] == "rate":
        result = server.run(poisson_trace(w["rate"], w["requests"], prompts, outputs))
    else:
        result = server.run(closed_trace(w["requests"], prompts, outputs))
    return result, result.records


def metrics(result: SimResult, records: list, statistic: str) -> dict[str, float]:
    """What the benchmark tools report: TTFT and TPOT (AIPerf's "ITL" is each request's TPOT) by `statistic`
    (mean or median), throughputs over the run's wall time."""
    ok = [r for r in records if r.ok]
    pick = statistics.fmean if statistic == "mean" else statistics.median
    every = [r for r in result.records if r.ok]
    wall = result.wall_s
    tpots = [t for t in (tpot(r) for r in ok) if t is not None]
    return {
        "ttft_ms": pick([ttft(r) for r in ok]) * 1e3,
        "itl_ms": pick(tpots) * 1e3,
        "tpot_ms": pick(tpots) * 1e3,
        "output_tok_s": sum(r.n_out for r in every) / wall,
        "input_tok_s": sum(r.usage_prompt_tokens or 0 for r in every) / wall,
        "req_s": len(every) / wall,
    }


def check(row: dict, targets: dict[str, float]) -> Checked:
    """The row simulated and compared (nothing simulated for an `unreached` row)."""
    out = Checked(row)
    if row.get("unreached"):
        return out
    result, records = simulate_row(row)
    got = metrics(result, records, row["statistic"])
    for m, published in row["published"].items():
        out.predicted[m] = got[m]
        out.errors[m] = got[m] / published - 1
        out.targets[m] = targets["throughput" if m in THROUGHPUT else "latency"]
    return out


def check_all(path: Path = DATA) -> list[Checked]:
    """Every row of the data, checked."""
    rows, targets = load_rows(path)
    return [check(r, targets) for r in rows]


def render_table(checked: list[Checked]) -> str:
    """The validation table in Markdown: one line per row and metric, published beside predicted."""
    lines = [
        "| Row | Deployment | Workload | Metric | Published | Predicted | Error | Within target |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for c in checked:
        r = c.row
        flags = "".join(f", {k} {v}" for k, v in r.get("engine_args", {}).items())
        where = f"{r['model']}, {r['tp']} x {r['hardware']}, {r['engine']}{flags}, {r['weights']}/{r['kv']} KV"
        said = False  # a row's reason is written once, at its first miss
        for m, published in r["published"].items():
            label = f"{LABELS[m]} ({r['statistic']})" if m not in THROUGHPUT else LABELS[m]
            if r.get("unreached"):
                cells = [f"{published:,.2f}", "—", "—", f"not predicted: {r['unreached']}"]
            else:
                e, ok = c.errors[m], abs(c.errors[m]) <= c.targets[m]
                verdict = "yes" if ok else "**no**" + (f" ({r['miss']})" if r.get("miss") and not said else "")
                said = said or not ok
                cells = [f"{published:,.2f}", f"{c.predicted[m]:,.2f}", f"{e:+.0%}", verdict]
            lines.append("| " + " | ".join([r["id"], where, describe(r["workload"]), label, *cells]) + " |")
    predicted = [c for c in checked if c.errors]
    lines += ["", f"{sum(c.passed for c in predicted)} of {len(predicted)} predicted rows within the targets."]
    return "\n".join(lines)


def describe(w: dict) -> str:
    if not w.get("requests"):
        return "—"
    how = {"concurrency": f"concurrency {w.get('concurrency')}", "rate": f"Poisson {w.get('rate')} req/s"}
    return f"{how.get(w['kind'], 'offline')}, {w['requests']} requests, prompts {w['prompt']}, outputs {w['output']}"
