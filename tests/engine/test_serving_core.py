"""The serving core on the real embedded model: one forward per step whatever the mix, preemption under a small
pool, windowed layers holding only their window."""

import pytest
import torch

from loop_runs import run_requests
from prefill.engine.kvcache import KVPool
from prefill.engine.loop import StepLoop
from prefill.engine.proofs import rounding_tolerance
from prefill.engine.request import Generation, Request
from prefill.engine.sampling import SamplingParams

pytestmark = pytest.mark.slow

# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
TOPICS = ["rivers", "bridges", "owls", "tea", "clocks", "maps", "bees", "snow", "glass", "ink", "salt", "wool",
          "ferns", "bells", "kites", "moss"]
# fmt: on


def prompts(engine) -> list[list[int]]:
    return [engine.encode_prompt(f"Write one sentence about {t}.") for t in TOPICS]


def run_all(engine, loop: StepLoop, ids: list[list[int]], max_tokens: int) -> list[Generation]:
    return run_requests(loop, ids, max_tokens, engine.tokenizer, logprobs=2)


def agree(ours: Generation, ref: Generation, tol: float) -> bool:
    """Greedy tokens equal, except from a step where the reference's top-2 margin is below the tolerance."""
    for a, b, event in zip(ours.token_ids, ref.token_ids, ref.logprobs, strict=False):
        if a != b:
            (_, lp1), (_, lp2) = event.top_logprobs[:2]
            return lp1 - lp2 < tol
    return len(ours.token_ids) == len(ref.token_ids) or ours.finish_reason != ref.finish_reason


def test_eight_requests_through_a_pool_that_holds_three(smollm_native):
    smollm = smollm_native  # the scheduler's property, whatever the weights' storage; decode reads 4x fewer bytes
    ids, n = prompts(smollm)[:8], 20  # 20 tokens each: the growth past the pool is what preempts
    alone = [run_all(smollm, StepLoop(smollm.runner, smollm.new_pool(len(p) + n)), [p], n)[0] for p in ids]
    peak = max(len(p) for p in ids) + n - 1  # positions one request holds at its end
    pool = KVPool.for_tokens(smollm.spec, 3 * -(-peak // 16) * 16, smollm.dtype, smollm.device)
    assert pool.max_tokens() < 4 * peak  # three at their peak, not four; more are admitted (prompts are shorter)
    loop = StepLoop(smollm.runner, pool, max_running=8)
    together = run_all(smollm, loop, ids, n)
    assert loop.scheduler.preemptions > 0  # the pool could not hold them all: some were preempted and resumed
    tol = rounding_tolerance(30.0, smollm.spec, smollm.dtype)  # logits of this model stay below 30
    assert all(agree(t, a, tol) for t, a in zip(together, alone, strict=True))
    assert pool.used_blocks == 0


def test_one_forward_per_step_for_decode_rows_and_a_prefill_chunk(smollm, monkeypatch):
    loop = StepLoop(smollm.runner, smollm.new_pool(4096), chunk_size=64)
    calls = []
    real = smollm.runner.run
    monkeypatch.setattr(smollm.runner, "run", lambda rows, output="last": calls.append(len(rows)) or real(rows, output))
    ids = [p[:24] for p in prompts(smollm)[:2]]  # 48 tokens: both prompts fit one step's chunk of 64
    for p in ids:
        loop.add(Request(p, 20, SamplingParams(), smollm.tokenizer, lambda ev: None))
    loop.step()  # both prompts in one step
    long = smollm.encode_prompt(" ".join(["history"] * 150))  # 150+ tokens: three chunks of 64
    loop.add(Request(long, 4, SamplingParams(), smollm.tokenizer, lambda ev: None))
    steps = [loop.step() for _ in range(3)]
    assert calls == [2, 3, 3, 3]  # every step one forward: two decode rows and the long prompt's chunk
    assert [sorted(n for _, n in s.rows) for s in steps] == [[1, 1, 64], [1, 1, 64], [1, 1, len(long) - 128]]


def test_windowed_layers_hold_only_their_window_at_8192_tokens(tmp_path):
    """A Gemma-3-shaped model (windows of 64, shorter than the prompt): the physical KV bytes held after an
    8,192-token prefill equal the window-aware formula, far below full attention's."""
    from prefill.costmodel import costs
    from prefill.engine.llm import Engine
    from tiny_models import random_gemma3_engine

    engine = random_gemma3_engine(tmp_path, window=64, context=9000)
    ids = torch.randint(3, 300, (8192,), generator=torch.Generator().manual_seed(1)).tolist()
    _, cache = engine.prefill(ids, chunk_size=1024)
    spec = engine.spec
    held = costs.kv_cache_bytes_held(spec, 8192, 4)
    assert cache.nbytes() == cache.reserved_bytes() == held  # 8,192 is whole blocks at both ends
    assert held < costs.kv_cache_bytes(spec.L, spec.H_kv, spec.d_head, 8192, 4) / 2
    assert isinstance(engine, Engine)
