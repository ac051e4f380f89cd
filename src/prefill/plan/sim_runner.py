"""The simulated runner: the ModelRunner's part the step loop uses, its forwards timed by a step-time model on a
simulated clock. prefill.plan.simulate drives the real StepLoop and Scheduler over it; prefill.plan.loop_overhead
times the loop's own work over it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from prefill.costmodel.ops import Row
from prefill.costmodel.specs import ModelSpec
from prefill.engine.kvcache import SeqKV
from prefill.errors import BadInput

StepSeconds = Callable[[list[Row]], float]  # one forward's predicted seconds


class SimClock:
    """Simulated seconds: read by the loop and the requests, moved by the runner."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SimRunner:
    """The ModelRunner's part the step loop uses (spec, run, sync), timed by `step_seconds` on the clock. Without
    a `model` (the simulator) run() advances every seq by its new tokens, as a forward does, and returns logits
    that make greedy sampling pick token 1 (the trace, not the text, decides every request's length); with one
    (a ModelRunner: the test that the simulated schedule is the real one) the real forward runs."""

    VOCAB = 2  # logits [R, 2]: token 1 wins

    def __init__(self, spec: ModelSpec, step_seconds: StepSeconds, clock: SimClock, model=None, logits=None) -> None:
        self.spec, self.step_seconds, self.clock, self.model_runner = spec, step_seconds, clock, model
        self.logits = logits  # a tensor [R_max, vocab] to return (its first R rows) instead of the 2-token ones
        self.steps: list[list[tuple[int, int]]] = []  # each forward's rows: (new tokens, past)
        self.owed_s = 0.0  # the next step runs this much longer (requests that arrived during the last one)
        self.first_of_shape = False  # a simulated step is never cold
        self._token_1 = torch.tensor([[0.0, 1.0]])  # [1, 2]: every row's logits when no model runs

    def run(self, rows: list[tuple[SeqKV, list[int]]], output: str = "last") -> torch.Tensor:
        if output != "last":
            raise BadInput("the simulator predicts generation steps only (no scoring)")
        shape = [(len(ids), seq.length) for seq, ids in rows]
        self.clock.now += self.step_seconds([Row(new, past) for new, past in shape]) + self.owed_s
        self.owed_s = 0.0
        self.steps.append(shape)
        if self.model_runner is not None:
            return self.model_runner.run(rows, output)  # [R, vocab]
        for seq, ids in rows:  # the scheduler reserved their blocks (Scheduler._grow)
            seq.length += len(ids)
            seq.trim()
        if self.logits is not None:
            return self.logits[: len(rows)]  # [R, vocab]
        return self._token_1.expand(len(rows), self.VOCAB)  # [R, 2]

    def sync(self) -> None:
        pass
