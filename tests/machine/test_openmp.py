"""Releasing a thread's OpenMP pool: the helper threads its parallel regions started end, and the pool comes back
when the thread computes again."""

import os
import threading

import pytest
import torch

from prefill.machine import openmp


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or openmp._libgomp() is None, reason="needs Linux + libgomp")
def test_a_thread_that_releases_its_pool_leaves_no_helper_threads():
    seen: dict[str, int] = {}
    go, done = threading.Event(), threading.Event()
    a, b = torch.randn(512, 512), torch.randn(512, 512)

    def side():
        before = torch.get_num_threads()
        torch.set_num_threads(2)  # one helper thread at least, whatever the machine's default
        try:
            ref = a @ b  # a parallel region: this thread's pool is made
            seen["with_pool"] = tasks()
            seen["released"] = openmp.release_thread_pool()
            seen["without"] = tasks()
            assert torch.equal(a @ b, ref)  # computes again (a new pool), with the same result
            seen["again"] = tasks()
            openmp.release_thread_pool()
        finally:
            torch.set_num_threads(before)
        done.set()
        go.wait()

    t = threading.Thread(target=side)
    t.start()
    done.wait(60)
    go.set()
    t.join()
    assert seen["released"] is True
    assert seen["without"] == seen["with_pool"] - 1  # its one helper thread ended
    assert seen["again"] == seen["with_pool"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or openmp._libgomp() is None, reason="needs Linux + libgomp")
def test_a_background_server_takes_its_callers_pool_away():
    """The thread that starts an in-process server hands its model to the server's worker: its helper threads
    end (left beside the worker's, they made every forward of the tests' servers 1.5x slower on 2 cores)."""
    from fastapi import FastAPI

    from prefill.server.server import BackgroundServer

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(512, 512)
        _ = a @ a  # this thread's pool, with one helper at least
        with_pool = tasks()
        with BackgroundServer(FastAPI()):
            assert tasks() == with_pool  # its helper gone, the server's thread come
    finally:
        torch.set_num_threads(before)
