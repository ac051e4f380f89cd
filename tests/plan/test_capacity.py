"""The deployment planner: replicas per TP width from the simulator, each answer checked by simulating again."""

from __future__ import annotations

import pytest

from prefill.costmodel.specs import PRESETS
from prefill.errors import BadInput
from prefill.loadtest.client import PromptLengths
from prefill.loadtest.report import summarize
from prefill.plan import capacity
from prefill.plan.capacity import Workload, plan
from prefill.plan.gpu_serving import GpuServer

SPEC = PRESETS["llama-3-8b"]
WORK = Workload(30, PromptLengths(256, 2048), PromptLengths(4, 12))


def p99_ttft(T: int, rate: float) -> float:
    """The planner's own question, asked directly: one vLLM replica of width T at `rate`."""
    result = GpuServer.of(SPEC, "h100", "vllm", "bfloat16", None, T).run(WORK.trace(rate))
    return summarize(result.records, result.wall_s)["latency"]["ttft_s"]["p99"]


def test_each_width_gets_the_fewest_replicas_that_meet_the_slo():
    rate, slo = 120.0, 0.25
    rows = plan(SPEC, "h100", "vllm", "bfloat16", None, rate, slo, WORK, tps=(1, 2))
    assert [r.tp for r in rows] == [1, 2]
    for r in rows:
        assert r.replicas is not None and r.gpus == r.replicas * r.tp, r
        assert r.ttft_p99_s <= slo and p99_ttft(r.tp, rate / r.replicas) == pytest.approx(r.ttft_p99_s)
        if r.replicas > 1:  # one fewer misses: its tail, or a load past what one replica can sustain
            fewer = rate / (r.replicas - 1)
            assert fewer > r.capacity_req_per_s or p99_ttft(r.tp, fewer) > slo
    assert rows[0].replicas > 1  # the rate is beyond one H100 at TP 1
    assert rows[0].pool_tokens == GpuServer.of(SPEC, "h100", "vllm").tokens  # the engine's KV cache
    assert capacity.cheapest(rows).gpus == min(r.gpus for r in rows)


def test_a_width_that_cannot_split_the_heads_or_hold_the_weights_says_why():
    rows = plan(SPEC, "h100", "vllm", "bfloat16", None, 1.0, 1.0, WORK, tps=(3,))
    assert rows[0].replicas is None and "does not divide the 32 query heads" in rows[0].note
    big = PRESETS["llama-3-70b"]  # 141 GB of bfloat16 weights: no room on one 80 GB GPU
    rows = plan(big, "h100", "vllm", "bfloat16", None, 1.0, 1.0, WORK, tps=(1,))
    assert rows[0].replicas is None and "does not fit" in rows[0].note


def test_an_slo_below_the_unloaded_ttft_is_said_to_be_unreachable():
    rows = plan(SPEC, "h100", "vllm", "bfloat16", None, 1.0, 1e-4, WORK, tps=(1,))
    assert rows[0].replicas is None and "at no load" in rows[0].note and capacity.cheapest(rows) is None


@pytest.mark.parametrize("rate, slo", [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0)])
def test_a_bad_rate_or_slo_is_refused(rate, slo):
    with pytest.raises(BadInput):
        plan(SPEC, "h100", "vllm", "bfloat16", None, rate, slo, WORK)


def test_plan_command_prints_the_widths_and_refuses_what_it_cannot_plan():
    import json

    from typer.testing import CliRunner

    from prefill.cli.main import app

    runner = CliRunner()
    args = ["simulate", "--plan", "-m", "llama-3-8b", "--hardware", "h100", "--requests", "20", "--rate", "30"]
    args += ["--prompt-len", "256:1024", "--output-len", "4:8"]
    r = runner.invoke(app, [*args, "--slo-ttft-ms", "300", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["tp"] for row in rows] == list(capacity.TPS)
    assert all(row["gpus"] == row["replicas"] * row["tp"] for row in rows if row["replicas"])
    r = runner.invoke(app, [*args, "--slo-ttft-ms", "300"])
    assert r.exit_code == 0 and "fewest GPUs: TP" in r.output and "vllm" in r.output
    no_slo = runner.invoke(app, args)
    assert no_slo.exit_code == 2 and "--slo-ttft-ms" in no_slo.output
    cpu = runner.invoke(app, ["simulate", "--plan", "--slo-ttft-ms", "300"])
    assert cpu.exit_code == 2 and "catalog GPU" in cpu.output
