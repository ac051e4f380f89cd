"""The simulator: the step loop's own schedule on a simulated clock, timed by the time model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from prefill.costmodel import timemodel
from prefill.costmodel.hardware import get_hardware
from prefill.costmodel.profile import catalog_profile
from prefill.costmodel.specs import load_spec
from prefill.errors import BadInput
from prefill.loadtest.client import PromptLengths
from prefill.loadtest.report import summarize
from prefill.plan.simulate import SimRequest, poisson_trace, simulate


def fixed_steps(rows) -> float:
    """A fake model's step time: 10 ms plus 1 ms a token."""
    return 0.010 + 0.001 * sum(r.new for r in rows)


# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
TRACE = [SimRequest(0.0, 40, 5), SimRequest(0.001, 20, 8), SimRequest(0.002, 70, 3), SimRequest(0.2, 10, 6),
         SimRequest(0.2005, 33, 4)]
# fmt: on


def test_the_simulated_schedule_is_the_real_step_loops(tmp_path):
    """The same arrivals through the real step loop over a real (tiny, random) model and through the simulator,
    both timed by one fake step time: the same rows in every step, the same TTFT and end of every request."""
    from tiny_models import random_gemma3_engine

    engine = random_gemma3_engine(tmp_path, window=16, context=256)
    kw = {"pool_tokens": 160, "chunk_size": 32, "max_running": 3}  # 10 blocks: admission and growth both bind
    sim = simulate(engine.spec, TRACE, fixed_steps, **kw)
    real = simulate(engine.spec, TRACE, fixed_steps, model=engine.runner, **kw)
    assert sim.steps == real.steps and len(sim.steps) > 10
    assert any(len(rows) > 1 for rows in sim.steps)  # batched: decode rows beside a prefill chunk
    for a, b in zip(sim.records, real.records, strict=True):
        assert (a.first_content, a.end, a.n_out) == (b.first_content, b.end, b.n_out)
        assert a.ok and a.n_out == TRACE[a.index].output_tokens


def test_a_client_cap_holds_requests_on_the_clients_side():
    """loadtest --rate R --concurrency C keeps at most C requests at the server; the rest wait at the client,
    and their times count from their arrival. With a cap of 1 the requests run one after another: each is sent
    when the one before ends, so it meets no other, and its TTFT is its wait plus the uncapped TTFT it has alone."""
    spec = load_spec("llama-3-8b")
    trace = [SimRequest(0.0, 40, 5), SimRequest(0.001, 20, 8), SimRequest(0.002, 70, 3)]
    capped = simulate(spec, trace, fixed_steps, pool_tokens=4096, in_flight=1)
    alone = [simulate(spec, [SimRequest(0.0, r.prompt_tokens, r.output_tokens)], fixed_steps, 4096) for r in trace]
    assert all(len(rows) == 1 for rows in capped.steps)  # never two requests in one step
    for i, rec in enumerate(capped.records):
        sent = 0.0 if i == 0 else capped.records[i - 1].end
        solo = alone[i].records[0]
        assert rec.first_content == pytest.approx(sent + solo.first_content, abs=1e-12)
        assert rec.end == pytest.approx(sent + solo.end, abs=1e-12) and rec.start == trace[i].arrival_s
    uncapped = simulate(spec, trace, fixed_steps, pool_tokens=4096)
    assert any(len(rows) > 1 for rows in uncapped.steps)  # without the cap they batch


def test_alone_a_request_takes_its_predicted_prefill_then_one_decode_step_per_token():
    """At a rate so low that requests never meet: TTFT is the predicted prefill (in chunks), each ITL the
    predicted decode step at its context, to the last bit (the simulator adds nothing of its own)."""
    spec, hw = load_spec("llama-3-8b"), get_hardware("h100")
    profile, layout = catalog_profile(hw, "bfloat16"), timemodel.layout_for("bfloat16")

    def step(rows):
        return timemodel.predict_step(spec, rows, profile, layout).seconds

    trace = [SimRequest(100.0 * i, 300 + 50 * i, 4) for i in range(3)]
    result = simulate(spec, trace, step, pool_tokens=8192, chunk_size=128)
    for rec, r in zip(result.records, trace, strict=True):
        chunks = timemodel.predict_prefill(spec, r.prompt_tokens, profile, layout, 0, 1, 128)
        assert rec.first_content - rec.start == pytest.approx(chunks.seconds, rel=1e-12)
        itls = [b - a for a, b in zip(rec.chunk_times, rec.chunk_times[1:], strict=False)]
        want = [step([timemodel.Row(1, r.prompt_tokens + k)]) for k in range(r.output_tokens - 1)]
        assert itls == pytest.approx(want, rel=1e-9)


def test_a_requests_time_outside_the_server_shifts_its_ttft_and_end_not_its_gaps():
    """latency_s (HTTP in and out): each request reaches the loop that much later; alone, its TTFT and E2E grow by
    it and its gaps between tokens do not change."""
    spec = load_spec("llama-3-8b")
    trace = [SimRequest(10.0 * i, 30 + 7 * i, 5) for i in range(3)]
    base = simulate(spec, trace, fixed_steps, pool_tokens=4096)
    late = simulate(spec, trace, fixed_steps, pool_tokens=4096, latency_s=0.025)
    for a, b in zip(base.records, late.records, strict=True):
        assert b.start == a.start and b.first_content == pytest.approx(a.first_content + 0.025, abs=1e-12)
        assert b.end == pytest.approx(a.end + 0.025, abs=1e-12)
        assert [y - x for x, y in zip(b.chunk_times, b.chunk_times[1:], strict=False)] == pytest.approx(
            [y - x for x, y in zip(a.chunk_times, a.chunk_times[1:], strict=False)], abs=1e-12
        )


def test_a_request_arriving_at_a_busy_server_makes_the_next_step_longer():
    """intake_s: a request that arrives while the loop runs a step (its HTTP and tokenizing take a core) makes the
    next step longer by it: its own TTFT and the running request's next token come that much later; a request
    that finds the loop idle costs nothing."""
    spec = load_spec("llama-3-8b")
    trace = [SimRequest(0.0, 30, 6), SimRequest(0.05, 20, 3), SimRequest(5.0, 10, 2)]
    base = simulate(spec, trace, fixed_steps, pool_tokens=4096)
    slow = simulate(spec, trace, fixed_steps, pool_tokens=4096, intake_s=0.004)
    (a0, b0, c0), (a1, b1, c1) = base.records, slow.records
    assert b1.first_content == pytest.approx(b0.first_content + 0.004, abs=1e-12)  # it arrived while a decoded
    later = [t1 - t0 for t0, t1 in zip(a0.chunk_times, a1.chunk_times, strict=True)]
    assert later[0] == 0.0 and later[-1] == pytest.approx(0.004, abs=1e-12)  # a's tokens after b arrived
    assert c1.first_content - c1.start == pytest.approx(c0.first_content - c0.start, abs=1e-12)  # idle: no cost


def test_a_steps_intake_is_timed_from_probes_arriving_while_a_burst_decodes():
    """server_calibration.arrival_costs: the burst's step during which a probe arrived less its steps without an
    arrival or a prefill (median over the burst's requests); a step in which a probe's prompt was prefilled is no
    baseline. calibrate() takes the median over the probes of every run."""
    from prefill.loadtest.client import RequestRecord
    from prefill.loadtest.server_calibration import BURST, arrival_costs, calibrate

    steps = [0.04] * 30  # the burst's steps: 40 ms each, but ...
    steps[5] = steps[15] = 0.046  # ... a probe arrived during these two (+6 ms) ...
    steps[6], steps[16] = 0.10, 0.13  # ... and was prefilled in the next
    ends = [sum(steps[: k + 1]) for k in range(30)]
    burst = [RequestRecord(i, 10, 0.0, ends[0], ends, ends[-1], 30, 30, 32, 0, "length") for i in range(BURST)]

    def probe(i, start, k):  # sent at `start`, prefilled in step k, its second token a step later
        return RequestRecord(BURST + i, 10, start, ends[k], ends[k : k + 2], ends[k + 1], 2, 2, 64, 0, "length")

    probes = [probe(0, ends[4] + 0.01, 6), probe(1, ends[14] + 0.03, 16), probe(2, ends[15] + 0.05, 17)]
    assert arrival_costs(burst, probes) == pytest.approx([0.006, 0.006])  # the third arrived during a prefill

    def forward(rows):  # the time model's forward, and the step's
        return 0.030 + 0.001 * len(rows)

    alone = [RequestRecord(0, 10, 0.0, 0.1, [0.1 + 0.031 * k for k in range(20)], 0.7, 20, 20, 32, 0, "length")]
    assert calibrate(forward, forward, [(alone, [*burst, *probes])]).intake_s == pytest.approx(0.006)
    assert calibrate(forward, forward, [(alone, burst)]).intake_s == 0.0  # no probe: none timed


def test_the_servers_own_time_is_timed_on_requests_alone_together_and_prefilled_among_them():
    """server_calibration.calibrate: c from the gaps of requests alone beyond the predicted one-row step (the
    least), e from a burst's gaps beyond the predicted step of all its rows (per row after the first; the least
    of the runs before and after a load), the latency as the client's TTFT less the server's (of the probes,
    else of the requests alone), and the prefill's scale from prompts prefilled while the burst decoded (the
    server's prefill_s against the time model's step of the prompt beside the burst's rows); a probe after the
    burst ended, or from a server that sends no timings, tells nothing."""
    from prefill.costmodel.ops import Row
    from prefill.loadtest.client import RequestRecord
    from prefill.loadtest.server_calibration import BURST, ServingCalibration, calibrate

    def record(i, gap, n=20, prompt=32, timings=None, start=0.0):
        times = [start + 0.1 + gap * k for k in range(n)]
        return RequestRecord(i, 100, start, times[0], times, times[-1], n, n, prompt, 0, "length", timings)

    def forward(rows):  # the time model's forward: 30 ms, 1 ms a row and 0.2 ms a prefill token
        return 0.030 + 0.001 * len(rows) + 0.0002 * sum(r.new for r in rows if r.new > 1)

    def step(rows):  # and the loop's own work: 0.5 ms
        return forward(rows) + 0.0005

    alone = [record(0, 0.0315 + 0.0025, timings={"ttft_s": 0.094}), record(0, 0.0315 + 0.004, timings={"ttft_s": 0.09})]
    burst = [record(i, step([Row(1, 40)] * BURST) + 0.0025 + 0.0004 * (BURST - 1)) for i in range(BURST)]
    whole = forward([Row(100, 0)] + [Row(1, 32)] * BURST)  # beside the burst's rows (no token streamed yet)
    probe = record(BURST, 0.05, n=2, prompt=100, timings={"prefill_s": 1.25 * whole, "ttft_s": 0.09}, start=-1.0)
    late = record(BURST + 1, 0.05, n=2, prompt=100, timings={"prefill_s": 9.0}, start=5.0)  # the burst had ended
    slower = [record(i, step([Row(1, 40)] * BURST) + 0.0025 + 0.0009 * (BURST - 1)) for i in range(BURST)]
    own = calibrate(forward, step, [(alone, [*burst, probe, late]), (alone[1:], slower)])  # before and after
    assert own.c == pytest.approx(0.0025) and own.e == pytest.approx(0.0004)
    assert own.latency_s == pytest.approx(0.01) and own.prefill_scale == pytest.approx(1.25)  # of the busy server's
    assert calibrate(forward, step, [(alone, burst)]).latency_s == pytest.approx(0.006)  # no probe: the least alone
    untimed = calibrate(forward, step, [([record(0, 0.034)], burst)])  # no timings: no latency, the prefill unscaled
    assert untimed.latency_s == 0.0 and untimed.prefill_scale == 1.0
    for bad in ((alone, burst[:1]), ([], burst)):
        with pytest.raises(ValueError):
            calibrate(forward, step, [bad])
    rows = [Row(100, 0), Row(1, 50), Row(1, 60)]  # a prefill chunk beside two decode rows: the step scaled
    assert own.forward_seconds(forward, rows) == pytest.approx(1.25 * forward(rows))
    assert own.forward_seconds(forward, rows[1:]) == forward(rows[1:])  # decode alone: the time model's
    assert ServingCalibration().forward_seconds(forward, rows) == forward(rows)


def test_queueing_grows_the_tail_as_the_rate_nears_capacity():
    """The same 120 requests arriving faster: p99 TTFT grows (queueing), and the rows per decode step too."""
    spec, hw = load_spec("llama-3-8b"), get_hardware("h100")
    profile, layout = catalog_profile(hw, "bfloat16"), timemodel.layout_for("bfloat16")

    def step(rows):
        return timemodel.predict_step(spec, rows, profile, layout).seconds

    p99, batch = [], []
    for rate in (1.0, 8.0, 32.0):
        trace = poisson_trace(rate, 120, PromptLengths(128, 1024), 64, seed=3)
        result = simulate(spec, trace, step, pool_tokens=65_536, chunk_size=512, max_running=64)
        p99.append(summarize(result.records, result.wall_s)["latency"]["ttft_s"]["p99"])
        batch.append(sum(len(rows) for rows in result.steps) / len(result.steps))
    assert p99[0] < p99[1] < p99[2] and batch[0] < batch[1] < batch[2]


def test_a_trace_needs_a_positive_rate():
    with pytest.raises(BadInput, match="rate > 0"):
        poisson_trace(0.0, 10, PromptLengths(8, 8), 4)


def test_simulate_command_prints_percentiles_and_refuses_bad_input():
    from prefill.cli.main import app

    runner = CliRunner()
    args = ["simulate", "-m", "llama-3-8b", "--hardware", "h100", "--requests", "30", "--rate", "4"]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["successful"] == out["requests"] == 30
    assert out["latency"]["ttft_s"]["p50"] <= out["latency"]["ttft_s"]["p99"]
    bad = runner.invoke(app, [*args[:-2], "--rate", "-1"])
    assert bad.exit_code == 2 and "rate > 0" in bad.output


def test_a_cpu_server_on_native_blocks_is_simulated_with_their_kernels(monkeypatch):
    """`prefill loadtest --predict` against `prefill serve` (weights auto: the GGUF's blocks on a CPU): the time
    model reads the block kernels' curves (the engine's weight types) and their fused decode, as the server's
    engine predicts itself; it read the dense float32 curves, and predicted ITL 2.7x the measured one."""
    from prefill.costmodel.profile import MachineProfile
    from prefill.engine.llm import Engine
    from prefill.machine import profiles
    from prefill.model.quant import ops
    from prefill.plan import simulate as sim_module

    asked = {}

    def profile_for(spec, dtype, device="cpu", **kw):
        asked.update(kw)
        return MachineProfile("fake", dtype, 1e11, 1e10, 1e-6, "test", attention=((1, 1e10), (4096, 1e10)))

    layouts = []
    monkeypatch.setattr(profiles, "profile_for", profile_for)
    monkeypatch.setattr(sim_module, "time_model_steps", lambda spec, p, layout: layouts.append(layout) or fixed_steps)
    monkeypatch.setattr(sim_module, "_stored_as", lambda weights, model, dtype, on_cpu: "Q4_1")  # native here
    sim_module.simulate_server(None, "cpu", None, "auto", TRACE[:2], 256, 32, 64.0)
    engine = Engine.load(None, dtype="float32", weights="native", progress=False)
    assert asked["qtypes"] == engine.weight_types()  # e.g. {"576x960": "Q4_1", ..., "576x49152": "Q8_0"}
    assert layouts[0].fused_below == (engine.layout().fused_below if ops.available() else 0)
    assert layouts[0].weight_bytes == engine.layout().weight_bytes


def test_the_step_loops_own_work_is_measured_and_added_to_each_step(monkeypatch):
    """A server's step is its forward and the loop's own work (scheduling, sampling R rows of the vocabulary,
    detokenizing): measured on the real StepLoop with a runner that computes nothing, added as a + b R."""
    from prefill.costmodel.ops import Row
    from prefill.loading.resolve import default_model_path
    from prefill.plan import simulate as sim_module
    from prefill.plan.loop_overhead import loop_overhead

    spec = load_spec(default_model_path())
    a, b = loop_overhead(spec, None, rows=(1, 4), steps=6)  # raises unless it decoded 1, then 4, rows a step
    assert a >= 0 and b >= 0 and a + b > 0
    monkeypatch.setattr(sim_module, "time_model_steps", lambda spec, profile, layout: lambda rows: 0.01 * len(rows))
    server = sim_module.ServerModel(spec, None, None, 1024, "", None, (1e-3, 2e-4))
    assert server.steps()([Row(1, 10)] * 4) == pytest.approx(0.04 + 1e-3 + 4 * 2e-4)
    own = sim_module.ServingCalibration(c=3e-4, e=1e-4)  # and the server's own, timed on it
    timed = sim_module.ServerModel(spec, None, None, 1024, "", None, (1e-3, 2e-4), own)
    assert timed.steps()([Row(1, 10)] * 4) == pytest.approx(0.04 + 1e-3 + 4 * 2e-4 + 3e-4 + 3 * 1e-4)


def test_simulate_engine_runs_a_gpu_deployment_by_its_engines_rules_and_refuses_a_cpu():
    import json

    from typer.testing import CliRunner

    from prefill.cli.main import app

    runner = CliRunner()
    args = ["simulate", "-m", "llama-3.1-8b", "--hardware", "h100", "--rate", "200", "--requests", "300"]
    args += ["--prompt-len", "200:600", "--output-len", "20:60", "--json"]
    vllm = runner.invoke(app, [*args, "--engine", "vllm"])
    ours = runner.invoke(app, [*args, "--engine", "prefill"])
    assert vllm.exit_code == 0 and ours.exit_code == 0, vllm.output + ours.output
    fast, slow = json.loads(vllm.stdout), json.loads(ours.stdout)
    assert fast["successful"] == slow["successful"] == 300
    # saturated: vLLM's 1,024 running requests over one batched attention kernel a layer serve more than our
    # 32 with one attention a row, and queue less
    assert fast["throughput_output_tok_per_s"] > 1.2 * slow["throughput_output_tok_per_s"]
    assert fast["latency"]["ttft_s"]["p50"] < slow["latency"]["ttft_s"]["p50"]
    for bad, words in ((["--engine", "tgi"], "choose one of"), (["--engine", "vllm", "--hardware", "cpu"], "cpu")):
        out = runner.invoke(app, [*args, *bad])
        assert out.exit_code == 2 and words in out.output and "Traceback" not in out.output


def test_an_engines_rules_shape_each_step_decode_in_the_budget_or_prefill_alone():
    spec = load_spec("llama-3-8b")
    trace = [SimRequest(0.0, 4, 30), SimRequest(0.0, 4, 30), SimRequest(0.0, 4, 30), SimRequest(0.01, 64, 4)]
    ours = simulate(spec, trace, fixed_steps, 4096, chunk_size=16, max_running=8)
    vllm = simulate(spec, trace, fixed_steps, 4096, chunk_size=16, max_running=8, rules=(True, True))
    sglang = simulate(spec, trace, fixed_steps, 4096, chunk_size=16, max_running=8, rules=(False, False))
    tokens = [[sum(n for n, _ in s) for s in r.steps] for r in (ours, vllm, sglang)]
    assert max(tokens[0]) == 16 + 3  # ours: three decode rows beside a full 16-token chunk
    assert max(tokens[1]) == 16  # vLLM's: the decode rows count against the same budget
    mixed = [s for s in sglang.steps if any(n > 1 for n, _ in s) and any(n == 1 for n, _ in s)]
    assert not mixed and max(tokens[2]) == 16  # SGLang's: a prefill step runs alone
    for r in (ours, vllm, sglang):
        assert all(rec.n_out == t.output_tokens for rec, t in zip(r.records, trace, strict=True))


def test_a_gpu_without_an_engine_is_simulated_as_vllm_runs_it_and_says_so():
    """No GPU path keeps the per-row attention model: without --engine a catalog GPU runs vLLM's profile (the
    same numbers as --engine vllm), and stderr says which engine it took."""
    from prefill.cli.main import app

    runner = CliRunner()
    args = ["simulate", "-m", "llama-3-8b", "--hardware", "h100", "--requests", "20", "--rate", "8"]
    default, vllm = (runner.invoke(app, [*args, *extra, "--json"]) for extra in ([], ["--engine", "vllm"]))
    assert default.exit_code == vllm.exit_code == 0, default.output
    assert json.loads(default.stdout) == json.loads(vllm.stdout)
    said = runner.invoke(app, args)
    assert "no --engine: vllm's profile and scheduler on h100" in said.output and "vllm" in said.output


@pytest.mark.parametrize("window", [1, 10])
def test_under_multi_step_scheduling_a_request_waits_for_the_running_window(window):
    """vLLM 0.6's --num-scheduler-steps: B arrives 1 ms into A's first decode step. With windows of 10 decode
    steps it joins when A's window ends (after A's 11th token: its prefill's, then 10 decode steps), and its prefill
    runs in a step of its own; with single steps it joins at the next step. Steps: 10 ms + 1 ms a token."""
    spec = load_spec("llama-3-8b")
    prefill_a = fixed_steps([timemodel.Row(100, 0)])  # A's prefill step ends at 110 ms
    trace = [SimRequest(0.0, 100, 40), SimRequest(prefill_a + 0.001, 50, 5)]
    a, b = simulate(spec, trace, fixed_steps, 8192, 512, 8, rules=(False, False), window=window).records
    joins = a.chunk_times[1 if window == 1 else 10]  # the end of the step B arrived in, or of A's window
    assert b.first_content == pytest.approx(joins + fixed_steps([timemodel.Row(50, 0)]), abs=1e-9)
    assert b.first_content - b.start > (0.100 if window == 10 else 0.0)


def test_a_prefill_cap_spreads_one_prompt_over_steps_within_the_budget():
    """vLLM's --long-prefill-token-threshold 256: a 600-token prompt under a 1,024-token budget runs as 256, 256
    and 88 tokens in three steps (without the cap, in one); two prompts share a step, 256 each."""
    spec = load_spec("llama-3-8b")
    capped = simulate(spec, [SimRequest(0.0, 600, 2)], fixed_steps, 8192, 1024, 8, prefill_cap=256)
    assert capped.steps[:3] == [[(256, 0)], [(256, 256)], [(88, 512)]]
    assert simulate(spec, [SimRequest(0.0, 600, 2)], fixed_steps, 8192, 1024, 8).steps[0] == [(600, 0)]
    two = simulate(
        spec, [SimRequest(0.0, 600, 2), SimRequest(0.0, 300, 2)], fixed_steps, 8192, 1024, 8, prefill_cap=256
    )
    assert two.steps[0] == [(256, 0), (256, 0)]
