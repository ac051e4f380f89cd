import pytest
import torch

from prefill.model.attention import blocked_causal, causal_attention, sdpa_causal


def naive(q, k, v, start, window=None, scale=None):
    """Softmax(QK^T / sqrt(d)) V with an explicit bottom-right causal mask (and window), K/V repeated per query
    head; k, v hold the last S positions up to the last query."""
    B, H_q, P, d = q.shape
    G = H_q // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    scores = q @ k.transpose(-1, -2) * (scale or d**-0.5)  # [B, H_q, P, S]
    i = torch.arange(start, start + P)[:, None]  # query positions
    j = torch.arange(start + P - k.shape[2], start + P)[None, :]  # key positions
    allowed = (j <= i) & (j > i - window) if window else j <= i
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("P,start,block", [(1, 0, 4), (7, 0, 4), (16, 0, 4), (33, 0, 8), (5, 11, 4), (40, 9, 16)])
@pytest.mark.parametrize("H_q,H_kv", [(4, 4), (6, 2), (8, 1)])
def test_blocked_and_sdpa_equal_the_definition(P, start, block, H_q, H_kv):
    g = torch.Generator().manual_seed(P * 100 + start)
    q = torch.randn(2, H_q, P, 16, generator=g)
    k = torch.randn(2, H_kv, start + P, 16, generator=g)
    v = torch.randn(2, H_kv, start + P, 16, generator=g)
    ref = naive(q, k, v, start)
    assert blocked_causal(q, k, v, start, block=block).shape == (2, H_q, P, 16)
    assert torch.allclose(blocked_causal(q, k, v, start, block=block), ref, atol=1e-5)
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


@pytest.mark.parametrize(
    "P,start,window,held",
    [
        (20, 0, 5, None),
        (7, 13, 5, None),
        (1, 30, 8, None),
        (1, 3, 8, None),
        (33, 40, 16, None),
        (9, 0, 64, None),
        (6, 10, 4, 9),
        (1, 30, 8, 8),
        (12, 20, 8, 19),  # held: the cache keeps only the last `held` positions
        (1100, 0, 100, None),
        (700, 37, 600, None),
    ],  # long prompts: SDPA in bands of max(W, 512) queries
)
@pytest.mark.parametrize("H_q,H_kv", [(4, 4), (6, 2)])
def test_sliding_window_equals_the_definition(P, start, window, held, H_q, H_kv):
    g = torch.Generator().manual_seed(P * 100 + start + window)
    S = held or start + P
    q = torch.randn(1, H_q, P, 16, generator=g)
    k, v = torch.randn(1, H_kv, S, 16, generator=g), torch.randn(1, H_kv, S, 16, generator=g)
    ref = naive(q, k, v, start, window)
    for out in (
        sdpa_causal(q, k, v, start, window),
        blocked_causal(q, k, v, start, window, block=4),
        causal_attention(q, k, v, start, window),
    ):
        assert torch.allclose(out, ref, atol=1e-5)
    if window < start + P and held is None:  # the window bites: not the same as full attention
        assert not torch.allclose(ref, naive(q, k, v, start), atol=1e-3)


def test_keys_outside_the_window_are_never_seen():
    q, k, v = torch.randn(1, 2, 10, 8), torch.randn(1, 1, 10, 8), torch.randn(1, 1, 10, 8)
    out = causal_attention(q, k, v, 0, window=3)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :4] += 5.0  # positions 0..3: outside the window of queries 6..9 (which see 4..6 up to 7..9)
    v2[:, :, :4] -= 3.0
    assert torch.equal(causal_attention(q, k2, v2, 0, window=3)[:, :, 6:], out[:, :, 6:])
    assert not torch.allclose(causal_attention(q, k2, v2, 0, window=3)[:, :, :6], out[:, :, :6])


def test_attention_scale():
    q, k, v = torch.randn(1, 4, 12, 8) * 4, torch.randn(1, 2, 12, 8) * 4, torch.randn(1, 2, 12, 8)
    ref = naive(q, k, v, 0, window=5, scale=0.1)
    assert torch.allclose(causal_attention(q, k, v, 0, window=5, scale=0.1), ref, atol=1e-5)
    assert torch.allclose(blocked_causal(q, k, v, 0, 5, 0.1, block=4), ref, atol=1e-5)
    assert not torch.allclose(ref, naive(q, k, v, 0, window=5), atol=1e-3)  # the scale matters
