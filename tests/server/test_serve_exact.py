"""Explicit options mean what they say and scoring is exact (issue 51): `prefill serve --dtype float32` runs float32
activations whatever `auto` would have admitted, and its prompt log-probabilities are transformers' within 1e-4;
on a server whose blocks take 8-bit activations, echo / logprobs requests still run float32 activations unless the
server was started naming that path (--activations)."""

from __future__ import annotations

import httpx
import pytest
import torch

from prefill.model.quant import ops, set_activations
from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")]

TEXT = "Paris is the capital of France, and Berlin is the capital of Germany."
# float32 against float32 in another summation order, 30 layers: the server's own scoring test's bound
LOGPROB_TOLERANCE = 1e-4


def reference_logprobs(reference, ids: list[int]) -> list[float]:
    with torch.inference_mode():
        logits = reference(torch.tensor([ids])).logits[0].float()  # [P, vocab]
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def echo_logprobs(engine, exact_scoring: bool = True) -> list[float]:
    """The prompt log-probabilities of TEXT through a server on `engine` (echo, max_tokens 0)."""
    cfg = ServeConfig(model_id_of(engine), chunk_size=16, max_echo_tokens=200, exact_scoring=exact_scoring)
    with BackgroundServer(create_app(engine, cfg)) as url:
        body = {"model": cfg.model_id, "prompt": TEXT, "echo": True, "max_tokens": 0, "logprobs": 1}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        models = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert models["path"] == engine.path_label  # the path that runs, named where a client asks
    return r.json()["choices"][0]["logprobs"]["token_logprobs"][1:]


def worst(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_serve_dtype_float32_runs_float32_activations_and_matches_transformers(
    smollm, smollm_reference, monkeypatch, tmp_path
):
    from prefill.cli.common import open_engine
    from prefill.loading import default_model_path
    from prefill.machine.paths import PATHS
    from prefill.machine.quality_gate import QualityRecord, save_records

    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))  # q8 made near-lossless here: auto could take it
    save_records(default_model_path(), {PATHS[1].key(): QualityRecord(0.999, 1.0, 1e-5, 1e-4, 10_240)})
    engine, dtype, _ = open_engine(None, "float32", "auto", "cpu", None, False, None, "auto")  # as serve parses it
    assert dtype == "float32" and engine.activations == "f32" and "float32 activations" in engine.path_label
    ids = smollm.tokenizer.encode(TEXT, add_special_tokens=True)
    assert worst(echo_logprobs(engine), reference_logprobs(smollm_reference, ids)) <= LOGPROB_TOLERANCE


def test_scoring_on_an_8_bit_server_runs_float32_activations_unless_the_server_named_them(
    smollm_native, smollm, smollm_reference
):
    ids = smollm.tokenizer.encode(TEXT, add_special_tokens=True)
    ref = reference_logprobs(smollm_reference, ids)
    set_activations(smollm_native.model, "q8")
    try:
        assert smollm_native.activations == "q8"
        assert worst(echo_logprobs(smollm_native), ref) <= LOGPROB_TOLERANCE  # exact: a step on float32
        assert smollm_native.activations == "q8"  # and the server's own path put back after it
        named = echo_logprobs(smollm_native, exact_scoring=False)  # `serve --activations q8`: as asked
        assert worst(named, ref) > 10 * LOGPROB_TOLERANCE  # 8-bit activations move them (by ~1e-2 here)
    finally:
        set_activations(smollm_native.model, "f32")
