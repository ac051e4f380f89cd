"""schemathesis `--checks all` over the lesson's JSON API (/api/*), mounted on the server as `prefill serve` mounts
it (add_lesson(create_app(...))), with an API key: zero 5xx, zero responses that contradict the document, no
schema-valid request refused and no invalid one accepted. The server's own operations are
tests/server/test_serve_openapi.py's.

Bounded to stay short: few examples per operation, a fixed seed, and the three operations that run the model or
the simulator made cheap (the sweep measures at most 16 tokens, the next-token view takes at most 200 characters,
the load mix is 16 requests; the document's bounds follow): what is checked is the API's contract, not the page's
figures."""

from __future__ import annotations

import pytest

from prefill.lesson import load, nexttoken, sweep
from prefill.lesson.routes import add_lesson
from prefill.plan.capacity import Workload
from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer
from schemathesis_run import run_schemathesis

pytestmark = pytest.mark.slow
KEY = "sk-schemathesis"
# The slowest operation is the first /api/load (the capacity and its curve: 14 simulations of the mix) or the first
# /api/predict (this machine's GEMM rate, measured once). The limit flags a hang, not speed.
MAX_RESPONSE_S = 60


def test_schemathesis_finds_nothing_in_the_lesson_api(smollm_native, tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "MEASURE_P", (1, 4, 16))  # the document's bound follows (sweep.document_measure)
    monkeypatch.setattr(nexttoken, "MAX_NEXT_TEXT", 200)  # the coverage phase sends the longest text allowed
    monkeypatch.setattr(load, "MIX", Workload(16, load.MIX.prompts, load.MIX.outputs, seed=0))
    engine = smollm_native
    cfg = ServeConfig(model_id_of(engine), chunk_size=256, kv_cache_mb=64, api_key=KEY, allowed_hosts=("127.0.0.1",))
    app = add_lesson(create_app(engine, cfg))
    doc = app.openapi()
    assert doc["components"]["schemas"]["NextTokenBody"]["properties"]["text"]["maxLength"] == 200  # it follows
    lesson_ops = sum(len(ops) for path, ops in doc["paths"].items() if path.startswith("/api/"))
    with BackgroundServer(app) as url:
        api = ("--include-path-regex", "^/api/")  # the lesson's operations: the server's are test_serve_openapi's
        run = run_schemathesis(url, KEY, tmp_path, max_response_s=MAX_RESPONSE_S, examples=8, extra=api)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "FAILURES" not in run.stdout and " passed" in run.stdout, run.stdout[-6000:]
    assert f"Selected: {lesson_ops}/" in run.stdout and f"Tested: {lesson_ops}\n" in run.stdout  # every /api one
