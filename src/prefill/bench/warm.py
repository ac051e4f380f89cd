"""A warm prefill, timed the way every prediction is checked against one (benchmarks/predict.py, the lesson
page's P sweep): a fresh sequence per forward, its pool blocks reserved before the clock starts, one untimed
forward at this P first (its kernels and buffers), then the median of the timed ones; with a budget, fewer timed
ones where the untimed forward says they would take longer (a long forward varies little, and on the page a
student waits for each).

    seconds = warm_prefill_seconds(engine, P=256, repeats=3)
    warm = warm_prefill(engine, P=1024, repeats=3, budget_s=3.0)   # warm.seconds, warm.repeats
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from prefill.engine.kvcache import KVPool
    from prefill.engine.llm import Engine


def spread_ids(n: int, vocab: int, offset: int = 0) -> torch.Tensor:
    """[1, n] fixed token ids spread over the vocabulary (which tokens does not change a forward's cost)."""
    return torch.tensor([[(7919 * (i + offset) + 11) % vocab for i in range(n)]])


def timed(engine: Engine, fn: Callable[[], object]) -> float:
    """Seconds of fn(), the device synchronized before the clock is read."""
    t = time.perf_counter()
    fn()
    engine.sync()
    return time.perf_counter() - t


def timed_repeats(first_s: float, repeats: int, budget_s: float | None) -> int:
    """How many timed forwards follow an untimed one that took first_s seconds: `repeats`, or as many as fit in
    budget_s seconds (at least one)."""
    if budget_s is None or first_s <= 0:
        return repeats
    return max(1, min(repeats, int(budget_s / first_s)))


@dataclass(frozen=True)
class Warm:
    seconds: float  # the median of the timed forwards
    repeats: int  # how many were timed


def prefill_once(engine: Engine, P: int, pool: KVPool | None = None) -> Callable[[], float]:
    """A callable that times one prefill forward of P tokens, each call a fresh sequence of `pool` (default: a
    pool of its own, P + 32 positions) whose blocks are reserved before the clock starts."""
    ids = spread_ids(P, engine.spec.vocab_size).to(engine.device)  # [1, P]
    pool = pool if pool is not None else engine.new_pool(P + 32)

    def once() -> float:
        seq = pool.new_seq()
        seq.reserve(P + 1)
        try:
            return timed(engine, lambda: engine.forward(ids, [seq]))
        finally:
            seq.free()

    return once


def interleaved_medians(workloads: dict, rounds: int) -> dict:
    """The median seconds of each workload (key -> a callable returning its seconds) over `rounds` rounds that run
    every workload once in turn, after one untimed call of each: a machine whose speed drifts over minutes biases
    every workload alike instead of the ones measured last."""
    for once in workloads.values():
        once()
    times: dict = {key: [] for key in workloads}
    for _ in range(rounds):
        for key, once in workloads.items():
            times[key].append(once())
    return {key: statistics.median(t) for key, t in times.items()}


def warm_prefill(
    engine: Engine, P: int, repeats: int, pool: KVPool | None = None, budget_s: float | None = None
) -> Warm:
    """The median seconds of up to `repeats` prefill forwards of P tokens (timed_repeats: as many as fit in
    budget_s) after one untimed one, each a fresh sequence of `pool` (prefill_once)."""
    once = prefill_once(engine, P, pool)
    n = timed_repeats(once(), repeats, budget_s)
    return Warm(statistics.median(once() for _ in range(n)), n)


def warm_prefill_seconds(engine: Engine, P: int, repeats: int, pool: KVPool | None = None) -> float:
    """warm_prefill's seconds, with every one of the `repeats` forwards timed."""
    return warm_prefill(engine, P, repeats, pool).seconds
