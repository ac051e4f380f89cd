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
from prefill.plan.capacity import Workload
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.planner import Load, Slo, fewest_replicas, plan_deployments, replica_run

SPEC = PRESETS["llama-3.1-8b"]
WORK = Workload(60, PromptLengths(200, 400), PromptLengths(50, 100))
EASY = Slo(ttft_p99_s=2.0, tpot_p99_s=0.1)


def plan(prices, slo=EASY, load=Load(rate=4.0), tps=(1,)):
    return plan_deployments(SPEC, WORK, load, slo, prices, engines=("vllm",), tps=tps)


def test_the_cheaper_of_two_that_both_meet_the_slo_comes_first():
    first = plan({"h100": 2.0, "h200": 3.0})
    assert [o.gpu for o in first] == ["h100", "h200"] and all(o.replicas == 1 for o in first)
    flipped = plan({"h100": 3.0, "h200": 2.0})  # the same two deployments, the prices swapped
    assert [o.gpu for o in flipped] == ["h200", "h100"]
    for o in first:  # dollars per million output tokens: the price over what the replicas serve
        assert o.usd_per_hour == pytest.approx({"h100": 2.0, "h200": 3.0}[o.gpu])
        assert o.usd_per_m_output == pytest.approx(o.usd_per_hour / (o.run.output_tok_s * 3600) * 1e6)
        assert o.command.startswith(f"vllm serve {SPEC.name} --tensor-parallel-size 1")


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
    "make", [lambda: Load(), lambda: Load(rate=1.0, concurrency=2), lambda: Load(rate=-1.0), lambda: Slo()]
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
    assert "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --tp 1" in r.output
    js = runner.invoke(app, [*args, "--concurrency", "8", "--slo-ttft-ms", "2000", "--json"])
    assert js.exit_code == 0 and json.loads(js.stdout)[0]["replicas"] == 1
    no_price = ["--rate", "4", "--slo-tpot-ms", "50", "--usd-per-gpu-hour", "h100"]
    for bad, words in (([], "give one of --rate"), (["--rate", "4"], "give an SLO"), (no_price, "gpu=dollars")):
        out = runner.invoke(app, [*args, *bad])  # a repeated option: the last one counts
        assert out.exit_code == 2 and words in out.output and "Traceback" not in out.output
    helped = runner.invoke(app, ["plan", "--help"])
    assert "p99 time to first token" in helped.output and "$ per GPU-hour" in helped.output
