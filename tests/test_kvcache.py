import pytest
import torch

from prefill.costs import kv_cache_bytes
from prefill.errors import BadInput
from prefill.kvcache import KVCache


def make(L=3, B=2, H_kv=4, S=16, d=8, dtype=torch.float32):
    return KVCache(L, B, H_kv, S, d, dtype, "cpu")


def test_preallocated_shape_per_layer():
    c = make()
    assert len(c.k) == len(c.v) == 3
    assert c.k[0].shape == (2, 4, 16, 8)
    assert c.allocated_bytes() == kv_cache_bytes(3, 4, 8, 16, 4, B=2)


@pytest.mark.parametrize("dtype,b", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_bytes_held_equal_formula(dtype, b):
    c = make(dtype=dtype)
    for layer in range(3):
        c.write(layer, 0, torch.ones(2, 4, 5, 8, dtype=dtype), torch.ones(2, 4, 5, 8, dtype=dtype))
    c.length = 5
    assert c.nbytes() == kv_cache_bytes(3, 4, 8, 5, b, B=2) == 2 * 3 * 2 * 4 * 5 * 8 * b
    assert c.shape() == (2, 4, 5, 8)


def test_write_returns_filled_prefix_and_appends():
    c = make(L=1, B=1, H_kv=1, S=4, d=2)
    k0, v0 = c.write(0, 0, torch.full((1, 1, 2, 2), 1.0), torch.full((1, 1, 2, 2), 2.0))
    assert k0.shape == (1, 1, 2, 2)
    k1, v1 = c.write(0, 2, torch.full((1, 1, 1, 2), 3.0), torch.full((1, 1, 1, 2), 4.0))
    assert k1.shape == (1, 1, 3, 2)
    assert k1[0, 0, :, 0].tolist() == [1.0, 1.0, 3.0]
    assert v1[0, 0, :, 0].tolist() == [2.0, 2.0, 4.0]


def test_overflow_and_bad_truncate_are_refused():
    c = make(L=1, S=4)
    with pytest.raises(BadInput, match="holds 4 tokens"):
        c.write(0, 3, torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8))
    with pytest.raises(BadInput):
        c.truncate(1)  # nothing filled yet


def test_copy_prefix_from():
    src, dst = make(L=2, S=8), make(L=2, S=8)
    for layer in range(2):
        src.write(layer, 0, torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8))
    src.length = 6
    dst.copy_prefix_from(src, 4)
    assert dst.length == 4
    assert torch.equal(dst.k[1][:, :, :4], src.k[1][:, :, :4])
    assert torch.equal(dst.v[0][:, :, :4], src.v[0][:, :, :4])
    assert dst.k[1][:, :, 4:].abs().sum() == 0
