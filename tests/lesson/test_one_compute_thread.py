"""Every route computes with torch on the server's worker thread only. A torch op on any other thread (even a
3 x 3 `triu` on the event loop) can start a second OpenMP pool; with two pools libgomp manages more threads than
the cores and stops spinning between parallel regions, and every later forward waits on futexes (found on the
lesson page: after its attention heat map, a 3-token prefill took 61 ms instead of 37 ms, bfloat16 on 2 cores,
for as long as the server ran). libgomp's helper threads are the process's threads Python does not know of; a
route that starts a pool adds one."""

from __future__ import annotations

import os
import threading

import httpx
import pytest

from prefill.lesson import load
from prefill.plan.capacity import Workload

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts the process's threads in /proc"),
]

TEXT = "AI is fast"


def native_threads() -> set[int]:
    """The process's threads that are not Python threads: OpenMP's helpers (and any other native pool)."""
    python = {t.native_id for t in threading.enumerate()}
    return {int(t) for t in os.listdir("/proc/self/task")} - python


def completion(url: str, model: str, route: str = "completions", **extra) -> dict:
    prompt = {"messages": [{"role": "user", "content": TEXT}]} if route == "chat/completions" else {"prompt": TEXT}
    body = {"model": model, "max_tokens": 2, "temperature": 0, **prompt, **extra}
    r = httpx.post(f"{url}/v1/{route}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


# (method, path, query or body) of the page's and the API's routes that run model code or tensors
ROUTES = [
    ("POST", "/api/attention", {"text": TEXT, "chat": False, "layer": 3, "head": 1}),
    ("POST", "/api/attention", {"text": TEXT, "chat": True, "layer": 0, "head": 0}),
    ("GET", "/api/predict", {"P": 3, "prefill_s": 0.05, "n": 3, "itl": [0.04, 0.05]}),
    ("GET", "/api/tokens", {"text": TEXT, "chat": 1}),
    ("POST", "/tokenize", {"prompt": TEXT}),
    ("GET", "/api/load", {}),  # the simulator: the real scheduler on a pool of the meta device, off the worker
    ("GET", "/api/sweep/curve", {}),
    ("POST", "/api/sweep/measure", {"P": 4}),
    ("GET", "/api/compute-or-load", {}),
]


def test_no_route_starts_a_second_openmp_pool(url, smollm, monkeypatch):
    monkeypatch.setattr(load, "MIX", Workload(16, load.MIX.prompts, load.MIX.outputs, seed=0))  # threads, not sizes
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    completion(url, model)  # the worker's own pool, and everything made on first use
    httpx.get(f"{url}/api/tokens", params={"text": TEXT, "chat": 0}, timeout=60).raise_for_status()
    before = native_threads()
    for method, path, args in ROUTES:
        kw = {"json": args} if method == "POST" else {"params": args}
        r = httpx.request(method, f"{url}{path}", timeout=120, **kw)
        assert r.status_code == 200, (path, r.text)
        assert native_threads() <= before, f"{method} {path} started threads outside the worker"
    completion(url, model, logprobs=3, echo=True)
    completion(url, model, "chat/completions", response_format={"type": "json_object"})
    assert native_threads() <= before, "a completion with logprobs or a grammar started threads outside the worker"
