"""`prefill serve` as a real process: SIGTERM and SIGINT stop it within a bounded time; the stream in flight gets
a final error event and the queued request a 503."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from prefill.server.server import free_port

pytestmark = pytest.mark.slow
STOP_WITHIN_S = 20  # uvicorn's graceful window is 5 s; the rest is the worker finishing its current forward


def wait_healthy(proc, url: str, log) -> None:
    for _ in range(600):  # bounded: 120 s for the model to load
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_serve_in_bounded_time(sig, tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below; a pipe nobody reads could block the server
    serve = ["serve", "--port", str(port), "--max-running", "1", "--threads", "1", "--kv-cache-mb", "256"]
    cmd = [sys.executable, "-c", "from prefill.cli.main import main; main()", *serve]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, tmp_path / "serve.log")
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        lines, started = [], threading.Event()

        def stream() -> None:
            body = {"model": model, "prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        if len(lines) >= 3:
                            started.set()

        queued: dict = {}

        def waiting() -> None:  # --max-running 1: this one waits behind the stream
            body = {"model": model, "prompt": "Hi", "max_tokens": 5}
            queued["r"] = httpx.post(f"{url}/v1/completions", json=body, timeout=60)

        threads = [threading.Thread(target=stream)]
        threads[0].start()
        assert started.wait(60)
        threads.append(threading.Thread(target=waiting))
        threads[1].start()
        time.sleep(0.5)  # the second request reaches the queue (not a timing assertion)
        proc.send_signal(sig)
        t0 = time.monotonic()
        code = proc.wait(timeout=STOP_WITHIN_S)
        # uvicorn re-raises the signal it caught once it has shut down: the status says "ended by that signal"
        assert time.monotonic() - t0 < STOP_WITHIN_S and code in (0, -sig, 128 + sig)
        for t in threads:
            t.join(10)
        assert lines[-1] == "[DONE]" and json.loads(lines[-2])["error"]["code"] == "http_503"
        assert len(lines) < 1000  # ended early, not at max_tokens
        assert queued["r"].status_code == 503 and queued["r"].json()["error"]["code"] == "unavailable"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
