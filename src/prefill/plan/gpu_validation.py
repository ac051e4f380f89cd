"""The planner checked against published GPU serving results (tests/data/published_gpu.json).

    rows = load_rows()                      # the published figures, each with its source and workload
    checked = [check(row) for row in rows]  # simulated (bench.gpu_serving) and compared, metric by metric
    print(render_table(checked))            # the docs' table (scripts/gpu_validation.py writes it)

A row is simulated as its benchmark ran: at a fixed concurrency (a closed loop, its first `concurrency` requests
a warm-up left out), at a Poisson rate, or offline (every request at 0 s). Throughput metrics must land within
the data's throughput target (20%), latencies within the latency target (30%); a row the data marks
`unreached` is not simulated and says why, and one it marks `miss` is simulated and shown missing, with why.
A row's `engine_args` set the published run's own scheduler flags (max sequences, token budget, memory
fraction, CUDA-graph batch sizes) on its engine's profile; nothing else of an engine can be set per row. A row of
`replicas` identical deployments (MLPerf's 8-GPU systems, one model copy a GPU) is simulated as one: its arrival
rate shared, its throughput multiplied. A miss names its diagnosis by key (the data's `misses`): each diagnosis is
written once, under the table, and every row that misses points to it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from prefill.costmodel.engines import get_engine
from prefill.costmodel.hardware import get_hardware
from prefill.costmodel.specs import PRESETS
from prefill.loadtest.client import PromptLengths
from prefill.loadtest.report import tpot, ttft
from prefill.plan.gpu_serving import GpuServer, closed_trace
from prefill.plan.simulate import SimRequest, SimResult, poisson_trace

DATA = Path(__file__).resolve().parents[3] / "tests" / "data" / "published_gpu.json"
# a workload's `dataset`: its requests' (prompt, output) token counts, sampled without replacement as the serving
# benchmarks do, or its prompts' alone (outputs then from the workload's `output`); scripts/sharegpt_lengths.py and
# scripts/mlperf_lengths.py write the files, with their sources
DATASETS = {name: DATA.parent / f"{name}_lengths.json" for name in ("sharegpt", "openorca", "cnndm")}
THROUGHPUT = ("output_tok_s", "input_tok_s", "req_s")
LABELS = {
    "latency_ms": "batch latency ms",
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


def load_misses(path: Path = DATA) -> dict[str, str]:
    """Each diagnosed miss by its key: what the rows that name it have in common, with the step model's numbers."""
    return json.loads(Path(path).read_text())["misses"]


# the flags a row may set: an Engine field each, and chunked_prefill (false: vLLM V0's rule without chunked
# prefill, a prefill batch in a step of its own and decode steps outside the token budget)
ENGINE_ARGS = (
    "max_seqs",
    "token_budget",
    "memory_fraction",
    "graph_tokens",
    "scheduler_steps",
    "prefill_cap",
    "chunked_prefill",
)


def server_of(row: dict) -> GpuServer:
    """The row's deployment: its engine's profile with the published run's own flags (`engine_args`), if any."""
    args = dict(row.get("engine_args", {}))
    unknown = set(args) - set(ENGINE_ARGS)
    if unknown:
        raise ValueError(f"{row['id']}: engine_args may set {ENGINE_ARGS}, not {sorted(unknown)}")
    if "memory_fraction" in args:  # the run's own fraction wins over the engine's by TP width
        args = {**args, "fraction_by_tp": ()}
    if "chunked_prefill" in args:
        chunked = args.pop("chunked_prefill")
        args = {**args, "mixed": chunked, "decode_in_budget": chunked}
    engine = dataclasses.replace(get_engine(row["engine"]), **args)
    spec, hw = PRESETS[row["model"]], get_hardware(row["hardware"])
    return GpuServer.on(spec, hw, engine, row["weights"], row["kv"], row["tp"])


DRAWN_REQUESTS = 1000  # a dataset workload's runs draw at least this many requests in all


def row_metrics(row: dict) -> dict[str, float]:
    """The row's metrics (see metrics). A dataset workload of n requests is drawn ceil(DRAWN_REQUESTS / n) times
    (seeds 0, 1, ...), each draw simulated, and each metric is the median over the draws: the benchmark ran one
    draw of the dataset that cannot be reproduced, and an offline run of a few hundred requests lasts as long as
    its longest, so one simulated draw would stand for its own longest request rather than for the dataset."""
    w = row["workload"]
    draws = math.ceil(DRAWN_REQUESTS / w["requests"]) if "dataset" in w else 1
    runs = [metrics(*simulate_row(row, seed), row["statistic"], row.get("replicas", 1)) for seed in range(draws)]
    return {m: statistics.median(run[m] for run in runs) for m in runs[0]}


def simulate_row(row: dict, seed: int = 0) -> tuple[SimResult, list]:
    """The row's benchmark on one of its replicas (a dataset workload: its draw `seed`); returns the result and
    the records its statistics cover."""
    server = server_of(row)
    w = row["workload"]
    if "dataset" in w:
        result = server.run(dataset_trace(w, w.get("rate", 0.0) / row.get("replicas", 1), seed))
        return result, result.records
    prompts, outputs = PromptLengths.parse(w["prompt"]), PromptLengths.parse(w["output"])
    if w["kind"] == "concurrency":
        result = server.run(closed_trace(w["requests"], prompts, outputs), in_flight=w["concurrency"])
        return result, result.records[w["concurrency"] :]
    if w["kind"] == "rate":
        result = server.run(poisson_trace(w["rate"] / row.get("replicas", 1), w["requests"], prompts, outputs))
    else:
        result = server.run(closed_trace(w["requests"], prompts, outputs))
    return result, result.records


def dataset_pairs(name: str) -> list[tuple[int, int]]:
    """The (prompt tokens, output tokens) of every request of dataset `name` (DATASETS)."""
    return [tuple(pair) for pair in json.loads(DATASETS[name].read_text())["pairs"]]


def dataset_prompts(name: str) -> list[int]:
    """The prompt tokens of every request of dataset `name`, a dataset of prompt lengths alone (`prompt_counts`:
    [tokens, requests] pairs), in increasing order."""
    counts = json.loads(DATASETS[name].read_text())["prompt_counts"]
    return [tokens for tokens, n in counts for _ in range(n)]


def dataset_trace(w: dict, rate: float, seed: int = 0) -> list[SimRequest]:
    """`w["requests"]` requests of `w["dataset"]`, drawn without replacement (the benchmarks shuffle the dataset
    and take requests in turn), all at 0 s offline or as a Poisson process of `rate` requests/s. A dataset of
    prompts alone takes each request's output tokens from the workload's `output` lengths."""
    rng = random.Random(seed)
    if "output" in w:
        outputs = PromptLengths.parse(w["output"])
        pairs = [(p, outputs.sample(rng)) for p in rng.sample(dataset_prompts(w["dataset"]), w["requests"])]
    else:
        pairs = rng.sample(dataset_pairs(w["dataset"]), w["requests"])
    if w["kind"] == "offline":
        return [SimRequest(0.0, p, o) for p, o in pairs]
    if w["kind"] != "rate":
        raise ValueError(f"a dataset workload runs offline or at a rate, not {w['kind']!r}")
    t, trace = 0.0, []
    for p, o in pairs:
        t += rng.expovariate(rate)
        trace.append(SimRequest(t, p, o))
    return trace


def metrics(result: SimResult, records: list, statistic: str, replicas: int = 1) -> dict[str, float]:
    """What the benchmark tools report: TTFT and TPOT (AIPerf's "ITL" is each request's TPOT) by `statistic`
    (mean or median), throughputs over the run's wall time (times `replicas`), and a batch's end-to-end latency
    (vLLM's benchmark_latency: one batch submitted at once, until its last token)."""
    ok = [r for r in records if r.ok]
    pick = statistics.fmean if statistic == "mean" else statistics.median
    every = [r for r in result.records if r.ok]
    wall = result.wall_s
    tpots = [t for t in (tpot(r) for r in ok) if t is not None]
    return {
        "ttft_ms": pick([ttft(r) for r in ok]) * 1e3,
        "itl_ms": pick(tpots) * 1e3,
        "tpot_ms": pick(tpots) * 1e3,
        "latency_ms": wall * 1e3,
        "output_tok_s": replicas * sum(r.n_out for r in every) / wall,
        "input_tok_s": replicas * sum(r.usage_prompt_tokens or 0 for r in every) / wall,
        "req_s": replicas * len(every) / wall,
    }


def check(row: dict, targets: dict[str, float]) -> Checked:
    """The row simulated and compared (nothing simulated for an `unreached` row)."""
    out = Checked(row)
    if row.get("unreached"):
        return out
    got = row_metrics(row)
    for m, published in row["published"].items():
        out.predicted[m] = got[m]
        out.errors[m] = got[m] / published - 1
        out.targets[m] = targets["throughput" if m in THROUGHPUT else "latency"]
    return out


def check_all(path: Path = DATA) -> list[Checked]:
    """Every row of the data, checked."""
    rows, targets = load_rows(path)
    return [check(r, targets) for r in rows]


def render_table(checked: list[Checked], misses: dict[str, str]) -> str:
    """The validation table in Markdown (one line per row and metric, published beside predicted), the share of
    rows within the targets, the error distribution, and each miss's diagnosis once (`misses`, by key)."""
    lines = [
        "| Row | Deployment | Workload | Metric | Published | Predicted | Error | Within target |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for c in checked:
        lines += _row_lines(c)
    predicted = [c for c in checked if c.errors]
    within = sum(c.passed for c in predicted)
    lines += [
        "",
        f"{within} of {len(predicted)} predicted rows within the targets ({within / len(predicted):.0%}).",
        "",
    ]
    lines += error_distribution(predicted) + ["", "Misses, each diagnosed once (the rows above name theirs):", ""]
    lines += _miss_lines(checked, misses)
    return "\n".join(lines)


def _row_lines(c: Checked) -> list[str]:
    r = c.row
    flags = "".join(f", {k} {v}" for k, v in r.get("engine_args", {}).items())
    copies = f" ({r['replicas']} copies)" if r.get("replicas", 1) > 1 else ""
    where = f"{r['model']}, {r['tp']} x {r['hardware']}{copies}, {r['engine']}{flags}, {r['weights']}/{r['kv']} KV"
    named = ", ".join(f"`{key}`" for key in miss_keys(r))
    lines = []
    for m, published in r["published"].items():
        label = f"{LABELS[m]} ({r['statistic']})" if m not in THROUGHPUT else LABELS[m]
        if r.get("unreached"):
            cells = [f"{published:,.2f}", "—", "—", f"not predicted: {r['unreached']}"]
        else:
            e, ok = c.errors[m], abs(c.errors[m]) <= c.targets[m]
            verdict = "yes" if ok else "**no**" + (f", miss {named}" if named else "")
            cells = [f"{published:,.2f}", f"{c.predicted[m]:,.2f}", f"{e:+.0%}", verdict]
        lines.append("| " + " | ".join([r["id"], where, describe(r["workload"]), label, *cells]) + " |")
    return lines


def miss_keys(row: dict) -> list[str]:
    """The keys of the diagnoses a row names (`miss`: one key or a list)."""
    miss = row.get("miss") or []
    return [miss] if isinstance(miss, str) else list(miss)


def error_distribution(predicted: list[Checked]) -> list[str]:
    """The median and the worst relative error over every predicted metric, throughput and latency apart."""
    lines = ["| Metrics | Count | Median error (absolute) | Worst error |", "| --- | ---: | ---: | --- |"]
    for kind in ("throughput", "latency"):
        cells = [
            (e, c.row["id"], m, c.targets[m])
            for c in predicted
            for m, e in c.errors.items()
            if (m in THROUGHPUT) == (kind == "throughput")
        ]
        if not cells:
            continue
        worst = max(cells, key=lambda cell: abs(cell[0]))
        median = statistics.median(abs(cell[0]) for cell in cells)
        where = f"{worst[0]:+.0%} ({worst[1]}, {LABELS[worst[2]]})"
        lines.append(f"| {kind} (target {cells[0][3]:.0%}) | {len(cells)} | {median:.0%} | {where} |")
    return lines


def _miss_lines(checked: list[Checked], misses: dict[str, str]) -> list[str]:
    lines = []
    for key, text in misses.items():
        rows = [c.row["id"] for c in checked if key in miss_keys(c.row)]
        lines.append(f"- **`{key}`** ({', '.join(rows)}): {text}")
    return lines


def describe(w: dict) -> str:
    if not w.get("requests"):
        return "—"
    how = {"concurrency": f"concurrency {w.get('concurrency')}", "rate": f"Poisson {w.get('rate')} req/s"}
    if "dataset" in w:
        lengths = f"{w['dataset']}'s prompts, outputs {w['output']}" if "output" in w else f"{w['dataset']}'s lengths"
    else:
        lengths = f"prompts {w['prompt']}, outputs {w['output']}"
    return f"{how.get(w['kind'], 'offline')}, {w['requests']} requests, {lengths}"
