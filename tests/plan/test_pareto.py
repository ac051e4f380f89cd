"""The Pareto frontier: it keeps exactly the points nothing beats on both axes, the cheapest point is the one meeting
the SLO with the most tokens/s per GPU, and `plan --pareto` writes the PNG and the JSON of a real sweep."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from prefill.cli.main import app
from prefill.plan.pareto import Point, cheapest, frontier, usd_per_million


def _p(per_user: float, per_gpu: float, meets: bool = True) -> Point:
    return Point(f"c{per_user}-{per_gpu}", "aggregated", "vllm", 1, 1024, 1.0, 1, per_gpu, per_user, 0.1, 0.01, meets)


def test_the_frontier_keeps_the_points_nothing_beats_on_both_axes():
    points = [_p(10, 900), _p(20, 800), _p(15, 700), _p(30, 300), _p(30, 200), _p(5, 850)]
    front = frontier(points)
    assert [(p.tok_s_per_user, p.tok_s_per_gpu) for p in front] == [(10, 900), (20, 800), (30, 300)]


def test_the_cheapest_is_the_most_tokens_per_gpu_that_meets_the_slo():
    points = [_p(10, 900, meets=False), _p(20, 800), _p(30, 300)]
    assert cheapest(points).tok_s_per_gpu == 800
    assert cheapest([_p(10, 900, meets=False)]) is None
    # 1,000 output tokens/s per GPU at $3.60 a GPU-hour: 3.6 M tokens an hour for $3.60, $1 per million
    assert usd_per_million(_p(10, 1000), 3.6) == pytest.approx(1.0, rel=1e-12)


def test_plan_pareto_writes_the_plot_and_the_json_of_a_real_sweep(tmp_path):
    png = tmp_path / "front.png"
    args = ["plan", "-m", "llama-3.1-8b", "--prompt-len", "200:400", "--output-len", "20:40", "--requests", "20"]
    args += ["--rate", "4", "--slo-ttft-ms", "500", "--slo-tpot-ms", "9", "--usd-per-gpu-hour", "h100=2.99"]
    r = CliRunner().invoke(
        app, [*args, "--engines", "vllm", "--tps", "1", "--pareto", str(png), "--splits", "1P1D", "--max-running", "8"]
    )
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(png.with_suffix(".json").read_text())
    points = data["points"]
    assert len(points) == 16 and {p["kind"] for p in points} == {"aggregated", "disaggregated"}  # 4 configs x 4 loads
    assert {p["max_running"] for p in points} == {1024, 8}  # vLLM's default and the cap asked for
    assert data["slo"] == {"ttft_p99_s": 0.5, "tpot_p99_s": 0.009}
    front = [points[i] for i in data["frontier"]]
    for p in points:  # every point is on the frontier or beaten on both axes by one that is
        assert p in front or any(
            q["tok_s_per_user"] >= p["tok_s_per_user"] and q["tok_s_per_gpu"] >= p["tok_s_per_gpu"] for q in front
        )
    if data["cheapest"] is not None:
        best = points[data["cheapest"]]
        assert best["meets_slo"] and best["tpot_p99_s"] <= 0.009 and best["ttft_p99_s"] <= 0.5
        assert all(p["tok_s_per_gpu"] <= best["tok_s_per_gpu"] for p in points if p["meets_slo"])
        assert "cheapest meeting the SLO" in r.output
