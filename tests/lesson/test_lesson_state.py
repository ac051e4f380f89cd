"""The lesson's state without a model: this machine's rates are measured once, through the worker."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

from prefill.lesson.state import MachineRates


def test_rates_are_measured_once_on_the_worker_and_again_after_a_failure():
    handed: list = []
    outcomes = [RuntimeError("the worker is not running"), (5e10, 1e10, "measured")]

    def on_worker(fn) -> Future:  # stands in for Worker.call: records what it was handed to run
        handed.append(fn)
        future: Future = Future()
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        return future

    rates = MachineRates(None, on_worker)

    async def ask(n: int) -> list:
        return await asyncio.gather(*(rates.get() for _ in range(n)), return_exceptions=True)

    first = asyncio.run(ask(1))
    assert isinstance(first[0], RuntimeError)
    assert asyncio.run(ask(3)) == [(5e10, 1e10, "measured")] * 3
    assert len(handed) == 2 and all(fn == rates._measure for fn in handed)  # the failure, then once
