"""The supervisor's verdicts on a stand-in worker: alive, dead, stuck only while busy, and fatal once."""

from __future__ import annotations

import time

from prefill.server.supervisor import Supervisor


class FakeWorker:
    def __init__(self) -> None:
        self.running, self.last_step_at, self.died = True, time.monotonic(), None

    def alive(self) -> bool:
        return self.running


def make(busy: bool = False):
    reports: list[str] = []
    worker = FakeWorker()
    return Supervisor(worker, lambda: busy, stuck_after_s=10.0, every_s=0.1, on_fatal=reports.append), worker, reports


def test_a_live_worker_is_fine_and_a_dead_one_is_fatal_once():
    sup, worker, reports = make()
    sup.check()
    assert sup.problem() is None and reports == []
    worker.running = False
    sup.check()
    sup.check()
    assert reports == ["the scheduler's worker thread is not running"] and sup.problem() == reports[0]


def test_stuck_means_busy_without_progress():
    idle, worker, reports = make(busy=False)
    worker.last_step_at -= 60  # waiting for work is not being stuck
    idle.check()
    assert reports == []
    busy, worker, reports = make(busy=True)
    busy.check()
    assert reports == []
    worker.last_step_at -= 60
    busy.check()
    assert len(reports) == 1 and "no progress for 60 s" in reports[0]


def test_shutdown_refuses_without_declaring_the_worker_dead():
    sup, worker, reports = make()
    sup.refuse("the server is shutting down")
    worker.running = False  # the worker stops as part of the shutdown
    sup.check()
    assert reports == [] and sup.problem() == "the server is shutting down"
