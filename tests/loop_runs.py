"""Run requests through a step loop to the end (shared by the serving-core tests)."""

from __future__ import annotations

from prefill.engine.loop import StepLoop
from prefill.engine.request import Generation, Request
from prefill.engine.sampling import SamplingParams


def run_requests(
    loop: StepLoop, prompts: list[list[int]], max_tokens: int, tokenizer, logprobs: int | None = None
) -> list[Generation]:
    """Add one greedy request per prompt, step until all are done; their Generations in order."""
    done: dict[int, Generation] = {}

    def keep(i: int):
        return lambda ev: done.__setitem__(i, ev) if isinstance(ev, Generation) else None

    for i, p in enumerate(prompts):
        loop.add(Request(p, max_tokens, SamplingParams(), tokenizer, keep(i), logprobs=logprobs))
    for _ in range(100 * (max_tokens + 1) * len(prompts)):  # bounded: every step makes progress
        if not loop.busy:
            break
        loop.step()
    assert not loop.busy
    return [done[i] for i in range(len(prompts))]
