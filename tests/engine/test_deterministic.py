"""The batch-invariant mode (--deterministic) on the real embedded model: a request's logits are bitwise the
same alone, in batches of any size, at any chunk size and after a preemption; the default mode is not (which is
why it is a mode, and why the default proofs use a rounding tolerance)."""

import pytest

from loop_runs import run_requests
from prefill.engine import proofs
from prefill.engine.kvcache import BLOCK_SIZE, KVPool
from prefill.engine.loop import StepLoop
from prefill.engine.request import Generation
from prefill.model import kernels

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not kernels.available(), reason="C++ kernels not built")]

# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
QUESTIONS = ["What is the capital of France?", "Name three colours.", "Two plus two?",
             "Tell me a story about a dragon and a knight who became friends."]
# fmt: on


@pytest.fixture(scope="module")
def deterministic():
    from prefill.engine.llm import Engine

    return Engine.load(None, dtype="float32", progress=False, deterministic=True)


def test_logits_are_bitwise_the_same_alone_batched_and_chunked(deterministic):
    prompts = [deterministic.encode_prompt(q) for q in QUESTIONS]
    checks = proofs.batch_invariance(deterministic, prompts, new_tokens=3, chunks=(16, 17, 64))
    assert all(c.ok and c.measured == 0.0 for c in checks), checks


def test_the_default_mode_is_not_bitwise(smollm):
    prompts = [smollm.encode_prompt(q) for q in QUESTIONS[:2]]  # batches of 2 and chunks of 7: M differs
    checks = proofs.batch_invariance(smollm, prompts, new_tokens=2, chunks=(7,))
    assert any(c.measured > 0 for c in checks)  # the check can fail: MKL sums in another order for another M


def test_preempted_requests_resume_bitwise(deterministic):
    """Logprobs (from the logits) of 8 requests through a pool too small for all: equal to each alone, exactly."""
    prompts = [deterministic.encode_prompt(f"Write a line about {t}.") for t in ("owls", "tea", "snow", "ink")] * 2
    n = 14  # each request grows past a block boundary (36 prompt tokens: 3 blocks, 49 positions at the end: 4)

    def run(loop: StepLoop, batch) -> list[Generation]:
        return run_requests(loop, batch, n, deterministic.tokenizer, logprobs=1)

    once = {tuple(p): run(StepLoop(deterministic.runner, deterministic.new_pool(len(p) + n)), [p])[0] for p in prompts}
    alone = [once[tuple(p)] for p in prompts]  # each of the four prompts alone, run once
    B = BLOCK_SIZE  # tokens per block
    admitted = 3 * -(-max(map(len, prompts)) // B) + 1  # blocks: three prompts and one spare, not their growth
    pool = KVPool.for_tokens(deterministic.spec, admitted * B, deterministic.dtype, "cpu")
    loop = StepLoop(deterministic.runner, pool, chunk_size=16)
    together = run(loop, prompts)
    assert loop.scheduler.preemptions > 0
    for a, t in zip(alone, together, strict=True):
        assert a.token_ids == t.token_ids
        assert [e.logprob for e in a.logprobs] == [e.logprob for e in t.logprobs]
