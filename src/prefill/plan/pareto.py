"""The Pareto frontier of a deployment's configurations: output tokens/s per GPU (what a GPU-hour buys) against
tokens/s per user (how fast each stream reads, 1 / mean TPOT), as NVIDIA's aiconfigurator draws it.

    points = sweep(spec, workload, Space(gpu="h100", engines=("vllm",), tps=(1, 2)), slo)
    best = cheapest(points)             # the most tokens/s per GPU among the points meeting the SLO
    write_json("pareto.json", points, slo); plot("pareto.png", points, slo)

Each configuration (engine, TP, max running requests; aggregated or xPyD) is simulated at a few offered rates,
fractions of its own saturated throughput: a light load gives fast streams and idle GPUs, a heavy one the reverse.
Every point is one simulated run (prefill.plan.gpu_serving, prefill.plan.disagg); nothing is interpolated.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from prefill.costmodel.engines import get_engine
from prefill.costmodel.hardware import get_hardware
from prefill.costmodel.links import Link, get_link
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput
from prefill.loadtest.report import summarize
from prefill.plan.capacity import Workload
from prefill.plan.disagg import Disagg, run_metered, simulate_disagg
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.planner import Slo
from prefill.plan.simulate import SimRequest

LOADS = (0.1, 0.3, 0.6, 0.9)  # offered rate, as a fraction of the configuration's saturated throughput


@dataclass(frozen=True)
class Space:
    """The configurations swept: one GPU, engines, TP widths, max running requests (None: the engine's default),
    xPyD splits (each pool at the same TP width; () for aggregated only), the K/V link and precisions."""

    gpu: str
    engines: tuple[str, ...] = ("vllm",)
    tps: tuple[int, ...] = (1, 2, 4, 8)
    max_running: tuple[int | None, ...] = (None,)
    splits: tuple[tuple[int, int], ...] = ()
    link: Link = dataclasses.field(default_factory=lambda: get_link("nvlink"))
    weights: str = "bfloat16"
    kv: str | None = None
    loads: tuple[float, ...] = LOADS


@dataclass(frozen=True)
class Point:
    """One simulated run: the configuration, the offered rate (requests/s), GPUs, output tokens/s per GPU and per
    user, p99 TTFT and TPOT (s), and whether they meet the SLO."""

    config: str
    kind: str  # "aggregated" or "disaggregated"
    engine: str
    tp: int
    max_running: int
    rate: float
    gpus: int
    tok_s_per_gpu: float
    tok_s_per_user: float
    ttft_p99_s: float
    tpot_p99_s: float
    meets_slo: bool


def sweep(spec: ModelSpec, workload: Workload, space: Space, slo: Slo) -> list[Point]:
    """Every configuration of `space` at every load fraction (see the module docstring)."""
    points: list[Point] = []
    for name in space.engines:
        for cap in space.max_running:
            engine = get_engine(name) if cap is None else dataclasses.replace(get_engine(name), max_seqs=cap)
            for T in space.tps:
                try:
                    server = GpuServer.on(spec, get_hardware(space.gpu), engine, space.weights, space.kv, T)
                except BadInput:  # the heads do not split T ways, or the weights leave no KV cache
                    continue
                if server.tokens < workload.prompts.hi + workload.outputs.hi:
                    continue
                points += _aggregated(server, workload, space.loads, slo)
                for x, y in space.splits:
                    points += _disaggregated(Disagg(server, server, x, y, space.link), workload, space.loads, slo)
    if not points:
        raise BadInput(f"no configuration of {spec.name} on {space.gpu} holds the workload's longest request")
    return points


def _point(config: str, kind: str, server: GpuServer, rate: float, gpus: int, records, wall_s, slo: Slo) -> Point:
    s = summarize(records, wall_s)
    lat = s["latency"]
    ttft, tpot = (lat["ttft_s"] or {}).get("p99", math.inf), (lat["tpot_s"] or {}).get("p99", 0.0)
    mean_tpot = (lat["tpot_s"] or {}).get("mean") or math.inf
    e = server.engine
    return Point(
        config, kind, e.name, server.tp, e.max_seqs, rate, gpus, s["throughput_output_tok_per_s"] / gpus,
        1.0 / mean_tpot, ttft, tpot, slo.met(ttft, tpot),
    )  # fmt: skip


def _aggregated(server: GpuServer, workload: Workload, loads, slo: Slo) -> list[Point]:
    burst, _ = run_metered(server, workload.burst())
    capacity = len(burst.records) / burst.wall_s
    config = f"{server.engine.name} TP {server.tp}, {server.engine.max_seqs} running"
    out = []
    for f in loads:
        result, _ = run_metered(server, workload.trace(f * capacity))
        out.append(_point(config, "aggregated", server, f * capacity, server.tp, result.records, result.wall_s, slo))
    return out


def _disaggregated(d: Disagg, workload: Workload, loads, slo: Slo) -> list[Point]:
    first = [SimRequest(0.0, r.prompt_tokens, 1) for r in workload.burst()]
    rest = [SimRequest(0.0, r.prompt_tokens + 1, r.output_tokens - 1) for r in workload.burst() if r.output_tokens > 1]
    pre, _ = run_metered(d.prefill, first)
    dec, _ = run_metered(d.decode, rest, arrived=True)
    capacity = min(d.x * len(first) / pre.wall_s, d.y * len(first) / dec.wall_s if rest else math.inf)
    config = f"{d.prefill.engine.name} {d.x}P{d.y}D TP {d.prefill.tp}, {d.prefill.engine.max_seqs} running"
    out = []
    for f in loads:
        result = simulate_disagg(d, workload.trace(f * capacity))
        out.append(_point(config, "disaggregated", d.prefill, f * capacity, d.gpus, result.records, result.wall_s, slo))
    return out


def frontier(points: list[Point]) -> list[Point]:
    """The points no other point beats on both axes (tokens/s per GPU and per user), by tokens/s per user."""
    ranked = sorted(points, key=lambda p: (-p.tok_s_per_user, -p.tok_s_per_gpu))
    out, best_gpu = [], -math.inf
    for p in ranked:
        if p.tok_s_per_gpu > best_gpu:
            out.append(p)
            best_gpu = p.tok_s_per_gpu
    return out[::-1]


def cheapest(points: list[Point]) -> Point | None:
    """The point meeting the SLO with the most output tokens/s per GPU (the lowest cost per token), or None."""
    ok = [p for p in points if p.meets_slo]
    return max(ok, key=lambda p: p.tok_s_per_gpu) if ok else None


def usd_per_million(point: Point, usd_per_gpu_hour: float) -> float:
    """Dollars per million output tokens at `point` (tokens/s per GPU) and a GPU-hour's price."""
    return usd_per_gpu_hour / (point.tok_s_per_gpu * 3600) * 1e6


def write_json(path: str | Path, points: list[Point], slo: Slo) -> Path:
    """Every point, the frontier's and the cheapest's indices, and the SLO, as JSON."""
    front, best = frontier(points), cheapest(points)
    payload = {
        "slo": {"ttft_p99_s": slo.ttft_p99_s, "tpot_p99_s": slo.tpot_p99_s},
        "axes": {"x": "output tokens/s per user (1 / mean TPOT)", "y": "output tokens/s per GPU"},
        "points": [dataclasses.asdict(p) for p in points],
        "frontier": [points.index(p) for p in front],
        "cheapest": None if best is None else points.index(best),
    }
    path = Path(path)
    path.write_text(json.dumps(payload, indent=2, default=lambda x: None) + "\n")
    return path


def plot(path: str | Path, points: list[Point], slo: Slo, title: str = "") -> Path:
    """The points (one marker per kind, hollow where the p99s miss the SLO), the frontier, the SLO's line (tokens/s
    per user = 1 / TPOT SLO: a point left of it misses; one right of it may still miss at p99) and the cheapest
    point meeting the SLO, as a PNG (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for kind, marker, color in (("aggregated", "o", "tab:blue"), ("disaggregated", "s", "tab:orange")):
        for meets, face in ((True, color), (False, "none")):  # hollow: misses the SLO's p99 TTFT or TPOT
            mine = [p for p in points if p.kind == kind and p.meets_slo == meets]
            if mine:
                label = f"{kind}{'' if meets else ' (misses the SLO)'}"
                ax.scatter([p.tok_s_per_user for p in mine], [p.tok_s_per_gpu for p in mine], marker=marker,
                           facecolors=face, edgecolors=color, alpha=0.6, label=label)  # fmt: skip
    front = frontier(points)
    ax.plot([p.tok_s_per_user for p in front], [p.tok_s_per_gpu for p in front], "k-", lw=1.2, label="Pareto frontier")
    if slo.tpot_p99_s is not None:
        ax.axvline(1.0 / slo.tpot_p99_s, color="tab:red", ls="--", label=f"SLO: TPOT {slo.tpot_p99_s * 1e3:g} ms")
    best = cheapest(points)
    if best is not None:
        ax.scatter([best.tok_s_per_user], [best.tok_s_per_gpu], s=220, marker="*", color="gold", edgecolor="k",
                   zorder=5, label=f"cheapest meeting the SLO: {best.config}")  # fmt: skip
    ax.set_xlabel("output tokens/s per user (1 / mean TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
