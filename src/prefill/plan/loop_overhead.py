"""The step loop's own seconds per decode step beyond its forward, measured: scheduling, sampling R rows of the
vocabulary, accepting each token and detokenizing it. The simulator adds them to each step the time model
predicts (a forward is not all a server's step costs: on the Zen 3 about 1.6 ms of a 30 ms step of 4 rows).

    a, b = loop_overhead(spec, tokenizer)      # seconds per step of R rows: a + b R

Measured on the real StepLoop with a runner that computes nothing (prefill.plan.sim_runner.SimRunner returning
fixed random logits of the model's vocabulary), so every second timed is the loop's. A serving process adds its
own: HTTP and SSE, its event loop, and that thread taking a core from the compute's two (on the Zen 3, native
weights: 1.4 ms a step at one stream, benchmarks/server_overhead.py): `prefill loadtest --predict` times it on the
server itself before the load (prefill.loadtest.server_calibration).
"""

from __future__ import annotations

import statistics
import time

import torch

from prefill.costmodel.specs import ModelSpec

ROWS = (1, 8)  # the two batch sizes the line a + b R goes through
STEPS = 24  # decode steps timed at each
ROUNDS = 3  # of both, in turn: the fastest round's median counts (one of four loadtest runs once timed 10x b
# at 8 rows while something else held a core: 0.76 ms a row, 0.08 in every other)


def loop_overhead(spec: ModelSpec, tokenizer=None, rows: tuple[int, int] = ROWS, steps: int = STEPS):
    """(a, b) of the loop's seconds per decode step of R rows, a + b R, from the median step at each of `rows`
    in the fastest of ROUNDS rounds (both >= 0); `tokenizer`: the server's, detokenizing each token as it would
    (None: no text)."""
    r1, r2 = rows
    rounds = [
        (_median_step(spec, tokenizer, r1, steps), _median_step(spec, tokenizer, r2, steps)) for _ in range(ROUNDS)
    ]
    t1, t2 = min(t for t, _ in rounds), min(t for _, t in rounds)
    b = max(0.0, (t2 - t1) / (r2 - r1))
    return max(0.0, t1 - b * r1), b


def _median_step(spec: ModelSpec, tokenizer, R: int, steps: int) -> float:
    from prefill.engine.kvcache import KVPool
    from prefill.engine.loop import StepLoop
    from prefill.engine.request import Request
    from prefill.engine.sampling import SamplingParams
    from prefill.plan.sim_runner import SimClock, SimRunner

    logits = torch.randn(R, spec.vocab_size, generator=torch.Generator().manual_seed(0))  # [R, vocab]
    runner = SimRunner(spec, lambda rows: 0.0, SimClock(), logits=logits)
    loop = StepLoop(runner, KVPool.for_tokens(spec, R * (steps + 40), torch.float32, "meta"), None, 256, R)
    for r in range(R):
        ids = [1 + (7 * r + k) % (spec.vocab_size - 1) for k in range(4)]
        loop.add(Request(ids, steps + 2, SamplingParams(), tokenizer, lambda event: None, ignore_eos=True))
    loop.step()  # the prompts' prefill, and the first tokens
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        loop.step()
        times.append(time.perf_counter() - t)
    if [len(rows) for rows in runner.steps] != [R] * (steps + 1):
        raise RuntimeError(f"the loop did not decode {R} rows a step: {runner.steps[:3]}")
    return statistics.median(times)
