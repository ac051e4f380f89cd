"""The one machine probe: its timings are finite rates, its budget holds, and its profile is measured once (with a
one-line note), cached on disk, and replaced by a fitted one when a benchmark saved one. Fakes stand in for the
timings wherever a test checks logic, never a speed."""

import math
import time

import pytest

from prefill.costmodel.specs import PRESETS
from prefill.machine import attention_probe, elementwise, entries, fits, probe, profiles
from prefill.machine.probe import measure_copy_bandwidth, measure_gemm_rate
from prefill.machine.profiles import get_hardware

SMOLLM2 = PRESETS["smollm2-135m"]


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_measure_gemm_rate_is_a_finite_rate_and_restores_threads(dtype):
    import torch

    before = torch.get_num_threads()
    rate = measure_gemm_rate(dtype, threads=1, seconds=0.05)
    assert math.isfinite(rate) and rate > 1e6  # any CPU of this century does a GEMM above 1 MFLOP/s
    assert torch.get_num_threads() == before


def test_this_cpu_is_measured():
    cpu = get_hardware("cpu")
    assert set(cpu.peak_flops) == {"float32", "bfloat16"}
    assert all(rate > 0 for rate in cpu.peak_flops.values())
    assert cpu.bandwidth_bytes_per_s > 0 and cpu.memory_bytes > 2**30
    assert "measured" in cpu.source
    assert get_hardware("cpu") is cpu  # measured once per process


def test_copy_bandwidth_is_positive():
    assert measure_copy_bandwidth(n_bytes=8 * 2**20, repeats=2) > 0


def test_every_timing_is_a_finite_positive_rate():
    curve = probe.gemm_curve(64, 128, "float32", budget_s=0.05)
    # How many points fit the budget depends on how busy the machine is (one point, in a fresh-clone run beside
    # the other test worker); where the curve stops is tested with fake timings below.
    assert [M for M, _ in curve] == list(probe.GEMM_MS[: len(curve)]) and len(curve) >= 1
    prefill, decode = attention_probe.attention_curves(2, 1, 16, "float32", budget_s=0.05)
    for points in (curve, prefill, decode):
        assert all(math.isfinite(r) and r > 0 for _, r in points)
    assert probe.measure_bandwidth(n_bytes=16 * 2**20) > 1e8  # 100 MB/s: any memory system
    assert 0 < probe.measure_op_overhead() < 1e-3
    assert probe.last_level_cache_bytes() >= 2**16


@pytest.mark.parametrize("preset", ["smollm2-135m", "gemma-3-270m"])  # Gemma 3: q/k norms, post norms, GELU
def test_the_elementwise_rate_runs_the_engines_block_at_the_models_shapes(preset):
    from prefill.costmodel.specs import PRESETS

    rate = elementwise.measure_elementwise_rate(PRESETS[preset], "float32")
    assert math.isfinite(rate) and rate > 1e8  # 100 MB/s of activations: any CPU


def test_the_gemm_curve_stops_where_the_budget_would_run_out(monkeypatch):
    # a GEMM of 1 ms per row, 3 calls per point: after 1, 2, 4, 8 and 16 rows 93 ms are spent, and the next (32
    # rows, predicted at most 4x the last) would add 192 ms to the 0.2 s budget
    monkeypatch.setattr(
        probe, "gemm_seconds", lambda M, K, N, dtype, device="cpu", repeats=3, copies=1, qtype=None, made=None: 1e-3 * M
    )
    monkeypatch.setattr(probe, "last_level_cache_bytes", lambda: 0)  # no cache to defeat: one copy of the weights
    curve = probe.gemm_curve(8, 8, "float32", budget_s=0.2)
    assert [M for M, _ in curve] == [1, 2, 4, 8, 16]
    assert curve[0][1] == pytest.approx(2 * 8 * 8 / 1e-3)


def test_beyond_cold_up_to_the_gemm_curve_times_a_hot_burst_and_adds_the_weights_streaming_time(monkeypatch):
    """Up to COLD_UP_TO rows the probe times cold copies of the weights; beyond, HOT_BURST_S of back-to-back calls
    on one weight (their mean), plus its bytes at the bandwidth (a CPU GEMM packs its weights, then computes).
    A fake GEMM: 1.5 ms over cold copies; hot, 1 ms alone and 1.2 ms a call in a burst (a thread late at times)."""
    bursts = []

    def seconds(M, K, N, dtype, device="cpu", repeats=3, copies=1, qtype=None, made=None, calls=1):
        bursts.append(calls)
        return 1.5e-3 if copies > 1 else (1.2e-3 if calls > 1 else 1e-3)

    monkeypatch.setattr(probe, "gemm_seconds", seconds)
    monkeypatch.setattr(probe, "last_level_cache_bytes", lambda: 2**20)  # 8 MiB of copies: 32 of 256 KiB
    K = N = 256  # float32: 256 KiB of weights, streamed in 0.25 ms
    curve = dict(probe.gemm_curve(K, N, "float32", budget_s=10.0, Ms=(64, 256), bandwidth=4 * K * N / 0.25e-3))
    assert curve[64] == pytest.approx(2 * 64 * K * N / 1.5e-3)  # cold copies, timed
    assert curve[256] == pytest.approx(2 * 256 * K * N / (1.2e-3 + 0.25e-3))  # a burst's mean + the weights' time
    assert max(bursts) == math.ceil(probe.HOT_BURST_S / 1e-3)


def test_after_streaming_takes_the_fastest_rounds_so_another_process_cannot_inflate_it(monkeypatch):
    """A fake clock: each GEMV takes 2 ms; the work 1 ms, but every other call 4 ms more (another process held
    a core). What the work adds after a GEMV is its fastest round's 1 ms, not a mean of 3 ms."""
    clock, calls = [0.0], [0]
    monkeypatch.setattr(probe.time, "perf_counter", lambda: clock[0])

    def stream():
        clock[0] += 2e-3

    def work():
        calls[0] += 1
        clock[0] += 1e-3 + (4e-3 if calls[0] % 2 else 0.0)

    assert probe.after_streaming(work, stream, calls=6) == pytest.approx(1e-3)


def fake_probe(monkeypatch, calls: list):
    def curve(K, N, dtype, device="cpu", budget_s=0.5, Ms=probe.GEMM_MS, qtype=None, bandwidth=None):
        calls.append(("gemm", K, N, dtype))
        return ((1, 1e10), (64, 5e10), (1024, 8e10))

    def attention(H_q, H_kv, d_head, dtype, device="cpu", budget_s=0.5, kv_dtype=None, prefill=True):
        calls.append(("attention", dtype) if kv_dtype is None else ("attention", dtype, kv_dtype, prefill))
        faster = 2.0 if kv_dtype not in (None, dtype) else 1.0  # fewer bytes a key: a faster decode row
        return ((16, 1e10 * faster), (1024, 4e10 * faster)) if prefill else (), (
            (64, 2e9 * faster),
            (4096, 8e9 * faster),
        )

    monkeypatch.setattr(probe, "gemm_curve", curve)
    monkeypatch.setattr(attention_probe, "attention_curves", attention)
    monkeypatch.setattr(probe, "measure_bandwidth", lambda device="cpu": 16e9)
    monkeypatch.setattr(probe, "measure_op_overhead", lambda device="cpu", dtype="float32": 2e-6)
    monkeypatch.setattr(elementwise, "measure_elementwise_rate", lambda spec, dtype, device="cpu": 50e9)
    monkeypatch.setattr(probe, "last_level_cache_bytes", lambda: 32 * 2**20)
    monkeypatch.setattr(profiles, "_MEMO", {})


def test_the_profile_is_probed_once_with_a_note_then_read_from_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    calls, notes = [], []
    fake_probe(monkeypatch, calls)
    p = profiles.profile_for(SMOLLM2, "fp32", threads=1, echo=notes.append)
    assert len(notes) == 1 and notes[0].startswith("probing this machine for") and "prefill calibrate" in notes[0]
    assert [c[0] for c in calls] == ["gemm"] * 5 + ["attention"]  # the model's five GEMM shapes, then attention
    assert {(c[1], c[2]) for c in calls[:5]} == set(profiles.model_shapes(SMOLLM2))
    assert p.kind == "probe" and p.threads == 1 and p.bandwidth_bytes_per_s == 16e9
    assert p.gemm_rate(64, 576, 3072) == 5e10 and p.peak_flops_per_s == 8e10
    assert p.attention_rate(1, 4096) == 8e9 and p.attention_rate(1024, 1024) == 4e10
    assert profiles.profile_for(SMOLLM2, "float32", threads=1, echo=notes.append) is p  # this process remembers
    monkeypatch.setattr(profiles, "_MEMO", {})  # a new process: the disk cache answers, silently
    assert profiles.profile_for(SMOLLM2, "float32", threads=1, echo=notes.append) == p
    assert len(calls) == 6 and len(notes) == 1
    profiles.probe_profile(SMOLLM2, "float32", threads=1, refresh=True)  # `prefill calibrate`: all again
    assert len(calls) == 12


def test_a_probe_older_than_the_asked_age_is_measured_again_with_a_note(tmp_path, monkeypatch):
    """`prefill serve` asks for a probe of its own minutes: an old cached one is measured again (and says so), a
    recent one is read, and without an age any cached probe serves."""
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    calls, notes = [], []
    fake_probe(monkeypatch, calls)
    profiles.probe_profile(SMOLLM2, "float32", threads=1)
    assert len(calls) == 6
    key = entries.entry_key("cpu", 1, "float32")
    data = profiles.read_json(profiles.PROFILE_FILE)
    assert profiles.probe_age_s(data[key]) < 60
    data[key]["measured"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 3 * 3600))
    data[key]["gemm"]["64x64"] = [[1, 1e9]]  # another model's shape, as old as the rest
    profiles.write_json(profiles.PROFILE_FILE, data)
    monkeypatch.setattr(profiles, "_MEMO", {})
    profiles.probe_profile(SMOLLM2, "float32", threads=1, echo=notes.append)  # no age asked: the old one serves
    assert len(calls) == 6 and notes == []
    p = profiles.probe_profile(SMOLLM2, "float32", threads=1, echo=notes.append, max_age_s=900)
    assert len(calls) == 12 and len(notes) == 1 and notes[0].startswith("this machine's cached probe is 3 h old")
    fresh = profiles.read_json(profiles.PROFILE_FILE)[key]
    assert profiles.probe_age_s(fresh) < 60 and p.kind == "probe"
    assert "64x64" not in fresh["gemm"]  # not marked fresh with the rest: measured again on its next need
    profiles.probe_profile(SMOLLM2, "float32", threads=1, echo=notes.append, max_age_s=900)  # now recent: read
    assert len(calls) == 12 and len(notes) == 1
    assert profiles.probe_age_s({"measured": "not a time"}) is None and profiles.probe_age_s({}) is None


def test_a_saved_fit_replaces_the_quick_probe_for_that_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    fake_probe(monkeypatch, [])
    quick = profiles.profile_for(SMOLLM2, "float32", threads=1)
    fitted = quick.with_fit(
        gemm_efficiency=0.9, op_overhead_s=3e-6, step_overhead_s=1e-3, kind="fitted", source=f"fit ({quick.source})"
    )
    fits.save_fitted(SMOLLM2, fitted, threads=1)
    assert profiles.profile_for(SMOLLM2, "float32", threads=1) == fitted
    entry = profiles.measure_entry(SMOLLM2, "float32", threads=1)  # a later probe, the fit applied on it
    entry["measured"] = "later"
    later = profiles.profile_of(entry, SMOLLM2, "float32", fitted=True, threads=1)
    assert later.gemm_efficiency == 0.9 and later.source.startswith("quick probe of later")
    assert "with the fit of" in later.source
    assert profiles.profile_for(SMOLLM2, "float32", threads=1, fitted=False) == quick
    assert profiles.profile_for(PRESETS["llama-3-8b"], "float32", threads=1).kind == "probe"  # another model


def test_a_fit_of_another_probe_version_is_not_applied(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    fake_probe(monkeypatch, [])
    quick = profiles.profile_for(SMOLLM2, "float32", threads=1)
    fits.save_fitted(SMOLLM2, quick.with_fit(gemm_efficiency=0.5, kind="fitted"), threads=1)
    monkeypatch.setattr(entries, "PROBE_VERSION", entries.PROBE_VERSION + 1)
    assert profiles.profile_for(SMOLLM2, "float32", threads=1).gemm_efficiency == 1.0


def test_the_decode_curve_is_timed_reading_kv_as_the_pool_stores_them(tmp_path, monkeypatch):
    """An engine whose pool stores K/V in another dtype than it computes in (--kv-dtype) is predicted on a decode
    curve timed over such a pool: its own entry beside the float32 one, probed once, and only that curve (a
    fresh cache measures the compute dtype's attention first)."""
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    calls = []
    fake_probe(monkeypatch, calls)
    f32 = profiles.profile_for(SMOLLM2, "float32", threads=1)
    calls.clear()
    f16 = profiles.profile_for(SMOLLM2, "float32", threads=1, kv_dtype="f16")
    assert calls == [("attention", "float32", "f16", False)]  # its decode curve: the GEMMs, bandwidth, overhead
    assert f16.attention_rate(1, 4096) == 2 * f32.attention_rate(1, 4096) == 16e9  # and a prefill's attention
    assert f16.attention_rate(1024, 1024) == f32.attention_rate(1024, 1024)  # are the same machine's
    monkeypatch.setattr(profiles, "_MEMO", {})  # a new process: both read from the disk cache
    calls.clear()
    assert profiles.profile_for(SMOLLM2, "float32", threads=1, kv_dtype="float16") == f16
    assert profiles.profile_for(SMOLLM2, "float32", threads=1, kv_dtype="float32") == f32 and calls == []


def test_the_decode_curve_times_the_engines_paged_kernel(monkeypatch):
    """On a CPU a decode row's attention is timed over a pool as the engine runs it: in float32 with the kernels
    built through paged_attention, per row and layer, and so over a pool of bfloat16, float16 or q8_0 K/V (a
    float32 model's --kv-dtype); in float32 without the kernels, through SDPA."""
    from prefill.model import kernels

    if not kernels.available():
        pytest.skip("the engine's kernels are not built here")
    calls = []
    real = attention_probe.decode_row_seconds
    monkeypatch.setattr(
        attention_probe, "decode_row_seconds", lambda *a, **k: calls.append((a[3], k["dtype"])) or real(*a, **k)
    )
    _, decode = attention_probe.attention_curves(9, 3, 64, "float32", budget_s=0.5)
    assert calls == [(S, "float32") for S, _ in decode] and len(calls) >= 2
    calls.clear()
    _, decode = attention_probe.attention_curves(9, 3, 64, "bfloat16", budget_s=0.5)
    assert calls == [(S, "bfloat16") for S, _ in decode] and len(calls) >= 1
    assert all(math.isfinite(r) and r > 0 for _, r in decode)
    for kv in ("float16", "q8_0"):
        calls.clear()
        _, decode = attention_probe.attention_curves(9, 3, 64, "float32", budget_s=0.2, kv_dtype=kv)
        assert calls == [(S, kv) for S, _ in decode] and len(calls) >= 1
        assert all(math.isfinite(r) and r > 0 for _, r in decode)
    calls.clear()
    monkeypatch.setattr(attention_probe, "kernels_built", lambda: False)
    attention_probe.attention_curves(9, 3, 64, "float32", budget_s=0.05)
    assert calls == []


def test_a_damaged_cache_entry_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    calls = []
    fake_probe(monkeypatch, calls)
    key = entries.entry_key("cpu", 1, "float32")
    profiles.write_json(profiles.PROFILE_FILE, {key: {"gemm": {"576x960": "not points"}, "attention": [1]}})
    assert profiles.profile_for(SMOLLM2, "float32", threads=1).kind == "probe"
    assert len(calls) == 6


def test_gemm_rates_read_the_curve_at_the_probe_m(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    calls = []
    fake_probe(monkeypatch, calls)
    rates = profiles.gemm_rates(dtypes=("float32", "bf16"), threads=1)
    assert set(rates) == {"float32", "bfloat16"} and len(calls) == 2
    # M = 512 between the points at 64 (50 GFLOP/s) and 1024 (80), log-log
    assert 5e10 < rates["float32"] < 8e10
    assert profiles.gemm_rates(dtypes=("bf16",), threads=1) == {"bfloat16": rates["bfloat16"]}
    assert len(calls) == 2  # cached
    profiles.gemm_rates(dtypes=("float32",), threads=1, refresh=True)
    assert len(calls) == 3


def test_a_probe_taken_on_a_busy_machine_says_so(tmp_path, monkeypatch):
    # Another process on the second core: every parallel GEMM waits a scheduler slice (~16 ms) for its thread.
    stalled = {"gemm": {"576x960": [[1, 4.0e9], [2, 0.1e9], [4, 0.3e9]]}, "bandwidth_bytes_per_s": 12e9}
    assert "ran 40x slower per FLOP than of one row" in entries.implausible(stalled)
    one_row = {"gemm": {"576x3072:Q4_1": [[1, 0.3e9], [2, 0.9e9], [4, 25.8e9]]}}  # seen: M = 1 timed mid-stall
    assert "GEMM of one row at K=576, N=3072 ran 22x slower per weight read than of 4 rows" in entries.implausible(
        one_row
    )
    assert entries.implausible({"gemm": {"576x960": [[1, 5.5e9], [2, 11e9], [4, 20.5e9], [64, 81.6e9]]}}) is None
    assert "elementwise work 4x slower than memory" in entries.implausible(
        {"bandwidth_bytes_per_s": 12e9, "cache_bandwidth_bytes_per_s": 0.6e9}
    )
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    notes = []
    fake_probe(monkeypatch, [])
    profiles.profile_for(SMOLLM2, "float32", threads=1, echo=notes.append)
    assert (
        len(notes) == 1
        and entries.implausible(profiles.read_json(profiles.PROFILE_FILE)[entries.entry_key("cpu", 1, "float32")])
        is None
    )
    monkeypatch.setattr(
        probe,
        "gemm_curve",
        lambda K, N, dtype, device="cpu", budget_s=1.0, Ms=(), qtype=None, bandwidth=None: ((1, 4e9), (2, 1e8)),
    )
    profiles.probe_profile(SMOLLM2, "float32", threads=1, refresh=True, echo=notes.append)
    assert notes[-1].startswith("warning: the probe's GEMM of 2 rows") and "idle machine" in notes[-1]


def test_probes_of_several_rounds_merge_point_by_point(tmp_path, monkeypatch):
    """benchmarks/predict.py and loadtest --predict probe in the minutes they measure, several times, and predict
    from the point-wise medians: each curve at the sizes every probe reached, each scalar the median."""
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    fake_probe(monkeypatch, [])
    probes = [profiles.measure_entry(SMOLLM2, "float32", threads=1) for _ in range(3)]
    assert not (tmp_path / profiles.PROFILE_FILE).exists()  # a benchmark's probe is not the cached one
    name = next(iter(probes[0]["gemm"]))
    probes[0]["gemm"][name] = [[1, 1e10], [64, 2e10], [1024, 9e10]]
    probes[1]["gemm"][name] = [[1, 3e10], [64, 6e10]]  # a slow second: this probe stopped its curve early
    probes[2]["bandwidth_bytes_per_s"] = 4e9
    merged = entries.median_entry(probes)
    assert merged["gemm"][name] == [[1, 1e10], [64, 5e10]]  # medians of (1, 3, 1) and (2, 6, 5)
    assert merged["bandwidth_bytes_per_s"] == 16e9 and merged["cache_bytes"] == 32 * 2**20
    assert merged["attention"] == probes[0]["attention"]
    p = profiles.profile_of(merged, SMOLLM2, "float32")
    assert p.gemm_rate(64, *map(int, name.split("x"))) == 5e10 and p.bandwidth_bytes_per_s == 16e9
    profiles.save_probe(merged, "float32", threads=1)  # this machine's probe from now on, measured no more
    cached = profiles.profile_for(SMOLLM2, "float32", threads=1, echo=pytest.fail)
    assert cached.gemm == p.gemm and cached.bandwidth_bytes_per_s == 16e9


def test_a_fit_of_the_block_kernels_applies_to_them_alone(tmp_path, monkeypatch):
    """benchmarks/predict.py --weights native fits the engine on the GGUF's blocks: that fit applies to the
    profile of those kernels (the server's, loadtest --predict's), never to the dense weights', nor theirs to it."""
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    fake_probe(monkeypatch, [])
    q4 = {"576x3072": "Q4_1", "576x49152": "Q8_0"}
    dense = profiles.profile_for(SMOLLM2, "float32", threads=1)
    blocks = profiles.profile_for(SMOLLM2, "float32", threads=1, qtypes=q4)
    fits.save_fitted(SMOLLM2, blocks.with_fit(gemm_efficiency=0.8, kind="fitted"), threads=1, qtypes=q4)
    assert profiles.profile_for(SMOLLM2, "float32", threads=1, qtypes=q4).gemm_efficiency == 0.8
    assert profiles.profile_for(SMOLLM2, "float32", threads=1) == dense
    fits.save_fitted(SMOLLM2, dense.with_fit(gemm_efficiency=0.5, kind="fitted"), threads=1)
    assert profiles.profile_for(SMOLLM2, "float32", threads=1, qtypes=q4).gemm_efficiency == 0.8
    assert profiles.profile_for(SMOLLM2, "float32", threads=1).gemm_efficiency == 0.5


def test_the_fastest_of_several_probes_keeps_what_only_some_measured():
    """A retried probe that stopped before a head layout's attention (a disturbed machine) leaves the others'."""
    first = {"gemm": {"576x960": [[1, 2.0], [8, 9.0]]}, "attention": {"9/3x64": {"prefill": [[1, 1.0]], "decode": []}}}
    retry = {"gemm": {"576x960": [[1, 3.0]]}, "attention": {}}
    best = entries.best_entry([first, retry])
    assert best["gemm"]["576x960"] == [[1, 3.0], [8, 9.0]]
    assert best["attention"]["9/3x64"] == {"prefill": [[1, 1.0]], "decode": []}


def test_a_fresh_cache_probes_the_compute_dtypes_attention_then_the_k_v_dtypes_decode(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    calls = []
    fake_probe(monkeypatch, calls)
    p = profiles.profile_for(SMOLLM2, "float32", threads=1, kv_dtype="q8_0")
    assert [c for c in calls if c[0] == "attention"] == [
        ("attention", "float32"),
        ("attention", "float32", "q8_0", False),
    ]
    assert p.attention_rate(1, 4096) == 16e9 and p.attention_rate(1024, 1024) == 4e10
