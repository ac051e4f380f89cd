"""Timing helpers: percentiles, the call pattern of time_call, peak memory of a call, argument parsing."""

import numpy as np
import pytest

from prefill.bench.peers import parse_peers
from prefill.bench.results import parse_dtypes, parse_ints
from prefill.bench.timing import Timing, measure_peak_memory, percentile, time_call, time_interleaved
from prefill.errors import BadInput


def test_percentile_worked_numbers():
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert percentile([2.0], 90) == 2.0
    with pytest.raises(BadInput):
        percentile([], 50)


def test_timing_median_and_p90():
    t = Timing(cold_s=9.0, samples_s=(0.3, 0.1, 0.2, 0.5, 0.4))
    assert t.median_s == pytest.approx(0.3)
    assert t.p90_s == pytest.approx(0.46)


def test_time_call_runs_cold_warmup_then_repeats():
    calls = []
    t = time_call(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 1 + 2 + 5
    assert len(t.samples_s) == 5
    assert t.cold_s >= 0 and all(s >= 0 for s in t.samples_s)
    with pytest.raises(BadInput):
        time_call(lambda: None, repeats=0)


def test_peak_memory_sees_a_200_mib_buffer():
    mem = measure_peak_memory(lambda: np.ones(200 * 2**20 // 8).sum())
    assert mem.kind == "rss"
    assert mem.delta_bytes > 150 * 2**20
    assert mem.peak_bytes >= mem.delta_bytes


def test_parsers():
    assert parse_ints("32, 128,512", "--prompt-lengths") == (32, 128, 512)
    assert parse_dtypes("fp32,bf16") == ("float32", "bfloat16")
    assert parse_peers("transformers,llamacpp") == ("transformers", "llamacpp")
    assert parse_peers("none") == ()
    for bad in ("32,x", "0", ""):
        with pytest.raises(BadInput):
            parse_ints(bad, "--prompt-lengths")
    with pytest.raises(BadInput, match="unknown peer"):
        parse_peers("vllm")


def test_time_interleaved_alternates_engines():
    order = []
    t = time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, warmup=1)
    # cold a, cold b, warm-up a, warm-up b, then a b a b a b
    assert "".join(order) == "abab" + "ab" * 3
    assert len(t["a"].samples_s) == len(t["b"].samples_s) == 3
