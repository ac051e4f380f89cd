"""Calibration fit on synthetic measurements: known rates in, the same rates out; predictions and MAPE."""

import pytest

from prefill.bench.calibrate import CalibrationReport, Observation, PredictionRow, fit_calibration, mape_pct, report
from prefill.costmodel.costs import Calibration, calibrated_prefill_seconds, prefill_flops_exact
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput

SPEC = ModelSpec.from_preset("smollm2-135m")
# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
TRUE = Calibration(overhead_s=0.004, linear_flops_per_s=200e9, attention_flops_per_s=60e9, dtype="bfloat16",
                   threads=2, source="synthetic")
# fmt: on
LENGTHS = (32, 128, 512, 1024, 2048, 4096)


def observe(P: int, past: int = 0, cal: Calibration = TRUE, noise: float = 1.0) -> Observation:
    count = prefill_flops_exact(SPEC, P, past=past)
    return Observation(P=P, count=count, seconds=calibrated_prefill_seconds(count, cal) * noise, past=past)


def two_lengths_and_halves(short: int = 128, long: int = 4096, cal: Calibration = TRUE) -> list[Observation]:
    """What the benchmark measures: two whole prompts, and each one's second half after its first is cached."""
    return [
        observe(short, cal=cal),
        observe(long, cal=cal),
        observe(short // 2, short // 2, cal),
        observe(long // 2, long // 2, cal),
    ]


def test_the_cached_half_carries_three_quarters_of_the_attention_and_half_the_linear_flops():
    whole, half = prefill_flops_exact(SPEC, 4096), prefill_flops_exact(SPEC, 2048, past=2048)
    assert half.linear == whole.linear / 2
    assert half.attention / whole.attention == pytest.approx(0.75, rel=1e-3)


def test_two_lengths_with_cached_halves_recover_the_true_rates():
    cal = fit_calibration(two_lengths_and_halves(), dtype="bfloat16", threads=2)
    assert cal.overhead_s == pytest.approx(0.004, rel=1e-6)
    assert cal.linear_flops_per_s == pytest.approx(200e9, rel=1e-6)
    assert cal.attention_flops_per_s == pytest.approx(60e9, rel=1e-6)
    assert (cal.dtype, cal.threads) == ("bfloat16", 2)


def test_three_lengths_need_no_cached_half():
    cal = fit_calibration([observe(P) for P in (128, 1024, 4096)], dtype="float32", threads=2)
    assert cal.attention_flops_per_s == pytest.approx(60e9, rel=1e-6)


def test_two_whole_prompts_alone_are_refused():
    with pytest.raises(BadInput, match="three independent measurements"):
        fit_calibration([observe(128), observe(4096)], dtype="bfloat16", threads=1)


def test_negative_overhead_is_pinned_to_zero():
    truth = Calibration(0.0, 100e9, 30e9, "float32", 1, "synthetic")
    obs = two_lengths_and_halves(512, 4096, truth)
    # the short prompt and its cached half ran twice as fast as the rates allow: a line through them and the
    # long ones would cross zero time above P = 0, i.e. a negative overhead
    obs = [Observation(o.P, o.count, o.seconds * (0.5 if o.P + o.past == 512 else 1.0), o.past) for o in obs]
    cal = fit_calibration(obs, dtype="float32", threads=1)
    assert cal.overhead_s == 0.0
    assert cal.linear_flops_per_s > 0 and cal.attention_flops_per_s > 0


def test_report_predicts_every_point_and_marks_the_fit_points():
    fitted = two_lengths_and_halves()
    cal = fit_calibration(fitted, dtype="bfloat16", threads=2)
    sweep = [observe(P) for P in LENGTHS]
    rep = report(cal, sweep + fitted[2:], fitted)
    assert [r.P for r in rep.sweep] == list(LENGTHS)
    assert rep.fitted_on == (128, 4096)
    assert [(r.P, r.past) for r in rep.rows if r.past] == [(64, 64), (2048, 2048)]
    assert rep.mape_pct == pytest.approx(0.0, abs=1e-6)
    assert rep.holdout_mape_pct == pytest.approx(0.0, abs=1e-6)


def test_error_and_mape_worked_numbers():
    rows = [
        PredictionRow(1, measured_s=0.100, predicted_s=0.110, fitted=True),
        PredictionRow(2, measured_s=0.200, predicted_s=0.190, fitted=False),
    ]
    assert rows[0].error_pct == pytest.approx(10.0)
    assert rows[1].error_pct == pytest.approx(-5.0)
    assert mape_pct(rows) == pytest.approx(7.5)
    rep = CalibrationReport(TRUE, tuple(rows))
    assert rep.holdout_mape_pct == pytest.approx(5.0)


def test_two_percent_noise_gives_a_few_percent_error():
    fitted = [
        Observation(o.P, o.count, o.seconds * f, o.past)
        for o, f in zip(two_lengths_and_halves(), (1.02, 0.98, 0.98, 1.02), strict=True)
    ]
    cal = fit_calibration(fitted, dtype="bfloat16", threads=2)
    rep = report(cal, [observe(P) for P in LENGTHS], fitted)
    assert rep.mape_pct < 5.0
