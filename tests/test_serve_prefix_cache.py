"""The prefix cache: block matching, LRU eviction under a byte bound, and (slow) equality with a cold prefill
on the real model."""

from __future__ import annotations

import pytest
import torch

from prefill.kvcache import KVCache
from prefill.serve.prefix_cache import RadixPrefixCache

L, H_KV, D_HEAD, BS = 2, 3, 4, 4
BLOCK_BYTES = 2 * L * H_KV * BS * D_HEAD * 4  # K and V of one float32 block: 2*2*3*4*4*4 = 768 bytes


def filled_cache(ids: list[int]) -> KVCache:
    """A cache whose K/V at each position encode the position's token (so copies can be checked)."""
    c = KVCache(L, 1, H_KV, len(ids) + 4, D_HEAD, torch.float32, "cpu")
    for layer in range(L):
        for pos, t in enumerate(ids):
            c.k[layer][0, :, pos] = t + 1000 * layer
            c.v[layer][0, :, pos] = -t - 1000 * layer
    c.length = len(ids)
    return c


def test_match_insert_and_copy():
    pc = RadixPrefixCache(capacity_bytes=10 * BLOCK_BYTES, block_size=BS)
    a = list(range(10))  # 2 full blocks (8 tokens) are stored; the 2-token tail is not
    assert pc.insert_prefix(a, filled_cache(a)) == 8
    assert pc.nbytes == 2 * BLOCK_BYTES and pc.n_blocks == 2
    assert pc.match_prefix(a).n_tokens == 8
    assert pc.match_prefix([0, 1, 2, 3, 4, 5, 99, 7]).n_tokens == 4  # diverges in the second block
    assert pc.match_prefix([9, 1, 2, 3]).n_tokens == 0
    b = [0, 1, 2, 3, 50, 51, 52, 53, 54]  # shares the first block only
    assert pc.insert_prefix(b, filled_cache(b)) == 4
    assert pc.n_blocks == 3
    target = KVCache(L, 1, H_KV, 16, D_HEAD, torch.float32, "cpu")
    m = pc.match_prefix(b)
    m.copy_into(target)
    assert target.length == 8
    ref = filled_cache(b)
    for layer in range(L):
        assert torch.equal(target.k[layer][:, :, :8], ref.k[layer][:, :, :8])
        assert torch.equal(target.v[layer][:, :, :8], ref.v[layer][:, :, :8])


def test_lru_eviction_keeps_bytes_bounded():
    pc = RadixPrefixCache(capacity_bytes=3 * BLOCK_BYTES, block_size=BS)
    first, second = [1] * 8, [2] * 8  # two independent 2-block prefixes
    pc.insert_prefix(first, filled_cache(first))
    pc.insert_prefix(second, filled_cache(second))  # 4 blocks > 3: the least recently used leaf goes
    assert pc.nbytes == 3 * BLOCK_BYTES
    assert pc.match_prefix(first).n_tokens == 4  # first's second block was the oldest leaf
    assert pc.match_prefix(second).n_tokens == 8
    pc.match_prefix(first)  # first is now the most recent: next eviction takes second's tail
    third = [3] * 4
    pc.insert_prefix(third, filled_cache(third))
    assert pc.nbytes <= 3 * BLOCK_BYTES
    assert pc.match_prefix(first).n_tokens == 4 and pc.match_prefix(third).n_tokens == 4
    assert pc.match_prefix(second).n_tokens == 4
    freed = pc.evict(10**9)
    assert freed == 3 * BLOCK_BYTES and pc.nbytes == 0 and pc.n_blocks == 0


def test_disabled_cache_stores_nothing():
    pc = RadixPrefixCache(capacity_bytes=0, block_size=BS)
    ids = list(range(12))
    assert pc.insert_prefix(ids, filled_cache(ids)) == 0
    assert pc.match_prefix(ids).n_tokens == 0 and pc.nbytes == 0


@pytest.mark.slow
def test_prefix_cache_equals_cold_prefill():
    from prefill.engine import Engine

    engine = Engine.load(progress=False)
    tok = engine.tokenizer
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and exactly." for i in range(12))

    def ids_of(question: str) -> list[int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return tok.encode(tok.render_chat(messages))

    first, second = ids_of("What is the capital of France?"), ids_of("Name a prime number above 10.")
    pc = RadixPrefixCache(capacity_bytes=64 * 1024 * 1024, block_size=16)
    with torch.inference_mode():
        _, cache = engine.prefill(first)
        pc.insert_prefix(first, cache)
        cold_logits, cold = engine.prefill(second)  # [1, vocab]
        match = pc.match_prefix(second[:-1])
        assert match.n_tokens >= 64  # the system prompt is shared
        warm = engine.new_cache(len(second))
        match.copy_into(warm)
        warm_logits, warm = engine.prefill(second[match.n_tokens :], warm)
    assert (warm_logits - cold_logits).abs().max().item() <= 1e-4
    for layer in range(engine.spec.L):
        assert (warm.k[layer] - cold.k[layer]).abs().max().item() <= 1e-4
        assert (warm.v[layer] - cold.v[layer]).abs().max().item() <= 1e-4
