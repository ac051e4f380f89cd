"""The prefix cache: block matching, sharing by reference (no copy), LRU eviction of blocks no request holds,
and (slow) equality with a cold prefill on the real model."""

from __future__ import annotations

import pytest
import torch

from prefill.engine.kvcache import KVPool
from prefill.engine.prefix_cache import RadixPrefixCache
from prefill.engine.proofs import rounding_tolerance

L, H_KV, D_HEAD, BS = 2, 3, 4, 4
BLOCK_BYTES = 2 * L * H_KV * BS * D_HEAD * 4  # K and V of one float32 block: 2*2*3*4*4*4 = 768 bytes


def pool_of(n_blocks: int = 32) -> KVPool:
    return KVPool(L, H_KV, D_HEAD, n_blocks, torch.float32, "cpu", block_size=BS)


def filled(pool: KVPool, ids: list[int]):
    """A sequence holding len(ids) positions (contents do not matter to the tree)."""
    seq = pool.new_seq()
    seq.reserve(len(ids) + 4)
    seq.length = len(ids)
    return seq


def test_match_insert_share_without_copy():
    pool = pool_of()
    pc = RadixPrefixCache(pool, capacity_bytes=10 * BLOCK_BYTES)
    a = list(range(10))  # 2 full blocks (8 tokens) are shared; the 2-token tail is not
    seq_a = filled(pool, a)
    assert pc.insert_prefix(a, seq_a) == 8
    assert pc.nbytes == 2 * BLOCK_BYTES and pc.n_blocks == 2
    m = pc.match_prefix(a)
    assert m.n_tokens == 8 and m.blocks == tuple(seq_a.blocks[:2])  # the very same pool blocks
    assert [pool.managers[0].refs[b] for b in m.blocks] == [2, 2]  # the request and the tree
    assert pc.match_prefix([0, 1, 2, 3, 4, 5, 99, 7]).n_tokens == 4  # diverges in the second block
    assert pc.match_prefix([9, 1, 2, 3]).n_tokens == 0
    used = pool.used_blocks
    seq_b = pool.new_seq([m.blocks], m.n_tokens)  # a request reusing the prefix: no copy
    seq_b.reserve(12)  # and one new block
    assert pool.used_blocks == used + 1 and seq_b.blocks[:2] == list(m.blocks)
    seq_a.free()
    seq_b.free()
    assert pool.used_blocks == pc.n_blocks == 2  # what is left is exactly the tree's share


def test_a_salt_shares_prefixes_only_with_the_same_salt():
    """vLLM's cache_salt: the salt keys the first block, so no block of a salted prefix matches another salt's or
    an unsalted one, and the salted blocks are evicted like any others."""
    pool = pool_of()
    pc = RadixPrefixCache(pool, capacity_bytes=10 * BLOCK_BYTES)
    a = list(range(10))
    plain, salted = filled(pool, a), filled(pool, a)
    assert pc.insert_prefix(a, salted, salt="s1") == 8
    assert pc.match_prefix(a).n_tokens == 0 and pc.match_prefix(a, "s2").n_tokens == 0
    assert pc.match_prefix(a, "s1").blocks == tuple(salted.blocks[:2])
    assert pc.insert_prefix(a, plain) == 8  # the same tokens unsalted: blocks of their own
    assert pc.match_prefix(a).blocks == tuple(plain.blocks[:2]) and pc.n_blocks == 4
    plain.free()
    salted.free()
    assert pc.evict(10) == 4 and pc.n_blocks == 0 and pool.used_blocks == 0


def test_lru_eviction_keeps_the_bound_and_spares_held_blocks():
    pool = pool_of()
    pc = RadixPrefixCache(pool, capacity_bytes=3 * BLOCK_BYTES)
    first, second = [1] * 8, [2] * 8  # two independent 2-block prefixes
    s1 = filled(pool, first)
    pc.insert_prefix(first, s1)
    s1.free()
    s2 = filled(pool, second)
    pc.insert_prefix(second, s2)  # a 4th block would pass the bound: first's tail (oldest, unheld) goes
    assert pc.n_blocks == 3 and pc.nbytes == 3 * BLOCK_BYTES
    assert pc.match_prefix(first).n_tokens == 4
    assert pc.match_prefix(second).n_tokens == 8
    assert pc.evict(10) == 1  # second's blocks are still held by s2: only first's remaining block can go
    s2.free()
    assert pc.evict(10) == 2 and pc.n_blocks == 0 and pool.used_blocks == 0


def test_disabled_cache_stores_nothing():
    pool = pool_of()
    pc = RadixPrefixCache(pool, capacity_bytes=0)
    ids = list(range(12))
    assert pc.insert_prefix(ids, filled(pool, ids)) == 0
    assert pc.match_prefix(ids).n_tokens == 0 and pc.nbytes == 0


@pytest.mark.slow
def test_prefix_cache_equals_cold_prefill(smollm):
    engine = smollm
    tok = engine.tokenizer
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and exactly." for i in range(12))

    def ids_of(question: str) -> list[int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return tok.encode(tok.render_chat(messages))

    first, second = ids_of("What is the capital of France?"), ids_of("Name a prime number above 10.")
    pool = engine.new_pool(4 * (len(first) + len(second)))
    pc = RadixPrefixCache(pool, capacity_bytes=64 * 1024 * 1024)
    with torch.inference_mode():
        _, cache = engine.prefill(first, pool.new_seq())
        pc.insert_prefix(first, cache)
        cold_logits, cold = engine.prefill(second)  # [1, vocab]
        match = pc.match_prefix(second[:-1])
        assert match.n_tokens >= 64  # the system prompt is shared
        warm = pool.new_seq([match.blocks], match.n_tokens)
        warm_logits, warm = engine.prefill(second[match.n_tokens :], warm)
    assert warm.blocks[: len(match.blocks)] == cache.blocks[: len(match.blocks)]  # shared, not copied
    tol = rounding_tolerance(float(cold_logits.abs().max()), engine.spec, engine.dtype)
    assert (warm_logits - cold_logits).abs().max().item() <= tol
    kv_tol = rounding_tolerance(
        max(float(cold.k(i).abs().max()) for i in range(engine.spec.L)), engine.spec, engine.dtype
    )
    for layer in range(engine.spec.L):
        assert (warm.k(layer) - cold.k(layer)).abs().max().item() <= kv_tol
        assert (warm.v(layer) - cold.v(layer)).abs().max().item() <= kv_tol
