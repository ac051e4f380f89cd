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
