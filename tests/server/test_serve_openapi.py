"""schemathesis `--checks all` against the running server's /openapi.json, with an API key, bounded (fixed seed,
few examples per operation, the real model name pinned by the document itself, max_tokens at most 2, a 16 KiB
body limit so that 413 is met on every route that takes a body, a response-time limit of its own): zero 5xx,
zero hangs, zero responses that contradict the document, no schema-valid request refused and no invalid one
accepted, 401 without the key. The server alone: the lesson's routes are the lesson's to check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = pytest.mark.slow
KEY = "sk-schemathesis"
# The slowest case is a prompt that fills the body limit (a 13.8 KB body: 2,217 tokens, tools described in the
# system turn) took 15.5 s alone on 2 cores shared with other test runs (chunks of 64), more under load. The limit
# flags a hang or a runaway generation, not speed. (A smaller body limit would not do: schemathesis counts a 413
# neither as accepting a valid body nor as refusing an invalid one.)
MAX_RESPONSE_S = 90


def test_schemathesis_finds_nothing(smollm_native, tmp_path):
    engine = smollm_native  # what is checked is the server, not the weights: a forward in a third of the time
    cfg = ServeConfig(
        model_id_of(engine),
        max_tokens_limit=2,
        chunk_size=256,
        max_body_bytes=16 * 1024,
        kv_cache_mb=256,
        api_key=KEY,
        allowed_hosts=("127.0.0.1",),
    )
    st = Path(sys.executable).parent / "st"
    with BackgroundServer(create_app(engine, cfg)) as url:
        cmd = [
            str(st),
            "run",
            f"{url}/openapi.json",
            "--checks",
            "all",
            "--max-response-time",
            str(MAX_RESPONSE_S),
            "--header",
            f"Authorization: Bearer {KEY}",
            "--max-examples",
            "12",
            "--seed",
            "13",
            "--request-timeout",
            str(MAX_RESPONSE_S + 30),
            "--workers",
            "1",
            "--report-dir",
            str(tmp_path),
        ]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)  # its cache goes there
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "FAILURES" not in run.stdout and " passed" in run.stdout, run.stdout[-6000:]
