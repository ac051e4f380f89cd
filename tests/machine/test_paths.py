"""The serving paths and `auto`'s choice by the predicted time of a request: which paths a CPU runs, the workload
option, and the choice over profiles made up so that the answer is known from the arithmetic."""

from __future__ import annotations

import pytest

from prefill.costmodel.hardware import Hardware
from prefill.costmodel.profile import catalog_profile
from prefill.costmodel.specs import ModelSpec
from prefill.device.capability import Capability
from prefill.errors import BadInput
from prefill.machine import paths
from prefill.machine.paths import NATIVE, PathTime, ServingPath, Workload, candidates, choose_path

ZEN5 = Capability("cpu", "AMD EPYC (Zen 5)", "AVX512", frozenset({"avx2", "avx512f", "avx512_bf16", "fma"}))
ZEN3 = Capability("cpu", "AMD EPYC (Zen 3)", "AVX2", frozenset({"avx2", "fma"}))
Q = ("Q4_1", "Q8_0")


Q8 = (NATIVE, "float32", "q8")  # native blocks, 8-bit activations


def names(found):
    return [(p.weights, p.dtype, p.activations) if p.activations != "f32" else (p.weights, p.dtype) for p in found]


def test_the_paths_each_cpu_runs_natively():
    assert names(candidates("auto", "auto", Q, ZEN5, True)) == [
        (NATIVE, "float32"),
        Q8,
        ("bfloat16", "bfloat16"),
        ("float32", "float32"),
    ]
    assert names(candidates("auto", "auto", Q, ZEN3, True)) == [
        (NATIVE, "float32"),
        Q8,
        ("float32", "float32"),
    ]
    assert names(candidates("auto", "auto", Q, ZEN5, False)) == [("bfloat16", "bfloat16"), ("float32", "float32")]
    assert names(candidates("auto", "auto", (), ZEN3, True)) == [("float32", "float32")]  # a dense file


def test_an_explicit_part_narrows_the_paths():
    assert names(candidates("bf16", "auto", Q, ZEN5, True)) == [("bfloat16", "bfloat16")]
    assert names(candidates("float32", "auto", Q, ZEN5, True)) == [(NATIVE, "float32"), ("float32", "float32")]
    assert names(candidates("auto", "native", Q, ZEN5, True)) == [(NATIVE, "float32"), Q8]
    assert candidates("bfloat16", "auto", Q, ZEN3, True) == []  # emulated: no path runs it natively
    cuda = Capability("cuda", "H100", "CUDA sm_90", cuda_bf16=True)
    assert NATIVE not in {p.weights for p in candidates("auto", "auto", Q, cuda, True)}


def test_8_bit_activations_need_blocks_they_cover_and_the_kernels():
    q8 = ServingPath(NATIVE, "float32", "q8")
    assert paths.path_blocker(q8, Q, ZEN5, True) == ""
    assert "Q4_0/Q4_1/Q8_0" in paths.path_blocker(q8, ("Q4_K", "Q6_K"), ZEN5, True)  # K-quants: float32 only
    assert names(candidates("auto", "native", ("Q4_K", "Q6_K"), ZEN5, True)) == [(NATIVE, "float32")]
    assert "not built" in paths.path_blocker(q8, Q, ZEN5, False)  # no compiled kernels: no native path at all
    assert q8.label(("Q4_1",)) == "native Q4_1 blocks, 8-bit activations"


def test_prefill_activations_forces_the_blocks_activation_path(monkeypatch):
    from prefill.model.quant.activations import ENV, requested_activations

    monkeypatch.delenv(ENV, raising=False)
    assert requested_activations() == "auto"
    monkeypatch.setenv(ENV, "q8")
    forced = candidates("auto", "native", Q, ZEN5, True, requested_activations())
    assert names(forced) == [Q8]  # one path open: Engine.load's default (the same variable) loads it
    assert names(candidates("auto", "native", Q, ZEN5, True, "f32")) == [(NATIVE, "float32")]
    monkeypatch.setenv(ENV, "q4")
    with pytest.raises(BadInput, match="q8"):
        requested_activations()


def test_workload_parses_p_and_n():
    assert Workload.parse(None) == Workload(256, 128)
    assert Workload.parse("1024,16") == Workload(1024, 16)
    for bad in ("256", "a,b", "0,5", "5,0", "1,2,3"):
        with pytest.raises(BadInput, match="--workload"):
            Workload.parse(bad)


def _time(label, ttft, itl, w=Workload(100, 11)):
    return PathTime(ServingPath(label, "float32"), label, ttft, itl, w)  # exact paths: the fastest is taken


def test_choose_path_takes_the_least_whole_request_time_and_says_why():
    # TTFT + (n - 1) ITL with n = 11: a 1.0 + 10 x 0.1 = 2.0 s, b 0.5 + 10 x 0.2 = 2.5 s, c 0.2 + 10 x 0.3 = 3.2 s
    times = [_time("b", 0.5, 0.2), _time("a", 1.0, 0.1), _time("c", 0.2, 0.3)]
    best, line = choose_path(times)
    assert best.label == "a" and best.total_s == pytest.approx(2.0)
    assert line.startswith("path auto: a, predicted 2.00 s (TTFT 1000 ms, ITL 100.0 ms) for P = 100 + 11 out; vs ")
    assert "b 2.50 s (TTFT 500 ms, ITL 200.0 ms)" in line and "c 3.20 s" in line
    tie = [_time("x", 1.0, 0.1), _time("y", 1.0, 0.1)]
    assert choose_path(tie)[0].label == "x"  # the registry's order breaks a tie


def _hardware(flops: float) -> Hardware:
    return Hardware("made up", {"float32": flops, "bfloat16": flops}, 20e9, 64e9, "a test")


@pytest.fixture
def made_up_profiles(monkeypatch):
    """The native path's GEMMs at 50 GFLOP/s, dense ones at 200 GFLOP/s, one bandwidth (20 GB/s): native reads a
    sixth of float32's bytes a decode step, and computes at a quarter of its rate."""
    import prefill.machine.profiles as profiles

    def profile_for(spec, dtype, device, threads, echo=None, qtypes=None):
        return catalog_profile(_hardware(50e9 if qtypes else 200e9), dtype)

    monkeypatch.setattr(profiles, "profile_for", profile_for)


def test_auto_picks_by_the_workload(made_up_profiles):
    spec = ModelSpec.from_preset("smollm2-135m")
    qtypes = {"576x960": "Q4_1"}
    open_paths = candidates("float32", "auto", Q, ZEN5, True)

    def best(workload):
        return choose_path([paths.predict_path(spec, p, workload, qtypes) for p in open_paths])[0]

    chat = best(Workload(16, 512))  # decode-heavy: bytes decide, the blocks win
    assert chat.path.weights == NATIVE and chat.label == "native Q4_1 blocks, float32 activations"
    long = best(Workload(4096, 1))  # one long prefill: FLOPs decide, the dense GEMMs win
    assert long.path.weights == "float32"
    assert long.ttft_s < best(Workload(16, 512)).ttft_s * 4096 / 16  # sanity: the prefill scales with P


def test_auto_picks_8_bit_activations_where_predicted_fastest(monkeypatch):
    """Made up: the q8 kernels ("KxN:Q4_1:q8" curves) at 400 GFLOP/s, float32-activation blocks at 50, dense at
    200: q8 reads the blocks' bytes and computes fastest, so it wins every workload; at 10 GFLOP/s it loses all.
    (Over every path, as if the quality gate admitted them all.)"""
    import prefill.machine.profiles as profiles

    seen = []

    def profile_for(spec, dtype, device, threads, echo=None, qtypes=None):
        seen.append(dict(qtypes or {}))
        q8 = any(t.endswith(":q8") for t in (qtypes or {}).values())
        return catalog_profile(_hardware(rate(q8) if q8 else 50e9 if qtypes else 200e9), dtype)

    monkeypatch.setattr(profiles, "profile_for", profile_for)
    spec = ModelSpec.from_preset("smollm2-135m")
    qtypes = {"576x960": "Q4_1", "576x49152": "Q6_K"}
    open_paths = candidates("auto", "auto", Q, ZEN5, True)

    def best(workload):
        return choose_path([paths.predict_path(spec, p, workload, qtypes) for p in open_paths])[0]

    rate = lambda q8: 400e9  # noqa: E731
    for w in (Workload(16, 512), Workload(4096, 1)):
        assert best(w).path == paths.PATHS[1]  # native blocks, 8-bit activations
    assert {"576x960": "Q4_1:q8", "576x49152": "Q6_K"} in seen  # probed on its own kernels; Q6_K keeps float32
    assert best(Workload(16, 512)).label == "native Q4_1/Q6_K blocks, 8-bit activations"
    rate = lambda q8: 10e9  # noqa: E731
    assert best(Workload(16, 512)).path == ServingPath(NATIVE, "float32")


def test_the_native_layout_reads_the_blocks_bytes():
    native = paths.path_layout(ServingPath(NATIVE, "float32"), {"576x960": "Q4_1"})
    assert native.weight_bytes == pytest.approx(20 / 32)  # Q4_1: 20 bytes per 32 weights
    q8 = paths.path_layout(ServingPath(NATIVE, "float32", "q8"), {"576x960": "Q4_1:q8"})
    assert q8.weight_bytes == native.weight_bytes  # the kernel's name is no part of the bytes
    assert paths.path_layout(ServingPath("bfloat16", "bfloat16"), {}).weight_bytes == 2


def test_kv_auto_weighs_float16_where_the_cpu_widens_it_and_keeps_a_16_bit_engines_dtype():
    f16c = Capability("cpu", "AMD EPYC (Zen 3)", "AVX2", frozenset({"avx2", "fma", "f16c"}))
    assert paths.kv_candidates("float32", f16c) == ("float32", "float16")  # the reference first
    assert paths.kv_candidates("fp32", ZEN3) == ("float32",)  # no F16C: float16 would widen in software
    assert paths.kv_candidates("bfloat16", f16c) == ("bfloat16",)
    assert paths.kv_candidates("float32", Capability("cuda", "H100", "CUDA sm_90")) == ("float32",)


def test_choose_kv_keeps_the_reference_unless_another_saves_10_percent():
    load = Workload(4096, 128)
    kv, line = paths.choose_kv([("float32", 2.00), ("float16", 1.50)], load)
    assert kv == "float16"
    assert line == "kv-dtype auto: float16 K/V, predicted 1.50 s for P = 4096 + 128 out; vs float32 2.00 s"
    kv, line = paths.choose_kv([("float32", 1.26), ("float16", 1.15)], load)  # 9% faster: not worth rounding
    assert kv == "float32" and line.endswith("; vs float16 1.15 s (under 10% faster: K/V kept as float32)")
    assert paths.choose_kv([("float32", 1.26), ("float16", 1.13)], load)[0] == "float16"  # 10.3% faster
    assert paths.choose_kv([("float32", 1.26), ("float16", 1.3)], load) == (
        "float32",
        "kv-dtype auto: float32 K/V, predicted 1.26 s for P = 4096 + 128 out; vs float16 1.30 s",
    )
    with pytest.raises(ValueError):
        paths.choose_kv([], load)
