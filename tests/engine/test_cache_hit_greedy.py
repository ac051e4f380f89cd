"""Answers that do not depend on the batch or the cache: on every path `auto` can pick (prefill.machine.paths.PATHS
with each K/V dtype --kv-dtype auto may store), under every instruction set the kernels run here, a request at
temperature 0 gets the same greedy text alone, batched beside another, and again as a prefix-cache hit.
The prompts: 356-token stretches of the seed lessons, the interactive lesson's among them (issue 51: on an
AVX-512 Xeon its prefix hit changed the text at token 9 with 8-bit activations and float16 K/V): a cold run
prefills them in three chunks, the last one partial, and a hit in one. Each path treats each row alone and sums
in one order whatever the rows beside it, and every query reads K/V as the pool stores them, so a row's logits
are the same in any company."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefill.device.capability import capability
from prefill.engine.loop import StepLoop
from prefill.engine.prefix_cache import RadixPrefixCache
from prefill.engine.request import Generation, Request
from prefill.engine.sampling import SamplingParams
from prefill.machine.paths import KV_AUTO, NATIVE, PATHS, path_blocker
from prefill.model.quant import ops, set_activations

SEEDS = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"  # shared/ beside the checkout, as CI lays it
CHUNK, NEW_TOKENS = 128, 24  # half the server's default chunk (the same kernels, half the suite's time)
PROMPT_TOKENS = 2 * CHUNK + 100  # two whole chunks and a partial one, so chunk and block boundaries differ
# The kernels' vector instruction sets (ops.set_isa), best first. The scalar kernels take minutes a case on
# these prompts; tests/model/test_quant.py checks them against both of these on every block type.
ISAS = ("avx512", "avx2")
# Every path auto can take (ServingPath.auto: 8-bit activations and dense bfloat16 only where asked, their text
# changing when batched or on a hit), with each K/V dtype auto may store.
CASES = [(p, kv) for p in PATHS if p.auto for kv in (KV_AUTO if p.dtype == "float32" else (p.dtype,))]
PARAMS = [
    pytest.param(
        p, kv, isa, id=f"{p.weights}-{p.activations if p.weights == NATIVE else p.dtype}-{kv}-{isa or 'torch'}"
    )
    for p, kv in CASES
    for isa in (ISAS if p.weights == NATIVE else (None,))  # dense weights run torch's GEMMs, not the kernels
]


def seed_prompts(tokenizer) -> list[list[int]]:
    """The first PROMPT_TOKENS-token stretch of each seed lesson (the interactive one's is the prompt that flipped)."""
    prompts = []
    for name in ("prefill-lesson.txt", "prefill-interactive-lesson.txt"):
        prompts.append(tokenizer.encode((SEEDS / name).read_text())[:PROMPT_TOKENS])
    return prompts


def greedy(loop: StepLoop, engine, prompts: list[list[int]], salt: str | None = None) -> list[Generation]:
    """The greedy generations of `prompts`, all added to `loop` at once (batched when more than one)."""
    events: list = []
    reqs = [
        Request(
            list(ids), NEW_TOKENS, SamplingParams(), engine.tokenizer, events.append, ignore_eos=True, cache_salt=salt
        )
        for ids in prompts
    ]
    for req in reqs:
        loop.add(req)
    while not all(req.done for req in reqs):
        loop.step()
    return [req.gen for req in reqs]


@pytest.fixture(scope="module")
def engines(smollm, smollm_native):
    """Each path's engine: the session's native and dense float32 ones (another path is loaded on first need)."""
    from prefill.engine.llm import Engine

    made = {(NATIVE, "float32"): smollm_native, ("float32", "float32"): smollm}

    def get(weights: str, dtype: str):
        if (weights, dtype) not in made:
            made[weights, dtype] = Engine.load(None, dtype=dtype, weights=weights, progress=False)
        return made[weights, dtype]

    return get


@pytest.mark.slow
@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seed lessons are not on this machine")
@pytest.mark.parametrize("path,kv,isa", PARAMS)
def test_greedy_text_is_the_same_alone_batched_and_after_a_prefix_hit(engines, path, kv, isa):
    from prefill.engine.weights import quantized_types

    if blocker := path_blocker(path, quantized_types(None), capability("cpu"), ops.available()):
        pytest.skip(blocker)
    if isa is not None and isa not in ISAS[ISAS.index(ops.set_isa("auto")) :]:
        pytest.skip(f"the kernels' {isa} path needs an instruction set this CPU lacks")
    engine = engines(path.weights, path.dtype)
    if path.weights == NATIVE:
        set_activations(engine.model, path.activations)
        ops.set_isa(isa)
    try:
        check(engine, kv)
    finally:
        if path.weights == NATIVE:
            set_activations(engine.model, "f32")
            ops.set_isa("auto")


def check(engine, kv: str) -> None:
    prompts = seed_prompts(engine.tokenizer)
    pool = engine.new_pool(4 * (PROMPT_TOKENS + NEW_TOKENS), kv)
    loop = StepLoop(engine.runner, pool, RadixPrefixCache(pool, pool.allocated_bytes()), chunk_size=CHUNK)
    alone = []
    for ids in prompts:
        (cold,) = greedy(loop, engine, [ids])
        (hit,) = greedy(loop, engine, [ids])
        assert cold.cached_tokens == 0 and hit.cached_tokens >= PROMPT_TOKENS - pool.block_size  # a real hit
        assert hit.token_ids == cold.token_ids, f"prefix hit: {engine.tokenizer.decode(ids[:20])}"
        alone.append(cold.token_ids)
    batched = greedy(loop, engine, prompts, salt="batched")  # both cold again (another salt), side by side
    for gen, text, ids in zip(batched, alone, prompts, strict=True):
        assert gen.cached_tokens == 0 and gen.token_ids == text, f"batched: {engine.tokenizer.decode(ids[:20])}"
