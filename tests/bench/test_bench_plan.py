"""The sweep's plan: native dtypes by default, emulated ones at the smallest P, a duration from the cost model."""

import pytest

from prefill.bench import sweep as plan
from prefill.costmodel.costs import prefill_flops_exact
from prefill.costmodel.specs import ModelSpec
from prefill.machine.native import Capability

AVX2 = Capability("cpu", "AVX2 CPU", "AVX2", frozenset({"avx2"}))
ZEN4 = Capability("cpu", "Zen 4", "AVX512", frozenset({"avx2", "avx512f", "avx512_bf16"}))
LENGTHS = (32, 128, 512, 2048, 4096)


def test_default_dtypes_are_the_native_ones():
    assert plan.default_dtypes(AVX2) == ("float32",)
    assert plan.default_dtypes(ZEN4) == ("float32", "bfloat16")
    dtypes, per, notes = plan.dtypes_and_lengths(("auto",), LENGTHS, AVX2, force=False)
    assert dtypes == ("float32",) and per == {"float32": LENGTHS} and notes == []


def test_an_emulated_dtype_asked_for_runs_at_the_smallest_P_unless_forced():
    dtypes, per, notes = plan.dtypes_and_lengths(("float32", "bfloat16"), LENGTHS, AVX2, force=False)
    assert per == {"float32": LENGTHS, "bfloat16": (32,)}
    assert len(notes) == 1 and notes[0].startswith("bfloat16 is emulated on this AVX2 device")
    assert "--force" in notes[0]
    _, per, notes = plan.dtypes_and_lengths(("bfloat16",), LENGTHS, AVX2, force=True)
    assert per == {"bfloat16": LENGTHS} and notes == []
    _, per, _ = plan.dtypes_and_lengths(("bfloat16",), LENGTHS, ZEN4, force=False)
    assert per == {"bfloat16": LENGTHS}


def test_no_default_sweep_spends_minutes_on_an_emulated_dtype():
    # The issue's AVX2 machine: transformers' bf16 prefill at P = 512 took 7.2 s, about 15 GFLOP/s at the model's
    # shapes (a 2048^3 GEMM: 0.3). Asked for both dtypes, the bf16 part stays under 2 minutes.
    spec = ModelSpec.from_preset("smollm2-135m")
    rates = {"float32": 110e9, "bfloat16": 15e9}
    dtypes, per, _ = plan.dtypes_and_lengths(("float32", "bfloat16"), LENGTHS, AVX2, force=False)
    kw = dict(peers=("transformers",), compile=False, llama_files_per_dtype={}, repeats=5, warmup=1)
    total, points = plan.estimate(spec, dtypes, per, rates, **kw)
    bf16_s = sum(s for (dt, _), s in points.items() if dt == "bfloat16")
    assert bf16_s < 120
    forced = plan.estimate(spec, dtypes, {"float32": LENGTHS, "bfloat16": LENGTHS}, rates, **kw)[1]
    assert sum(s for (dt, _), s in forced.items() if dt == "bfloat16") > 1800  # what --force costs: over 30 min


def test_estimate_is_the_cost_model_at_the_probe_rate():
    spec = ModelSpec.from_preset("smollm2-135m")
    rate = 100e9
    total, points = plan.estimate(
        spec,
        ("float32",),
        {"float32": (512,)},
        {"float32": rate},
        peers=(),
        compile=False,
        llama_files_per_dtype={},
        repeats=5,
        warmup=1,
    )
    one = prefill_flops_exact(spec, 512).total / rate / plan.EFFICIENCY["prefill"]
    assert points[("float32", 512)] == pytest.approx(8 * one)  # cold + warm-up + 5 repeats + memory
    assert total == pytest.approx(8 * one + plan.LOAD_S)


def test_duration_text():
    assert plan.duration_text(40) == "about 40 s"
    assert plan.duration_text(210) == "about 3.5 min"
    assert plan.duration_text(4 * 3600) == "about 4.0 h"
