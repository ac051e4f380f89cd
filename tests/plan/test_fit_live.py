"""The loop closed on this machine: `prefill loadtest --predict --hardware cpu` against a real server on loopback
(ours, `prefill serve`, and llama.cpp's `llama_cpp.server`, both on the embedded SmolLM2 GGUF), then `prefill
plan --fit` on the saved report refits the CPU profile's efficiencies. A handful of short requests each."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from prefill.cli.main import app
from prefill.loading.resolve import default_model_path
from prefill.plan.cpu_fit import CPU_BOUNDS, fit_cpu, saved_server
from prefill.plan.engine_fit import TOLERANCE, read_records

pytestmark = pytest.mark.slow
SRC = Path(__file__).resolve().parents[2] / "src"
LOAD = ["--requests", "6", "--concurrency", "2", "--prompt-len", "64:192", "--max-tokens", "6", "--ignore-eos"]
READY_S = 180.0  # a server's start: importing torch or llama.cpp and loading the model on a shared 2-core host


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def started(args: list[str], url: str, ready: str, log: Path):
    """The server process of `args` once GET url+ready answers; killed if it never does within READY_S. Its output
    goes to `log` (a pipe nobody reads fills up and stops a verbose server, as llama.cpp's is, mid-load)."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "PREFILL_ACTIVATIONS": "f32"}
    with log.open("w") as f:
        proc = subprocess.Popen(args, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + ready, timeout=2.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    stop(proc)
    pytest.fail(f"{args[:4]} did not answer {ready} within {READY_S:.0f} s: {log.read_text()[-2000:]}")


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ours(port: int) -> list[str]:
    """`prefill serve` on a named path (native blocks, float32 activations: PREFILL_ACTIVATIONS in started()):
    the fit is what is checked, and `auto` would first probe every path it weighs (four on an AVX-512 CPU,
    minutes on a busy one) within READY_S."""
    serve = ["serve", "--port", str(port), "--weights", "native", "--dtype", "float32"]
    return [sys.executable, "-c", "from prefill.cli.main import main; main()", *serve]


def llama_cpp(port: int) -> list[str]:
    gguf = str(default_model_path())
    return [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--port", str(port), "--n_threads", "2"]


def has_llama_cpp_server() -> bool:
    try:
        return all(importlib.util.find_spec(m) for m in ("llama_cpp", "sse_starlette", "starlette_context"))
    except ImportError:
        return False


def load_test(command, ready: str, out: Path, extra: tuple[str, ...] | list[str] = ()):
    """`prefill loadtest --predict` (on this CPU) of a short load against the server `command` starts."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = started(command(port), url, ready, out.with_suffix(".server.log"))
    try:
        return CliRunner().invoke(app, ["loadtest", "--url", url, *LOAD, "--out", str(out), "--predict", *extra])
    finally:
        stop(proc)


def test_a_measured_run_of_prefill_serve_refits_the_cpu_profile_closer(tmp_path, monkeypatch):
    """One probe of this machine serves as both of the load test's (before and after the load: their medians are
    test_loadtest's), so the test pays for one."""
    from prefill.plan.simulate import ServerModel

    probe, probed = ServerModel.probe, []

    def probe_once(self):
        if not probed:
            probed.append(probe(self))
        return probed[0]

    monkeypatch.setattr(ServerModel, "probe", probe_once)
    out = tmp_path / "loadtest.json"
    r = load_test(ours, "/health", out)
    assert len(probed) == 1
    assert r.exit_code == 0 and "measured vs predicted" in r.output, r.output

    fitted = CliRunner().invoke(app, ["plan", "--fit", str(out), "--hardware", "cpu"])
    assert fitted.exit_code == 0 and "gemm efficiency" in fitted.output, fitted.output
    records, config = read_records(out)
    fit = fit_cpu(saved_server(json.loads(out.read_text())), records, config["concurrency"])
    assert fit.converged, fit.describe()
    assert all(CPU_BOUNDS[0] <= v <= CPU_BOUNDS[1] and v == v for v in fit.after.values()), fit.describe()
    # the fit only accepts steps that lower the summed squared log-errors of mean TTFT and TPOT
    cost = [sum(math.log1p(e) ** 2 for e in es) for es in (fit.errors_before, fit.errors_after)]
    assert cost[1] < cost[0] or max(abs(e) for e in fit.errors_before) < TOLERANCE, fit.describe()
    assert re.search(r"stopped: (tolerance|no\s+descent)", fitted.output), fitted.output  # the console may wrap


@pytest.mark.skipif(not has_llama_cpp_server(), reason="llama_cpp.server needs pip install 'llama-cpp-python[server]'")
def test_llama_cpp_server_closes_the_loop_with_the_tokenizer_counting(tmp_path):
    """llama-cpp-python 0.3.36's server streams no usage (stream_options.include_usage) and ignores ignore_eos:
    without --tokenizer the load test measures it and --predict refuses in one line; with the model's tokenizer
    counting each request's tokens, --predict puts the CPU profile's prediction beside it and plan --fit refits
    that profile to it."""
    bare = tmp_path / "bare.json"
    r = load_test(llama_cpp, "/v1/models", bare)
    assert r.exit_code == 2 and "no token counts" in r.output and "Traceback" not in r.output, r.output
    assert len(json.loads(bare.read_text())["requests"]) == 6
    fitted = CliRunner().invoke(app, ["plan", "--fit", str(bare), "--hardware", "cpu"])
    assert fitted.exit_code == 2 and "--tokenizer MODEL" in fitted.output, fitted.output

    out = tmp_path / "loadtest.json"
    r = load_test(llama_cpp, "/v1/models", out, ["--tokenizer", str(default_model_path())])
    assert r.exit_code == 0 and "measured vs predicted" in r.output, r.output
    requests = json.loads(out.read_text())["requests"]
    assert all(q["counted"] and q["usage_prompt_tokens"] >= 64 and q["usage_completion_tokens"] >= 1 for q in requests)
    fitted = CliRunner().invoke(app, ["plan", "--fit", str(out), "--hardware", "cpu"])
    assert fitted.exit_code == 0 and "gemm efficiency" in fitted.output, fitted.output
