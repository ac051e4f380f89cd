"""`--weights auto` and the explicit choices: the pure choice logic over faked files, devices and probes."""

from __future__ import annotations

import pytest

from prefill.errors import BadInput
from prefill.machine.weights import cached_probe, check_weights, choose_weights

Q = ("Q4_1", "Q8_0")
FAST = {"native": 0.2e-3, "float32": 1.2e-3}


def choose(requested="auto", quantized=Q, dtype="float32", device="cpu", kernels=True, probe=FAST):
    return choose_weights(requested, quantized=quantized, dtype=dtype, device=device, kernels=kernels, probe=probe)


def test_auto_takes_the_blocks_when_the_probe_finds_them_faster():
    c = choose()
    assert c.dtype == "native" and c.warning is None
    assert c.reason == "weights auto: native Q4_1/Q8_0 blocks (a decode GEMM 0.20 ms native vs 1.20 ms float32)"


def test_auto_stays_dense_where_the_blocks_cannot_run_or_lose():
    assert choose(probe={"native": 2e-3, "float32": 1e-3}).dtype == "float32"
    assert choose(quantized=()).dtype == "float32"  # an F32 GGUF or an HF folder
    c = choose(dtype="bfloat16")
    assert c.dtype == "bfloat16" and "float32 activations" in c.reason
    assert choose(device="cuda").dtype == "float32"
    c = choose(kernels=False)
    assert c.dtype == "float32" and "no C++ compiler" in c.reason


def test_explicit_choices():
    assert choose("bf16").dtype == "bfloat16"
    assert choose("float32", quantized=()).dtype == "float32"
    assert choose("native").dtype == "native"
    slow = choose("native", kernels=False)
    assert slow.dtype == "native" and "portable path is slow" in slow.warning
    for bad in ({"quantized": ()}, {"dtype": "bfloat16"}, {"device": "cuda"}):
        with pytest.raises(BadInput, match="--weights native: "):
            choose("native", **bad)
    with pytest.raises(BadInput, match="--weights must be one of auto, native, float32, bfloat16, float16"):
        check_weights("int4")


def test_the_probe_runs_once_per_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    calls = []

    def measure():
        calls.append(1)
        return dict(FAST)

    assert cached_probe(measure) == FAST
    assert cached_probe(measure) == FAST
    assert len(calls) == 1 and (tmp_path / "weights.json").is_file()
    cached_probe(measure, refresh=True)
    assert len(calls) == 2
