"""The engine's predictions: the time model on a profile, with the engine's own shapes and layout. The shape
checks run on a synthetic profile (round rates), so a busy machine's probe cannot make them fail."""

import pytest

from prefill.costmodel.ops import Row
from prefill.costmodel.profile import MachineProfile
from prefill.costmodel.timemodel import PARTS

pytestmark = pytest.mark.slow
FLAT = MachineProfile("flat", "float32", 100e9, 16e9, 5e-6, "synthetic", attention=((1, 50e9), (4096, 50e9)))


def test_prefill_and_decode_predictions(smollm):
    seconds = [smollm.predict_prefill(P, profile=FLAT).seconds for P in (1, 16, 256, 1024)]
    assert all(0 < a < b for a, b in zip(seconds, seconds[1:], strict=False))
    hit = smollm.predict_prefill(24, past=1000, profile=FLAT).seconds
    assert 0 < hit < smollm.predict_prefill(1024, profile=FLAT).seconds  # the suffix against the cached context
    assert smollm.predict_prefill(1024, chunk_size=256, profile=FLAT).steps == 4
    one, eight = smollm.predict_decode([64], FLAT), smollm.predict_decode([64] * 8, FLAT)
    assert one.seconds < eight.seconds < 8 * one.seconds  # the weights are read once for all rows
    assert one.dominant == "memory" and one.explain().startswith("memory-bound")
    assert smollm.predict_decode([4096], FLAT).seconds > one.seconds  # each row's K/V read


def test_a_mixed_step_costs_less_than_its_parts_apart(smollm):
    rows = [Row(256), *[Row(1, 512)] * 4]
    together = smollm.predict_step(rows, FLAT).seconds
    apart = smollm.predict_step(rows[:1], FLAT).seconds + smollm.predict_step(rows[1:], FLAT).seconds
    assert smollm.predict_step(rows[:1], FLAT).seconds < together < apart


def test_the_engine_predicts_on_this_machines_profile(smollm):
    s, how = smollm.predict_prefill_seconds(24, past=1000)
    assert s > 0 and how.startswith("time model, ") and how.split(": ")[1] in {f"{p}-bound" for p in PARTS}
    assert smollm.gemm_rate() == smollm.profile().peak_flops_per_s > 0
    assert smollm.layout().weight_bytes == 4 and not smollm.layout().gathers_kv  # K/V read in place in the pool


def test_warm_up_records_the_cold_first_calls(smollm):
    smollm.warmup()
    assert smollm.cold_prefill_s > 0 and smollm.cold_decode_s > 0
