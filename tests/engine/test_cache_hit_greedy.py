"""Answers that do not depend on the cache: on the path `auto` takes on this kind of CPU (native GGUF blocks,
float32 activations and K/V; and with bfloat16 K/V, --kv-dtype bfloat16), a prompt sent again, now a prefix-cache
hit, gets the greedy text of its cold run, for 1,000-token prompts cut from the seed lessons (issue 42: on dense
bfloat16 two of four such prompts changed their text on the hit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefill.engine.loop import StepLoop
from prefill.engine.prefix_cache import RadixPrefixCache
from prefill.engine.request import Generation, Request
from prefill.engine.sampling import SamplingParams
from prefill.model.quant import ops

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
@pytest.mark.parametrize("kv", ["float32", "bfloat16"])  # --kv-dtype: every query reads K/V as the pool stores them
def test_a_prefix_cache_hit_gives_the_cold_runs_greedy_text(smollm_native, kv):
    engine = smollm_native
    prompts = seed_prompts(engine.tokenizer)
    assert len(prompts) == 5  # 4 of prefill-lesson.txt (4,732 tokens), 1 of the interactive one (1,562)
    pool = engine.new_pool(4 * (PROMPT_TOKENS + NEW_TOKENS), kv)
    loop = StepLoop(engine.runner, pool, RadixPrefixCache(pool, pool.allocated_bytes()), chunk_size=CHUNK)
    for ids in prompts:
        cold = greedy(loop, engine, ids)
        hit = greedy(loop, engine, ids)
        assert cold.cached_tokens == 0 and hit.cached_tokens >= PROMPT_TOKENS - pool.block_size  # a real hit
        assert hit.token_ids == cold.token_ids, engine.tokenizer.decode(ids[:20])
