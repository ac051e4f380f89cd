"""Calibration fit on synthetic measurements: known rates in, the same rates out; predictions and MAPE."""

import math

import pytest

from prefill.bench.calibrate import CalibrationReport, Observation, PredictionRow, fit_calibration, mape_pct, report
from prefill.costs import Calibration, calibrated_prefill_seconds, prefill_flops_exact
from prefill.errors import BadInput
from prefill.specs import ModelSpec

SPEC = ModelSpec.from_preset("smollm2-135m")
TRUE = Calibration(overhead_s=0.004, linear_flops_per_s=200e9, attention_flops_per_s=60e9, dtype="bfloat16",
                   threads=2, source="synthetic")  # fmt: skip
LENGTHS = (32, 128, 512, 1024, 2048, 4096)


def observe(P: int, cal: Calibration = TRUE, with_share: bool = True) -> Observation:
    count = prefill_flops_exact(SPEC, P)
    t = calibrated_prefill_seconds(count, cal)
    share = count.attention / cal.attention_flops_per_s / t if with_share else None
    return Observation(P=P, count=count, seconds=t, attention_share=share)


def test_two_lengths_with_attention_share_recover_the_true_rates():
    cal = fit_calibration([observe(128), observe(4096)], dtype="bfloat16", threads=2)
    assert cal.overhead_s == pytest.approx(0.004, rel=1e-6)
    assert cal.linear_flops_per_s == pytest.approx(200e9, rel=1e-6)
    assert cal.attention_flops_per_s == pytest.approx(60e9, rel=1e-6)
    assert (cal.dtype, cal.threads) == ("bfloat16", 2)


def test_three_lengths_need_no_share():
    obs = [observe(P, with_share=False) for P in (128, 1024, 4096)]
    cal = fit_calibration(obs, dtype="float32", threads=2)
    assert cal.attention_flops_per_s == pytest.approx(60e9, rel=1e-6)


def test_two_lengths_without_share_are_refused():
    with pytest.raises(BadInput, match="two prompt lengths"):
        fit_calibration([observe(128, with_share=False), observe(4096, with_share=False)], dtype="x", threads=1)


def test_negative_overhead_is_pinned_to_zero():
    # times that a straight line through the origin explains better than any positive overhead
    truth = Calibration(0.0, 100e9, 30e9, "float32", 1, "synthetic")
    obs = [observe(P, truth) for P in (512, 4096)]
    obs[0] = Observation(512, obs[0].count, obs[0].seconds * 0.9, obs[0].attention_share)
    cal = fit_calibration(obs, dtype="float32", threads=1)
    assert cal.overhead_s == 0.0
    assert cal.linear_flops_per_s > 0 and cal.attention_flops_per_s > 0


def test_report_predicts_every_point_and_marks_the_fit_points():
    obs = [observe(P) for P in LENGTHS]
    cal = fit_calibration([o for o in obs if o.P in (128, 4096)], dtype="bfloat16", threads=2)
    rep = report(cal, obs, fitted_on=(128, 4096))
    assert [r.P for r in rep.rows] == list(LENGTHS)
    assert rep.fitted_on == (128, 4096)
    assert rep.mape_pct == pytest.approx(0.0, abs=1e-6)
    assert rep.holdout_mape_pct == pytest.approx(0.0, abs=1e-6)


def test_error_and_mape_worked_numbers():
    rows = [PredictionRow(1, measured_s=0.100, predicted_s=0.110, fitted=True),
            PredictionRow(2, measured_s=0.200, predicted_s=0.190, fitted=False)]  # fmt: skip
    assert rows[0].error_pct == pytest.approx(10.0)
    assert rows[1].error_pct == pytest.approx(-5.0)
    assert mape_pct(rows) == pytest.approx(7.5)
    rep = CalibrationReport(TRUE, tuple(rows))
    assert rep.holdout_mape_pct == pytest.approx(5.0)


def test_noisy_measurements_fit_within_the_noise():
    # +-2% alternating noise on every time: the fitted model predicts within a few percent
    obs = [observe(P) for P in LENGTHS]
    noisy = [Observation(o.P, o.count, o.seconds * (1.02 if i % 2 else 0.98), o.attention_share)
             for i, o in enumerate(obs)]  # fmt: skip
    cal = fit_calibration([o for o in noisy if o.P in (128, 4096)], dtype="bfloat16", threads=2)
    rep = report(cal, noisy, (128, 4096))
    assert rep.mape_pct < 5.0
    assert math.isfinite(cal.overhead_s)
