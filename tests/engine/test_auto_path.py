"""`auto` on a real model file: the blocks' types read off the file match what the loaded engine holds, and the
choice over the open paths is the time model's, said in one line."""

from __future__ import annotations

import pytest
import torch

from prefill.costmodel.hardware import Hardware
from prefill.costmodel.profile import catalog_profile
from prefill.device.capability import capability
from prefill.machine import paths
from prefill.machine.paths import PATHS, Workload, path_blocker
from prefill.model.quant import QuantWeight, ops
from prefill.model.quant.activations import ENV

pytestmark = pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")


def test_the_files_block_types_are_the_engines(smollm_native):
    from prefill.engine.weights import native_weight_types

    assert native_weight_types(None, smollm_native.spec) == smollm_native.weight_types()


@pytest.fixture
def blocks_slow_to_compute(monkeypatch):
    """Profiles with one bandwidth (20 GB/s); native blocks' GEMMs at a quarter of the dense rate."""
    import prefill.machine.profiles as profiles

    def profile_for(spec, dtype, device, threads, echo=None, qtypes=None):
        flops = 50e9 if qtypes else 200e9
        return catalog_profile(Hardware("made up", {dtype: flops}, 20e9, 64e9, "a test"), dtype)

    monkeypatch.setattr(profiles, "profile_for", profile_for)


def admit(*keys: str) -> None:
    """Made-up quality records on the embedded file: the paths `keys` near-lossless, as `prefill verify
    --quality` would cache them (the session's cache folder is a temporary one: never this machine's)."""
    from prefill.loading import default_model_path
    from prefill.machine.quality_gate import QualityRecord, save_records

    passing = QualityRecord(top1=0.9994, ppl_ratio=1.0, mean_kl=6e-7, p99_kl=6e-6, tokens=10_240)
    save_records(default_model_path(), dict.fromkeys(keys, passing))


def test_auto_path_decides_dtype_and_weights_together(blocks_slow_to_compute, monkeypatch, tmp_path):
    from prefill.engine.weights import resolve_path

    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))  # no record: only exact paths are weighed
    lines: list[str] = []
    chat = resolve_path(None, "auto", "auto", echo=lines.append, workload=Workload(16, 512))
    assert chat == ("float32", "native", "f32")
    assert len(lines) == 1 and lines[0].startswith("path auto: native Q4_1/Q8_0 blocks, float32 activations, ")
    assert "for P = 16 + 512 out; vs dense float32 weights, float32 activations " in lines[0]
    assert "(8-bit activations only where asked: its greedy text changes on a prefix-cache hit)" in lines[0]
    long = resolve_path(None, "auto", "auto", echo=None, workload=Workload(8192, 1))[:2]
    assert long == ("float32", "float32")  # one long prefill: the dense GEMMs' fourfold rate wins, exact
    assert resolve_path(None, "bfloat16", "auto", echo=None)[:2] == ("bfloat16", "bfloat16")  # one path open
    admit(paths.PATHS[1].key())  # 8-bit activations near-lossless here: still not weighed (its text changes on a hit)
    lines.clear()
    assert resolve_path(None, "auto", "auto", echo=lines.append, workload=Workload(16, 512))[2] == "f32"
    assert "; vs native Q4_1/Q8_0 blocks, 8-bit activations " not in lines[0]
    assert "(8-bit activations only where asked: its greedy text changes on a prefix-cache hit)" in lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS, ids=lambda p: f"{p.weights}-{p.dtype}-{p.activations}")
def test_each_path_forced_runs_on_its_kernels(path, smollm_native, smollm, monkeypatch):
    """--dtype and --weights (and PREFILL_ACTIVATIONS for the blocks' activations) force each path of the
    registry (skipped, with why, where this CPU cannot run it);
    its next-token distribution on a short prompt stays near the float32-activation reference's (the bound is
    quality.py's rule at its loosest measured figure: llama.cpp's own p99 KL on this file is ~1e-2)."""
    from prefill.engine.llm import Engine
    from prefill.engine.weights import quantized_types, resolve_path

    if blocker := path_blocker(path, quantized_types(None), capability("cpu"), ops.available()):
        pytest.skip(blocker)
    monkeypatch.setenv(ENV, path.activations)
    assert resolve_path(None, path.dtype, path.weights, echo=None, activations=path.activations)[:2] == (
        path.dtype,
        path.weights,
    )
    shared = {("native", "float32", "f32"): smollm_native, ("float32", "float32", "f32"): smollm}
    engine = shared.get((path.weights, path.dtype, path.activations))
    engine = engine or Engine.load(None, dtype=path.dtype, weights=path.weights, progress=False)
    expected = "Q8_0 + Q4_1" if path.weights == "native" else path.weights
    assert engine.weights == expected and engine.dtype_name == path.dtype
    kept = {m.weight.activations for m in engine.model.modules() if isinstance(getattr(m, "weight", None), QuantWeight)}
    assert kept == ({path.activations} if path.weights == "native" else set())
    ids = smollm_native.encode_prompt("What is the capital of France?")
    ref = torch.log_softmax(smollm_native.prefill(ids)[0].float(), -1)  # [1, vocab]
    got = torch.log_softmax(engine.prefill(ids)[0].float(), -1)
    kl = float((ref.exp() * (ref - got)).sum())
    assert kl < 1e-2  # not the argmax: bfloat16 keeps ~98% of top-1 tokens, and this prompt's is a near-tie


def test_kv_auto_weighs_float16_only_where_the_gate_admits_it(smollm_native, monkeypatch, tmp_path):
    """--kv-dtype auto (engine.weights.choose_kv_dtype): float16 K/V unmeasured on this file stay float32, said
    in one line; measured near-lossless, each K/V dtype the CPU offers is predicted on the engine's profile for it
    (decode attention timed over such a pool) and choose_kv's rule takes one; the engine's new pools store K/V
    so. No line where one dtype is open and nothing was left out."""
    from prefill.costmodel.costs import request_seconds
    from prefill.device import capability as cap_module
    from prefill.engine.weights import choose_kv_dtype
    from prefill.machine.paths import kv_candidates

    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    engine, load = smollm_native, Workload(256, 128)
    options = kv_candidates(engine.dtype_name, capability("cpu"))
    lines: list[str] = []
    try:
        assert choose_kv_dtype(engine, load, echo=lines.append) == "float32"
        if len(options) > 1:
            assert lines == [
                "kv-dtype auto: float32 K/V (float16 K/V not measured near-lossless on this file; "
                "`prefill verify --quality` measures it)"
            ]
        admit(*(engine.serving_path.key(kv) for kv in options))
        lines.clear()
        kv = choose_kv_dtype(engine, load, echo=lines.append)
        assert kv in options and engine.kv_dtype_name == kv and engine.new_pool(32).k[0].dtype == kv_torch(kv)
        times = {}
        for k in options:
            engine.runner.set_kv_dtype(k)
            ttft, itl = engine.predict_prefill(256).seconds, engine.predict_decode([256 + 64]).seconds
            times[k] = request_seconds(ttft, 128, itl)
        assert kv == paths.choose_kv([(k, times[k]) for k in options], load)[0]
        if len(options) > 1:
            said = [line for line in lines if line.startswith("kv-dtype auto:")]  # after any probe's note
            assert len(said) == 1 and said[0].startswith(f"kv-dtype auto: {kv} K/V, predicted {times[kv]:.2f} s")
        no_f16c = cap_module.Capability("cpu", "a CPU", "AVX2", frozenset({"avx2"}))
        monkeypatch.setattr("prefill.engine.weights.capability", lambda device="cpu": no_f16c)
        lines.clear()
        assert choose_kv_dtype(engine, load, echo=lines.append) == "float32" and lines == []
    finally:
        engine.runner.set_kv_dtype(None)


def kv_torch(name: str):
    from prefill.engine.kvcache import kv_torch_dtype

    return kv_torch_dtype(name)
