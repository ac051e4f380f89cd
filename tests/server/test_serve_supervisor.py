"""The supervisor's verdicts on a stand-in scheduler: alive, dead, stuck only while busy, and fatal once."""

from __future__ import annotations

import time

from prefill.server.supervisor import Supervisor


class FakeScheduler:
    def __init__(self) -> None:
        self.running, self.last_step_at, self.died = True, time.monotonic(), None

    def alive(self) -> bool:
        return self.running


def make(busy: bool = False):
    reports: list[str] = []
    sched = FakeScheduler()
    return Supervisor(sched, lambda: busy, stuck_after_s=10.0, every_s=0.1, on_fatal=reports.append), sched, reports


def test_a_live_worker_is_fine_and_a_dead_one_is_fatal_once():
    sup, sched, reports = make()
    sup.check()
    assert sup.problem() is None and reports == []
    sched.running = False
    sup.check()
    sup.check()
    assert reports == ["the scheduler's worker thread is not running"] and sup.problem() == reports[0]


def test_stuck_means_busy_without_progress():
    idle, sched, reports = make(busy=False)
    sched.last_step_at -= 60  # waiting for work is not being stuck
    idle.check()
    assert reports == []
    busy, sched, reports = make(busy=True)
    busy.check()
    assert reports == []
    sched.last_step_at -= 60
    busy.check()
    assert len(reports) == 1 and "no progress for 60 s" in reports[0]


def test_shutdown_refuses_without_declaring_the_worker_dead():
    sup, sched, reports = make()
    sup.refuse("the server is shutting down")
    sched.running = False  # the worker stops as part of the shutdown
    sup.check()
    assert reports == [] and sup.problem() == "the server is shutting down"
