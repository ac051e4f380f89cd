"""`--weights` where the storage alone decides (auto with one path open, and the explicit choices): the pure
choice logic over faked files and devices (tests/machine/test_paths.py: auto over several paths)."""

from __future__ import annotations

import pytest

from prefill.errors import BadInput
from prefill.machine.weights import check_weights, choose_weights

Q = ("Q4_1", "Q8_0")


def choose(requested="auto", quantized=Q, dtype="float32", device="cpu", kernels=True):
    return choose_weights(requested, quantized=quantized, dtype=dtype, device=device, kernels=kernels)


def test_auto_takes_the_blocks_where_they_run():
    c = choose()
    assert c.dtype == "native" and c.warning is None
    assert c.reason == "weights auto: native Q4_1/Q8_0 blocks"


def test_auto_stays_dense_where_the_blocks_cannot_run():
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
