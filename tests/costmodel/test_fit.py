"""The fit recovers a profile's parameters from synthetic measurements made with known ones."""

import pytest

from prefill.costmodel.fit import Sample, fit_profile
from prefill.costmodel.hardware import get_hardware
from prefill.costmodel.ops import Row
from prefill.costmodel.profile import GemmCurve, MachineProfile, catalog_profile
from prefill.costmodel.specs import PRESETS
from prefill.costmodel.timemodel import layout_for, predict_decode, predict_prefill, prefill_steps
from prefill.errors import BadInput

SMOLLM2 = PRESETS["smollm2-135m"]
LAYOUT = layout_for("float32")
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152))
CURVE = ((1, 13e9), (4, 21e9), (16, 50e9), (64, 75e9), (256, 90e9), (1024, 90e9), (4096, 80e9))
# What a quick probe of a 2-core AVX2 machine looks like (round numbers)
# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
BASE = MachineProfile(
    "synthetic probe", "float32", 90e9, 16e9, 1.5e-6, "synthetic",
    gemm=tuple(GemmCurve(K, N, CURVE) for K, N in SHAPES),
    attention=((16, 10e9), (64, 26e9), (256, 34e9), (1024, 46e9)),
    attention_decode=((64, 3e9), (1024, 14e9), (4096, 15e9)),
    cache_bytes=32 * 2**20, cache_bandwidth_bytes_per_s=50e9,
)
# fmt: on
# fmt: off
TRUTH = BASE.with_fit(gemm_efficiency=0.8, attention_efficiency=0.6, bandwidth_bytes_per_s=12e9,
                      cache_bandwidth_bytes_per_s=37.5e9, op_overhead_s=4e-6, step_overhead_s=2e-3)
# fmt: on


def measurements(truth: MachineProfile, noise=lambda i: 1.0) -> list[Sample]:
    """Prefills at seven P and decode steps at nine (B, S), timed by `truth`'s time model (times a noise factor)."""
    out = []
    for i, P in enumerate((1, 4, 16, 64, 256, 1024, 4096)):
        t = predict_prefill(SMOLLM2, P, truth, LAYOUT).seconds * noise(i)
        out.append(Sample(tuple(map(tuple, prefill_steps(P))), t, f"P={P}"))
    for i, (B, S) in enumerate((B, S) for B in (1, 4, 8) for S in (64, 1024, 4096)):
        t = predict_decode(SMOLLM2, [S] * B, truth, LAYOUT).seconds * noise(i + 7)
        out.append(Sample(((Row(1, S),) * B,), t, f"B={B} S={S}"))
    return out


def test_the_fit_recovers_known_parameters():
    fit = fit_profile(SMOLLM2, BASE, LAYOUT, measurements(TRUTH))
    p = fit.profile
    assert p.gemm_efficiency == pytest.approx(0.8, rel=1e-9)
    assert p.attention_efficiency == pytest.approx(0.6, rel=1e-9)
    assert p.bandwidth_bytes_per_s == pytest.approx(12e9, rel=1e-9)
    assert p.cache_bandwidth_bytes_per_s == pytest.approx(37.5e9, rel=1e-9)
    assert p.op_overhead_s == pytest.approx(4e-6, rel=1e-9)
    assert p.step_overhead_s == pytest.approx(2e-3, rel=1e-9)
    assert p.kind == "fitted" and fit.iterations >= 1


def test_the_fit_holds_under_noise():
    # +-3% on each measurement, alternating: the parameters move by a few percent, not more
    fit = fit_profile(SMOLLM2, BASE, LAYOUT, measurements(TRUTH, lambda i: 1.03 if i % 2 else 0.97))
    assert fit.profile.gemm_efficiency == pytest.approx(0.8, rel=0.05)
    assert fit.profile.bandwidth_bytes_per_s == pytest.approx(12e9, rel=0.05)
    for s in measurements(TRUTH):  # and it predicts the noiseless truth within the noise
        rows = s.steps[0]
        got = (
            predict_decode(SMOLLM2, [r.past for r in rows], fit.profile, LAYOUT)
            if rows[0].past
            else predict_prefill(SMOLLM2, rows[0].new, fit.profile, LAYOUT)
        )
        assert got.seconds == pytest.approx(s.seconds, rel=0.05), s.label


def test_a_rate_the_measurements_barely_reach_keeps_the_probes_value():
    # Prompts of 2..6 tokens: attention sets under 1% of each one's time, so the fit leaves its rate alone.
    lengths = (2, 3, 4, 5, 6)
    samples = [
        Sample(tuple(map(tuple, prefill_steps(P))), predict_prefill(SMOLLM2, P, TRUTH, LAYOUT).seconds) for P in lengths
    ]
    fit = fit_profile(SMOLLM2, BASE, LAYOUT, samples)
    assert fit.profile.attention_efficiency == BASE.attention_efficiency != TRUTH.attention_efficiency
    for s, P in zip(samples, lengths, strict=True):  # within the share it left alone
        assert predict_prefill(SMOLLM2, P, fit.profile, LAYOUT).seconds == pytest.approx(s.seconds, rel=0.01)


def test_a_gpu_profile_fits_too():
    gpu = catalog_profile(get_hardware("h100"), "bf16")
    truth = gpu.with_fit(gemm_efficiency=0.6, bandwidth_bytes_per_s=2.2e12)
    lay = layout_for("bfloat16", gathers_kv=False)
    spec = PRESETS["llama-3-8b"]
    samples = [
        Sample(tuple(map(tuple, prefill_steps(P))), predict_prefill(spec, P, truth, lay).seconds)
        for P in (1, 16, 256, 1024, 4096, 8192)
    ]
    fit = fit_profile(spec, gpu, lay, samples)
    assert fit.profile.gemm_efficiency == pytest.approx(0.6, rel=1e-6)
    assert fit.profile.bandwidth_bytes_per_s == pytest.approx(2.2e12, rel=1e-6)


def test_too_few_or_bad_measurements_are_refused():
    with pytest.raises(BadInput, match="at least 5"):
        fit_profile(SMOLLM2, BASE, LAYOUT, measurements(TRUTH)[:3])
    bad = [*measurements(TRUTH)[:5], Sample(((Row(8),),), 0.0)]
    with pytest.raises(BadInput, match="positive"):
        fit_profile(SMOLLM2, BASE, LAYOUT, bad)
