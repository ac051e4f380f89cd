"""`prefill plan`: the cheaper of two deployments that both meet the SLO comes first, the replica count is the
fewest that meets it (one fewer misses), the cost is the price over the simulated throughput, a width that
cannot split the heads says so, and bad input is one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from prefill.cli.main import app
from prefill.costmodel.specs import PRESETS
from prefill.errors import BadInput
from prefill.loadtest.client import PromptLengths
from prefill.plan.capacity import Workload, fewest_replicas
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.planner import Load, Slo, cost_floor, plan_deployments, replica_run

SPEC = PRESETS["llama-3.1-8b"]
WORK = Workload(60, PromptLengths(200, 400), PromptLengths(50, 100))
EASY = Slo(ttft_p99_s=2.0, tpot_p99_s=0.1)


def plan(prices, slo=EASY, load=Load(rate=4.0), tps=(1,)):
    return plan_deployments(SPEC, WORK, load, slo, prices, engines=("vllm",), tps=tps)


def test_the_cheaper_of_two_that_both_meet_the_slo_comes_first_and_the_dearer_is_not_searched():
    """The same deployment on two GPUs: the cheaper's price over what its replicas serve comes first; the other,
    whose cost floor is already above it, is not simulated, and planned alone it indeed costs more."""
    first = plan({"h100": 2.0, "h200": 3.0})
    assert [o.gpu for o in first] == ["h100", "h200"] and first[0].replicas == 1
    flipped = plan({"h100": 3.0, "h200": 2.0})  # the same two deployments, the prices swapped
    assert [o.gpu for o in flipped] == ["h200", "h100"]
    best, skipped = first
    assert best.usd_per_hour == pytest.approx(2.0)  # dollars per million output tokens: price over what it serves
    assert best.usd_per_m_output == pytest.approx(best.usd_per_hour / (best.run.output_tok_s * 3600) * 1e6)
    assert best.command.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 1")
    floor = cost_floor(3.0, 1, WORK, Load(rate=4.0))
    assert skipped.replicas is None and "not simulated" in skipped.note and floor > best.usd_per_m_output
    (alone_h200,) = plan({"h200": 3.0})
    assert alone_h200.usd_per_m_output >= floor  # the floor is a floor
    assert best.usd_per_m_output >= cost_floor(2.0, 1, WORK, Load(rate=4.0))


def test_the_replicas_are_the_fewest_that_meet_the_slo():
    load, slo = Load(rate=150.0), Slo(ttft_p99_s=0.5, tpot_p99_s=0.015)
    (best,) = plan({"h100": 2.0}, slo, load)
    assert best.replicas is not None and best.replicas > 1
    server = GpuServer.of(SPEC, "h100", "vllm", "bfloat16")
    fewer = replica_run(server, WORK, load, best.replicas - 1)
    over = load.rate / (best.replicas - 1) > best.capacity_req_s  # one fewer: more than it can serve, or slow
    assert over or not slo.met(fewer.ttft_p99_s, fewer.tpot_p99_s)
    assert slo.met(best.run.ttft_p99_s, best.run.tpot_p99_s)


def test_fewest_replicas_doubles_then_bisects():
    asked = []

    def meets(R):
        asked.append(R)
        return R >= 11

    assert fewest_replicas(meets, 1, 256) == 11 and asked[:5] == [1, 2, 4, 8, 16]
    assert fewest_replicas(lambda R: False, 1, 8) is None


def test_a_width_that_cannot_split_the_heads_says_so_and_comes_last():
    options = plan({"h100": 2.0}, tps=(3, 1))
    assert options[0].tp == 1 and options[0].replicas == 1
    assert options[1].replicas is None and "3" in options[1].note


@pytest.mark.parametrize(
    "make",
    [
        lambda: Load(),
        lambda: Load(rate=1.0, concurrency=2),
        lambda: Load(rate=-1.0),
        lambda: Load(rate=0.0),
        lambda: Slo(),
    ],
)
def test_bad_load_or_slo_is_refused(make):
    with pytest.raises(BadInput):
        make()


def test_plan_command_ranks_and_prints_the_launch_command_and_refuses_bad_input():
    runner = CliRunner()
    args = ["plan", "-m", "llama-3.1-8b", "--prompt-len", "200:400", "--output-len", "50:100", "--requests", "60"]
    args += ["--usd-per-gpu-hour", "h100=2", "--engines", "sglang", "--tps", "1"]
    r = runner.invoke(app, [*args, "--rate", "4", "--slo-tpot-ms", "100"])
    assert r.exit_code == 0, r.output
    assert "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --tp-size 1" in r.output
    assert "(1 GPU," in r.output
    js = runner.invoke(app, [*args, "--concurrency", "8", "--slo-ttft-ms", "2000", "--json"])
    assert js.exit_code == 0 and json.loads(js.stdout)[0]["replicas"] == 1
    no_price = ["--rate", "4", "--slo-tpot-ms", "50", "--usd-per-gpu-hour", "h100"]
    for bad, words in (([], "give one of --rate"), (["--rate", "4"], "give an SLO"), (no_price, "gpu=dollars")):
        out = runner.invoke(app, [*args, *bad])  # a repeated option: the last one counts
        assert out.exit_code == 2 and words in out.output and "Traceback" not in out.output
    helped = runner.invoke(app, ["plan", "--help"])
    assert "p99 time to first token" in helped.output and "$ per GPU-hour" in helped.output


def test_an_impossible_slo_is_ruled_out_by_each_request_alone_without_searching(monkeypatch):
    """TTFT 5 ms and TPOT 1 ms: no candidate's requests meet it even alone, so no replica count is searched (a
    search would raise here) and the best reachable p99s are said."""
    from prefill.plan import planner

    monkeypatch.setattr(planner, "option_search", lambda *a: pytest.fail("searched an impossible candidate"))
    options = plan({"h100": 2.0, "h200": 3.0}, Slo(ttft_p99_s=0.005, tpot_p99_s=0.001), tps=(1, 2))
    assert all(o.replicas is None and "misses the SLO at any load" in o.note for o in options)
    said = planner.reachable(options)
    best_tpot = min(o.alone[1] for o in options)
    assert f"p99 TPOT {best_tpot * 1e3:,.2f} ms" in said and best_tpot > 0.001


def test_the_lower_bound_is_each_request_alone_and_below_every_loaded_p99():
    from prefill.costmodel.ops import Row
    from prefill.plan.planner import alone, p99

    server = GpuServer.of(SPEC, "h100", "vllm", "bfloat16")
    ttft_alone, tpot_alone = alone(server, WORK)
    prompts = sorted(r.prompt_tokens for r in WORK.trace(1.0))
    (solo,) = server.run(WORK.trace(1.0)[:0] + [planner_request(p99(prompts))]).records
    assert ttft_alone == pytest.approx(solo.first_content - solo.start, rel=1e-12)
    assert tpot_alone == server.step_seconds([Row(1, p99(prompts))])  # every output here decodes (50:100)
    for R in (1, 2):
        run = replica_run(server, WORK, Load(rate=40.0), R)
        assert run.ttft_p99_s >= ttft_alone and run.tpot_p99_s >= tpot_alone


def planner_request(prompt: int):
    from prefill.plan.simulate import SimRequest

    return SimRequest(0.0, prompt, 1)


def test_progress_counts_every_candidate():
    seen = []
    plan_deployments(
        SPEC, WORK, Load(rate=4.0), EASY, {"h100": 2.0}, ("vllm",), tps=(1, 3), progress=lambda *a: seen.append(a)
    )
    assert seen == [(1, 2), (2, 2)]


def test_unknown_gpus_engines_models_and_a_zero_rate_are_one_line_errors():
    runner = CliRunner()
    args = ["plan", "-m", "llama-3.1-8b", "--rate", "4", "--slo-tpot-ms", "50"]
    cases = [
        (["--usd-per-gpu-hour", "b300=5.5"], "'b300' is not in the GPU catalog; known: a100-40gb"),
        (["--engines", "tgi"], "unknown engine 'tgi'; choose one of: vllm, sglang, trtllm, prefill"),
        (["-m", "llama-9"], "neither a preset"),
        (["--rate", "0"], "--rate is requests arriving per second and must be > 0, got 0"),
    ]
    for extra, words in cases:
        out = runner.invoke(app, [*args, *extra])
        assert out.exit_code == 2 and words in out.output and len(out.output.strip().splitlines()) == 1, out.output


def test_an_slo_no_candidate_meets_exits_1_with_the_best_reachable():
    runner = CliRunner()
    args = ["plan", "-m", "llama-3.1-8b", "--rate", "4", "--slo-ttft-ms", "5", "--slo-tpot-ms", "1", "--tps", "1"]
    out = runner.invoke(app, [*args, "--usd-per-gpu-hour", "h100=2"])
    assert out.exit_code == 1 and "the best reachable, each request alone: p99 TTFT" in out.output


def test_a_narrow_table_wraps_and_never_cuts_a_name():
    runner = CliRunner()
    args = ["plan", "-m", "llama-3.1-8b", "--prompt-len", "200:400", "--output-len", "50:100", "--requests", "60"]
    args += ["--usd-per-gpu-hour", "h100=2", "--engines", "sglang,vllm", "--tps", "1", "--rate", "4"]
    out = runner.invoke(app, [*args, "--slo-tpot-ms", "100"], env={"COLUMNS": "60"})
    rows = [line for line in out.output.splitlines() if line[:1].isdigit()]
    assert any(" h100 " in r and " sglang " in r for r in rows), out.output
    assert any(" h100 " in r and " vllm " in r for r in rows) and "…" not in out.output


def test_a_search_waits_and_stops_part_way_once_its_floor_at_the_replicas_it_needs_is_above_the_cheapest(
    monkeypatch,
):
    """h100 at $1 has the lower floor but misses at 1 replica; h200 at $1.9 meets at 1. At 2 replicas the h100's
    floor ($2 a unit) is above the h200's cost ($1.9 a unit), so its 2-replica run is never simulated, and what
    it says is that floor; the answer is the one a full search of each gives."""
    from prefill.plan import planner
    from prefill.plan.planner import Run, plan_option

    load, prices = Load(rate=4.0), {"h100": 1.0, "h200": 1.9}
    trace = WORK.trace(1.0)
    unit = sum(r.output_tokens for r in trace) / trace[-1].arrival_s  # tokens/s at rate 1: the floor's rate
    asked = []

    def replica_run(server, workload, load, R):  # each replica's output as the floor assumes: the floor is the cost
        asked.append((server.hw.name.split()[1].lower(), R))
        ok = server.hw.name.startswith("NVIDIA H200") or R >= 2
        return Run(0.1, 0.01 if ok else 1.0, unit * load.rate / R, "memory bandwidth")

    monkeypatch.setattr(planner, "replica_run", replica_run)
    best, stopped = plan(prices, load=load)
    assert (best.gpu, best.replicas) == ("h200", 1) and ("h100", 1) in asked and ("h100", 2) not in asked
    floor = cost_floor(1.0, 1, WORK, load)
    assert best.usd_per_m_output == pytest.approx(1.9 * floor)
    assert stopped.gpu == "h100" and stopped.replicas is None
    assert f"costs at least ${2 * floor:,.3f}/M out at 2 replicas (fewer miss the SLO)" in stopped.note
    full = plan_option(GpuServer.of(SPEC, "h100", "vllm"), WORK, load, EASY, 1.0)  # searched to the end
    assert full.replicas == 2 and full.usd_per_m_output > best.usd_per_m_output
