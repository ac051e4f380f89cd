import pytest
import torch

from prefill.attention import blocked_causal, causal_attention, sdpa_causal


def naive(q, k, v, start):
    """Softmax(QK^T / sqrt(d)) V with an explicit bottom-right causal mask, K/V repeated per query head."""
    B, H_q, P, d = q.shape
    G = H_q // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    scores = q @ k.transpose(-1, -2) / d**0.5  # [B, H_q, P, start + P]
    allowed = torch.arange(start + P)[None, :] <= torch.arange(start, start + P)[:, None]
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("P,start,block", [(1, 0, 4), (7, 0, 4), (16, 0, 4), (33, 0, 8), (5, 11, 4), (40, 9, 16)])
@pytest.mark.parametrize("H_q,H_kv", [(4, 4), (6, 2), (8, 1)])
def test_blocked_and_sdpa_equal_the_definition(P, start, block, H_q, H_kv):
    g = torch.Generator().manual_seed(P * 100 + start)
    q = torch.randn(2, H_q, P, 16, generator=g)
    k = torch.randn(2, H_kv, start + P, 16, generator=g)
    v = torch.randn(2, H_kv, start + P, 16, generator=g)
    ref = naive(q, k, v, start)
    assert blocked_causal(q, k, v, start, block).shape == (2, H_q, P, 16)
    assert torch.allclose(blocked_causal(q, k, v, start, block), ref, atol=1e-5)
    assert torch.allclose(sdpa_causal(q, k, v, start), ref, atol=1e-5)
    assert torch.allclose(causal_attention(q, k, v, start), ref, atol=1e-5)


def test_the_future_is_never_seen():
    # changing a later key/value must not change earlier outputs
    q, k, v = torch.randn(1, 2, 10, 8), torch.randn(1, 1, 10, 8), torch.randn(1, 1, 10, 8)
    out = blocked_causal(q, k, v, 0, block=4)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6:] += 5.0
    v2[:, :, 6:] -= 3.0
    out2 = blocked_causal(q, k2, v2, 0, block=4)
    assert torch.equal(out[:, :, :6], out2[:, :, :6])
    assert not torch.allclose(out[:, :, 6:], out2[:, :, 6:])


def test_bfloat16_within_bf16_rounding():
    q, k, v = (torch.randn(1, 9, 300, 64) for _ in range(3))
    k, v = k[:, :3], v[:, :3]
    ref = naive(q, k, v, 0)
    out = blocked_causal(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0).float()
    assert float((out - ref).abs().max()) < 0.05
