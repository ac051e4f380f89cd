"""`prefill plan --fit`: a synthetic load test made by a deployment whose efficiencies are known is refit back to
them from the default ones; `prefill loadtest --predict --engine` puts the same simulation beside a measurement."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from prefill.cli.main import app
from prefill.costmodel.specs import PRESETS
from prefill.errors import BadInput
from prefill.loadtest.client import PromptLengths
from prefill.loadtest.report import write_json
from prefill.plan.engine_fit import fit_engine, means, read_records
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.simulate import poisson_trace

SPEC = PRESETS["llama-3.1-8b"]
TRUE = {"bandwidth": 0.55, "gemm": 0.45}  # what the "measured" deployment reaches


@pytest.fixture(scope="module")
def loadtest_file(tmp_path_factory):
    server = GpuServer.of(SPEC, "h100", "vllm", "bfloat16")
    eff = {**dict(server.engine.efficiencies), **TRUE}
    measured = server.with_engine(dataclasses.replace(server.engine, efficiencies=tuple(eff.items())))
    # one request at a time mostly (1 req/s, ~0.4 s each): a TTFT is its prefill, not where it fell in a step
    result = measured.run(poisson_trace(1.0, 40, PromptLengths(800, 1600), PromptLengths(20, 40), seed=3))
    path = tmp_path_factory.mktemp("fit") / "loadtest.json"
    write_json(path, {"concurrency": None, "rate": 4.0}, {}, result.records)
    return path


def test_the_fit_recovers_known_efficiencies_from_a_synthetic_load_test(loadtest_file):
    records, config = read_records(loadtest_file)
    fit = fit_engine(GpuServer.of(SPEC, "h100", "vllm", "bfloat16"), records, None)
    assert fit.before == {"bandwidth": 0.80, "gemm": 0.70}
    for k, v in TRUE.items():
        assert fit.after[k] == pytest.approx(v, rel=0.03)
    assert all(abs(e) < 0.002 for e in fit.errors_after) and any(abs(e) > 0.2 for e in fit.errors_before), fit
    assert "bandwidth efficiency 0.80 -> 0.55 (-31%)" in fit.describe()


def test_plan_fit_command_says_how_far_the_efficiencies_moved_and_refuses_a_bad_file(loadtest_file, tmp_path):
    runner = CliRunner()
    args = ["plan", "-m", "llama-3.1-8b", "--hardware", "h100", "--engine", "vllm", "--tps", "1"]
    r = runner.invoke(app, [*args, "--fit", str(loadtest_file)])
    assert r.exit_code == 0 and "gemm efficiency 0.70 -> 0.45" in r.output, r.output
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"nothing": 1}))
    out = runner.invoke(app, [*args, "--fit", str(bad)])
    assert out.exit_code == 2 and "prefill loadtest --out" in out.output


def test_means_need_requests_with_two_tokens(loadtest_file):
    records, _ = read_records(loadtest_file)
    for r in records:
        r.usage_completion_tokens = 1
    with pytest.raises(BadInput, match="nothing to fit"):
        means(records)


def test_loadtest_predict_on_a_gpu_puts_the_simulated_deployment_beside_the_measurement(tmp_path):
    from prefill.server.server import BackgroundServer
    from scripted_server import scripted_app  # the scripted OpenAI server of the load test's own tests

    out = tmp_path / "r.json"
    args = ["loadtest", "--requests", "3", "--concurrency", "2", "--prompt-len", "5", "--max-tokens", "4"]
    args += ["--out", str(out), "--predict", "--predict-model", "llama-3.1-8b", "--hardware", "h100"]
    runner = CliRunner()
    with BackgroundServer(scripted_app()) as url:
        r = runner.invoke(app, [*args, "--url", url, "--engine", "vllm"])
        missing = runner.invoke(app, [*args, "--url", url])
    assert r.exit_code == 0, r.output
    assert "measured vs predicted" in r.output and "vllm" in r.output
    predicted = json.loads(out.read_text())["predicted"]
    assert predicted["summary"]["successful"] == 3 and "H100" in predicted["server"]
    assert missing.exit_code == 2 and "--engine" in missing.output


def test_a_newton_step_with_one_efficiency_at_its_bound_solves_for_the_other():
    """Residuals linear in the log-efficiencies, the true first efficiency below the lower bound: the step keeps
    the first at its bound and puts the second at the least-squares point of both residuals with the first fixed
    (the joint Newton step would send the second to its joint solution, which needs the first to move)."""
    import math

    from prefill.plan.engine_fit import BOUNDS, _newton_step, _residuals

    truth = (0.01, 0.5)  # the first efficiency below BOUNDS[0] = 0.05
    J = ((1.0, 0.5), (0.3, 1.0))  # rows: residuals; columns: log-efficiencies

    def errors(values):
        u = [math.log(values[k] / t) for k, t in zip(("a", "b"), truth, strict=True)]
        return tuple(math.expm1(row[0] * u[0] + row[1] * u[1]) for row in J)

    names, lo = ("a", "b"), math.log(BOUNDS[0])
    x = [lo, math.log(0.3)]  # within MAX_STEP of the answer (0.18)
    r = _residuals(errors, names, x)
    step = _newton_step(errors, names, x, r, BOUNDS)
    u0 = lo - math.log(truth[0])  # the pinned one's fixed offset
    u1 = -(J[0][1] * J[0][0] * u0 + J[1][1] * J[1][0] * u0) / (J[0][1] ** 2 + J[1][1] ** 2)  # least squares in u1
    assert step[0] == lo
    assert step[1] == pytest.approx(math.log(truth[1]) + u1, abs=1e-9)
    assert sum(v * v for v in _residuals(errors, names, step)) < sum(v * v for v in r)
