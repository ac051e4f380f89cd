"""Answers that do not depend on the cache: on the paths `auto` takes (native GGUF blocks with float32 or 8-bit
activations, float32 K/V, or 8-bit activations with float16 K/V, which --kv-dtype auto stores for decode-heavy
workloads), a prompt sent again, now a prefix-cache hit, gets the greedy text of its cold run, for 1,000-token
prompts cut from the seed lessons (issue 42: on dense bfloat16 two of four such prompts changed their text on the
hit). Both activation paths treat each row alone (q8 rounds each row's 32-blocks by that row's own scale) and sum in
one order whatever the rows beside it, and every query reads K/V as the pool stores them, so the suffix's logits on
a hit are the cold run's."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefill.engine.loop import StepLoop
from prefill.engine.prefix_cache import RadixPrefixCache
from prefill.engine.request import Generation, Request
from prefill.engine.sampling import SamplingParams
from prefill.model.quant import ops, set_activations

SEEDS = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"  # shared/ beside the checkout, as CI lays it
PROMPT_TOKENS, NEW_TOKENS, CHUNK = 1000, 24, 256  # the server's default chunk: the hit's suffix is one chunk


def seed_prompts(tokenizer) -> list[list[int]]:
    """Every whole 1,000-token stretch of the seed lessons, in file order."""
    prompts = []
    for name in ("prefill-lesson.txt", "prefill-interactive-lesson.txt"):
        ids = tokenizer.encode((SEEDS / name).read_text())
        prompts += [ids[i : i + PROMPT_TOKENS] for i in range(0, len(ids) - PROMPT_TOKENS + 1, PROMPT_TOKENS)]
    return prompts


def greedy(loop: StepLoop, engine, ids: list[int]) -> Generation:
    events: list = []
    req = Request(list(ids), NEW_TOKENS, SamplingParams(), engine.tokenizer, events.append, ignore_eos=True)
    loop.add(req)
    while not req.done:
        loop.step()
    return next(e for e in events if isinstance(e, Generation))


@pytest.mark.slow
@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seed lessons are not on this machine")
@pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")
@pytest.mark.parametrize("activations,kv", [("f32", "float32"), ("q8", "float32"), ("q8", "float16")])
def test_a_prefix_cache_hit_gives_the_cold_runs_greedy_text(smollm_native, activations, kv):
    engine = smollm_native
    set_activations(engine.model, activations)
    try:
        check_hits(engine, kv)
    finally:
        set_activations(engine.model, "f32")


def check_hits(engine, kv: str) -> None:
    prompts = seed_prompts(engine.tokenizer)
    assert len(prompts) == 5  # 4 of prefill-lesson.txt (4,732 tokens), 1 of the interactive one (1,562)
    pool = engine.new_pool(4 * (PROMPT_TOKENS + NEW_TOKENS), kv)
    loop = StepLoop(engine.runner, pool, RadixPrefixCache(pool, pool.allocated_bytes()), chunk_size=CHUNK)
    for ids in prompts:
        cold = greedy(loop, engine, ids)
        hit = greedy(loop, engine, ids)
        assert cold.cached_tokens == 0 and hit.cached_tokens >= PROMPT_TOKENS - pool.block_size  # a real hit
        assert hit.token_ids == cold.token_ids, engine.tokenizer.decode(ids[:20])
