"""Timing helpers: percentiles, the call pattern of time_call, peak memory of a call, argument parsing."""

from pathlib import Path

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


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="settle reads Linux's /proc")
def test_settle_waits_while_a_process_computes_and_not_once_it_sleeps():
    """What `prefill bench --llama-bench` does between two engines (llama.cpp's threads spin ~5 ms after an eval):
    a child that computes for 0.6 s is waited for; a sleeping one is let go at once, long before the timeout.
    Windows of 50 ms: a busy child descheduled for a whole one (the suite's other worker beside it) is unlikely."""
    import subprocess
    import sys
    import time

    from prefill.bench.timing import cpu_ns, settle

    busy = (
        "import time; print('go', flush=True); end = time.time() + 0.6\nwhile time.time() < end: pass\ntime.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "go\n"
        t = time.perf_counter()
        settle(child.pid, window_s=0.05, timeout_s=5.0)
        assert time.perf_counter() - t >= 0.3  # it computed until 0.6 s after "go"
        cpu = cpu_ns(child.pid)
        t = time.perf_counter()
        settle(child.pid, window_s=0.05, timeout_s=5.0)
        assert time.perf_counter() - t < 2.5 and cpu_ns(child.pid) - cpu < 0.05e9  # quiet: let go, not timed out
    finally:
        child.kill()
        child.wait()
    assert cpu_ns(child.pid) is None  # gone: nothing to read, nothing to wait for
    settle(child.pid)
