"""The warm prefill measurement: how many timed forwards follow the untimed one, within a budget."""

import pytest

from prefill.bench import warm


@pytest.mark.parametrize(
    "first_s,budget_s,n",
    [(0.01, 3.0, 3), (0.9, 3.0, 3), (1.1, 3.0, 2), (3.3, 3.0, 1), (60.0, 3.0, 1), (5.0, None, 3), (0.0, 3.0, 3)],
)
def test_timed_repeats_fit_the_budget_and_are_never_zero(first_s, budget_s, n):
    assert warm.timed_repeats(first_s, 3, budget_s) == n


def test_a_budget_cuts_the_timed_forwards_of_a_slow_prefill(monkeypatch):
    """An engine whose every forward takes 2 s (a fake clock): 3 timed forwards without a budget, 1 within 3 s."""
    clock = iter(range(0, 1000, 2))
    monkeypatch.setattr(warm.time, "perf_counter", lambda: next(clock))

    class Seq:
        def reserve(self, n):
            pass

        def free(self):
            pass

    class Engine:
        device, spec = "cpu", type("Spec", (), {"vocab_size": 100})

        def new_pool(self, n):
            return type("Pool", (), {"new_seq": lambda self: Seq()})()

        def forward(self, ids, seqs):
            pass

        def sync(self):
            pass

    assert warm.warm_prefill(Engine(), 8, 3) == warm.Warm(2, 3)
    assert warm.warm_prefill(Engine(), 8, 3, budget_s=3.0) == warm.Warm(2, 1)
