"""b of the KV formulas follows the K/V dtype, in one place (costs.kv_bytes_per_element): float32 4, 16-bit 2,
q8_0 34 / 32 (llama.cpp's block_q8_0: a float16 scale and 32 int8s); the time model's K/V bytes read per decode
step follow it."""

import pytest

from prefill.costmodel import costs
from prefill.costmodel.ops import Row, forward_ops
from prefill.costmodel.specs import PRESETS
from prefill.costmodel.timemodel import layout_for
from prefill.errors import BadInput


@pytest.mark.parametrize("name, b", [("float32", 4), ("bf16", 2), ("fp16", 2), ("q8_0", 34 / 32), ("Q8_0", 1.0625)])
def test_bytes_per_kv_value(name, b):
    assert costs.kv_bytes_per_element(name) == b


def test_q8_0_kv_of_smollm2_at_4096_tokens_is_17_16ths_of_a_byte_per_value():
    spec = PRESETS["smollm2-135m"]  # L 30, H_kv 3, d_head 64
    values = 2 * 30 * 3 * 4096 * 64  # K and V of every layer
    assert costs.kv_cache_bytes_for(spec, 4096, costs.kv_bytes_per_element("q8_0")) == values * 17 // 16
    assert costs.kv_cache_bytes_for(spec, 4096, costs.kv_bytes_per_element("bfloat16")) == values * 2


@pytest.mark.parametrize("bad", ["int4", "q4_0", "fp8", ""])
def test_a_kv_dtype_the_pool_has_not_is_refused(bad):
    with pytest.raises(BadInput, match="K/V dtype"):
        costs.kv_dtype_name(bad)
    assert costs.kv_bytes_per_element("fp8") == 1  # a GPU engine's cache, in the calculator


@pytest.mark.parametrize("kv, b", [("float32", 4), ("bfloat16", 2), ("q8_0", 34 / 32)])
def test_a_decode_steps_kv_bytes_read_follow_the_kv_dtype(kv, b):
    spec, context = PRESETS["smollm2-135m"], 4095
    ops = forward_ops(spec, [Row(1, context)], layout_for("float32", "float32", gathers_kv=False, kv=kv))
    attention = next(o for o in ops if o.name == "attention")
    keys = context + 1  # the past and the new token's own K/V
    assert attention.pool_bytes * attention.count == pytest.approx(
        costs.kv_cache_bytes_for(spec, keys, b) * context / keys
    )
