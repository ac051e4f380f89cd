"""The 8-bit activation path as the engine loads it: Engine.load puts the blocks on the path it is given (or
PREFILL_ACTIVATIONS's), the probe times each path's own kernels whatever the variable says, and the proofs
(`prefill verify`, --deterministic) stay on float32 activations even when PREFILL_ACTIVATIONS=q8 is set."""

from __future__ import annotations

import pytest
import torch

from prefill.model.quant import QuantWeight, ops
from prefill.model.quant.activations import ENV

pytestmark = pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")


def block_paths(engine) -> set[str]:
    """The activation paths of every quantized weight of `engine`'s model."""
    return {m.weight.activations for m in engine.model.modules() if isinstance(getattr(m, "weight", None), QuantWeight)}


def test_engine_load_puts_the_blocks_on_the_path_given(monkeypatch):
    from prefill.engine.llm import Engine

    monkeypatch.setenv(ENV, "q8")
    assert block_paths(Engine.load(None, weights="native", progress=False)) == {"q8"}  # the variable's path
    assert block_paths(Engine.load(None, weights="native", progress=False, activations="f32")) == {"f32"}
    deterministic = Engine.load(None, dtype="float32", weights="auto", progress=False, deterministic=True)
    assert block_paths(deterministic) <= {"f32"}  # dense float32 weights, and no block on q8 if any were kept


def test_the_probe_times_the_path_its_name_says(monkeypatch):
    from prefill.machine import probe

    monkeypatch.setenv(ENV, "q8")  # must not move the float32-activation curves onto the q8 kernels
    assert probe._weight(64, 64, torch.float32, "cpu", "Q4_1").activations == "f32"
    assert probe._weight(64, 64, torch.float32, "cpu", "Q4_1:q8").activations == "q8"


def test_verify_runs_its_proofs_on_float32_activations(monkeypatch):
    import prefill.cli.engine as cli_engine
    from prefill.engine.llm import Engine

    monkeypatch.setenv(ENV, "q8")
    engine = Engine.load(None, weights="native", progress=False)  # what auto could hand verify under the variable
    assert block_paths(engine) == {"q8"}
    monkeypatch.setattr(cli_engine, "load_engine", lambda *a, **k: engine)
    seen = []
    monkeypatch.setattr(cli_engine, "run_proofs", lambda e, *a: seen.append(block_paths(e)) or [])
    cli_engine.verify("Hi", reference=False)
    assert seen == [{"f32"}]


def test_auto_never_takes_8_bit_activations_unasked_and_an_explicit_option_runs_them(monkeypatch, tmp_path):
    """Made-up profiles (q8 kernels 400 GFLOP/s, float32-activation blocks 50, dense 200, one bandwidth): q8 is
    predicted fastest by far. Never measured on this file, auto stays on float32 activations; with a record that
    fails the gate (SmolLM2's own figures) too; and with one that passes as well: the greedy text on 8-bit
    activations changes on a prefix-cache hit, so auto never takes them unasked. An explicit dtype float32 is
    float32 activations whatever the record says; --activations q8 puts the blocks on q8, and the engine predicts
    with the q8 kernels' profile."""
    import prefill.machine.profiles as profiles
    from prefill.costmodel.hardware import Hardware
    from prefill.costmodel.profile import catalog_profile
    from prefill.engine.llm import Engine
    from prefill.engine.weights import resolve_path
    from prefill.loading import default_model_path
    from prefill.machine import paths
    from prefill.machine.quality_gate import QualityRecord, save_records

    def profile_for(spec, dtype, device="cpu", threads=None, echo=None, qtypes=None, **kw):
        q8 = any(t.endswith(":q8") for t in (qtypes or {}).values())
        flops = 400e9 if q8 else 50e9 if qtypes else 200e9
        return catalog_profile(Hardware("made up", {dtype: flops}, 20e9, 64e9, "a test"), dtype)

    monkeypatch.setattr(profiles, "profile_for", profile_for)
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    key = paths.PATHS[1].key()  # native blocks, 8-bit activations, float32 K/V
    records = {
        None: "f32",
        QualityRecord(top1=0.9713, ppl_ratio=1.0033, mean_kl=2.93e-3, p99_kl=1.37e-2, tokens=10_240): "f32",
        QualityRecord(top1=0.995, ppl_ratio=1.001, mean_kl=1e-4, p99_kl=5e-3, tokens=10_240): "f32",
    }
    for record, want in records.items():
        if record is not None:
            save_records(default_model_path(), {key: record})
        assert resolve_path(None, "auto", "auto", echo=None) == ("float32", "native", want)
    assert resolve_path(None, "float32", "auto", echo=None)[2] in ("f32", None)  # explicit: float32 activations
    engine = Engine.load(None, dtype="float32", weights="native", progress=False, activations="q8")
    assert block_paths(engine) == {"q8"} and engine.activations == "q8"
    assert set(engine.weight_types().values()) == {"Q4_1:q8", "Q8_0:q8"}  # the profile of the kernels it runs
    assert engine.profile().peak_flops_per_s == 400e9
