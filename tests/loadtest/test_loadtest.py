"""The load-test client: its arithmetic on hand-made timings, and its protocol handling against a scripted
SSE server written here (known delays, known chunk counts). The real check runs against our own server in
tests/test_serve.py."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace

import pytest
from fastapi import FastAPI

from prefill.errors import BadInput
from prefill.loading.resolve import default_model_path
from prefill.loadtest.client import LoadTestConfig, PromptLengths, RequestRecord, run_load_test, synthetic_prompt
from prefill.loadtest.report import plot, summarize, tpot, write_json
from prefill.server.server import BackgroundServer
from scripted_server import FIRST_S, N_CHUNKS, scripted_app


def test_summary_arithmetic_on_known_timings():
    # Request A: sent at 0, content chunks at 0.2, 0.25, 0.30, 0.35, 0.40 -> TTFT 0.2, E2E 0.4, n_out 5,
    # TPOT (0.4 - 0.2) / 4 = 0.05 (the lesson's worked request). Request B: TTFT 0.5, 3 tokens, E2E 0.9.
    a = RequestRecord(0, 10, 0.0, 0.2, [0.2, 0.25, 0.30, 0.35, 0.40], 0.4, 5, 5, 12)
    b = RequestRecord(1, 10, 1.0, 1.5, [1.5, 1.7, 1.9], 1.9, 3, None, None)
    c = RequestRecord(2, 10, 2.0, error="HTTP 500: boom")
    assert tpot(a) == pytest.approx(0.05)
    assert tpot(b) == pytest.approx(0.2)
    s = summarize([a, b, c], wall_s=2.0, slo_ttft_s=0.3, slo_tpot_s=0.1)
    assert (s["requests"], s["successful"], s["failed"]) == (3, 2, 1)
    assert s["output_tokens"] == 8
    assert s["throughput_req_per_s"] == pytest.approx(1.0)
    assert s["throughput_output_tok_per_s"] == pytest.approx(4.0)
    assert s["goodput_req_per_s"] == pytest.approx(0.5)  # only A meets both SLOs
    assert s["latency"]["ttft_s"]["mean"] == pytest.approx(0.35)
    assert s["latency"]["ttft_s"]["p50"] == pytest.approx(0.35)
    assert s["latency"]["e2e_s"]["p90"] == pytest.approx(0.4 + 0.9 * 0.5)
    assert s["latency"]["itl_s"]["n"] == 6  # 4 gaps in A, 2 in B
    assert s["latency"]["itl_s"]["mean"] == pytest.approx((4 * 0.05 + 2 * 0.2) / 6)
    assert s["errors"] == {"HTTP 500: boom": 1}
    assert "TTFT" in s["definitions"] and "n_out - 1" in s["definitions"]["TPOT"]


def test_prompt_lengths_parse(tmp_path):
    rng = random.Random(0)
    assert PromptLengths.parse("128").sample(rng) == 128
    u = PromptLengths.parse("10:20")
    assert all(10 <= u.sample(rng) <= 20 for _ in range(50))
    f = tmp_path / "lengths.txt"
    f.write_text("5\n7\n9\n")
    assert {PromptLengths.parse(f"@{f}").sample(rng) for _ in range(60)} == {5, 7, 9}
    for bad in ("0", "20:10", "abc", f"@{tmp_path / 'missing.txt'}"):
        with pytest.raises(BadInput):
            PromptLengths.parse(bad)
    assert len(synthetic_prompt(30, rng).split()) == 30


@pytest.mark.parametrize("chat,include_usage,rate", [(False, True, None), (True, False, None), (False, True, 50.0)])
def test_client_against_scripted_server(tmp_path, chat, include_usage, rate):
    with BackgroundServer(scripted_app()) as url:
        cfg = LoadTestConfig(
            url,
            chat=chat,
            concurrency=3,
            rate=rate,
            duration_s=30,
            max_requests=7,
            prompt_lengths=PromptLengths(4, 8),
            max_tokens=4,
            include_usage=include_usage,
        )
        records, wall, model = asyncio.run(run_load_test(cfg))
    assert model == "scripted"
    assert len(records) == 7 and all(r.ok for r in records), [r.error for r in records]
    for r in records:
        assert r.n_out == N_CHUNKS and r.n_chunks == N_CHUNKS
        assert r.first_content - r.start >= FIRST_S  # the empty chunk did not count as the first token
        assert len(r.chunk_times) == N_CHUNKS
        assert r.finish_reason == "length"
        assert r.cached_tokens == (3 if include_usage else None)
    s = summarize(records, wall, slo_ttft_s=60.0, slo_tpot_s=60.0)
    assert s["output_tokens"] == 7 * N_CHUNKS
    assert s["goodput_req_per_s"] == pytest.approx(s["throughput_req_per_s"])
    assert s["latency"]["itl_s"]["n"] == 7 * (N_CHUNKS - 1)
    write_json(tmp_path / "out.json", {"url": url}, s, records)
    assert json.loads((tmp_path / "out.json").read_text())["summary"]["successful"] == 7
    plot(tmp_path / "out.png", records, "scripted")
    assert (tmp_path / "out.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("chat", [False, True])
def test_a_tokenizer_counts_what_a_server_without_usage_did_not(chat):
    """The scripted server streams no usage: with cfg.tokenizer the client counts each request's tokens with the
    embedded model's tokenizer (the prompt as the server renders it, the output text re-tokenized), marked
    counted; where the server reports usage, its counts stand."""
    from prefill.loading.resolve import load_tokenizer

    tok = load_tokenizer(None)
    with BackgroundServer(scripted_app()) as url:
        base = {"chat": chat, "concurrency": 2, "max_requests": 3, "prompt_lengths": PromptLengths(5, 9)}
        cfg = LoadTestConfig(url, max_tokens=4, include_usage=False, tokenizer=str(default_model_path()), **base)
        records, _, _ = asyncio.run(run_load_test(cfg))
        served, _, _ = asyncio.run(run_load_test(replace(cfg, include_usage=True)))
    output = "".join(f"w{i} " for i in range(N_CHUNKS))
    rng = random.Random(cfg.seed)
    for r in records:
        prompt = synthetic_prompt(cfg.prompt_lengths.sample(rng), rng)  # the prompts the seed drew, in order
        as_sent = tok.render_chat([{"role": "user", "content": prompt}]) if chat else prompt
        assert r.ok and r.counted and r.n_out == len(tok.encode(output)) > N_CHUNKS  # "w0 w1 w2 w3 ": w, 0, ...
        assert r.usage_prompt_tokens == len(tok.encode(as_sent, add_special_tokens=not chat))
        assert r.usage_prompt_tokens > len(prompt.split()) + 5 or not chat  # the chat template's own tokens
    assert all(not r.counted and r.usage_prompt_tokens == 7 and r.n_out == N_CHUNKS for r in served)


def test_closed_loop_streams_pause_their_think_time_between_requests():
    """think_s: each stream waits a draw of U(0, 2 think_s) after a request before its next (its own draws, so the
    prompts stay those of the seed); a negative think time is refused."""
    import itertools
    import random

    with BackgroundServer(scripted_app()) as url:
        runs = {
            think: asyncio.run(run_load_test(LoadTestConfig(url, concurrency=1, max_requests=4, think_s=think)))[0]
            for think in (0.0, 0.04)
        }
    draws = random.Random(0 + 1)
    for prev, nxt in itertools.pairwise(runs[0.04]):
        assert nxt.start - prev.end >= draws.uniform(0.0, 0.08) - 1e-3  # asyncio.sleep wakes no earlier
    assert [r.prompt_chars for r in runs[0.0]] == [r.prompt_chars for r in runs[0.04]]
    with pytest.raises(BadInput, match="think time"):
        LoadTestConfig("http://x", think_s=-1.0)


def test_client_reports_http_errors():
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "m"}]}

    @app.post("/v1/completions")
    async def refuse():
        from fastapi.responses import JSONResponse

        return JSONResponse({"error": {"message": "queue full"}}, status_code=429)

    with BackgroundServer(app) as url:
        records, _, _ = asyncio.run(run_load_test(LoadTestConfig(url, concurrency=2, max_requests=3)))
    assert len(records) == 3 and not any(r.ok for r in records)
    assert all(r.error.startswith("HTTP 429") for r in records)


def test_loadtest_command_prints_table_and_writes_files(tmp_path):
    from typer.testing import CliRunner

    from prefill.cli.main import app

    with BackgroundServer(scripted_app()) as url:
        args = [
            "loadtest",
            "--url",
            url,
            "--requests",
            "3",
            "--concurrency",
            "2",
            "--prompt-len",
            "5",
            "--max-tokens",
            "4",
            "--slo-ttft-ms",
            "60000",
            "--slo-tpot-ms",
            "60000",
            "--out",
            str(tmp_path / "r.json"),
        ]
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for word in ("TTFT", "ITL", "TPOT", "E2E", "goodput", "definitions", "3/3 requests ok"):
        assert word in result.output
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["output_tokens"] == 3 * N_CHUNKS
    assert (tmp_path / "r.png").exists()  # without --plot, the plot goes beside the report


def test_loadtest_command_bad_prompt_length_is_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    prefill = Path(sys.executable).parent / "prefill"
    r = subprocess.run(
        [str(prefill), "loadtest", "--prompt-len", "20:10"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error:") and "Traceback" not in r.stderr


def test_the_prediction_runs_what_the_server_says_it_runs():
    """--predict models the server's own dtype, weights, activations, K/V dtype and KV pool from its /health; a
    server that does not say them (another engine) as `prefill serve` would run by default here."""
    from prefill.engine.weights import resolve_path
    from prefill.plan.load_prediction import DEFAULT_KV_MB, served_as

    app = FastAPI()
    said = {"status": "ok", "dtype": "float32", "weights": "native", "kv_pool_bytes": 512 * 2**20}

    @app.get("/health")
    async def health():
        return said | {"activations": "q8", "kv_dtype": "float16"}

    with BackgroundServer(app) as url:
        want = {"dtype": "float32", "weights": "native", "kv_mb": 512.0, "activations": "q8", "kv_dtype": "float16"}
        assert served_as(None, url) == want
    with BackgroundServer(scripted_app()) as url:  # no /health: 404
        dtype, weights, acts = resolve_path(None, "auto", "auto", echo=None)
        want = {"dtype": dtype, "weights": weights, "kv_mb": DEFAULT_KV_MB, "activations": acts, "kv_dtype": None}
        assert served_as(None, url) == want


def test_loadtest_predict_probes_the_machine_before_and_after_the_load(tmp_path, monkeypatch):
    """--predict simulates the trace on a profile of the minutes the load ran in (a probe before it, one after:
    this machine's speed drifts over minutes, and a probe of other minutes predicted the wrong machine), with
    the step loop's own work per step measured and the server's timed on one request alone and a burst of them
    together, and prints each percentile beside its prediction."""
    from typer.testing import CliRunner

    from prefill.cli.main import app
    from prefill.loadtest import client as loadtest_module
    from prefill.machine import attention_probe, elementwise, probe

    events = []
    monkeypatch.setattr(probe, "gemm_curve", lambda K, N, *a, **kw: events.append("probe") or ((1, 1e9), (64, 4e10)))
    monkeypatch.setattr(attention_probe, "attention_curves", lambda *a, **kw: (((16, 1e9), (1024, 4e10)), ((64, 2e9),)))
    monkeypatch.setattr(probe, "measure_bandwidth", lambda device="cpu": 10e9)
    monkeypatch.setattr(probe, "measure_op_overhead", lambda device="cpu", dtype="float32": 2e-6)
    monkeypatch.setattr(elementwise, "measure_elementwise_rate", lambda spec, dtype, device="cpu": 50e9)
    real_run = loadtest_module.run_load_test

    async def run(cfg):
        events.append("load")
        return await real_run(cfg)

    monkeypatch.setattr(loadtest_module, "run_load_test", run)
    args = ["loadtest", "--requests", "3", "--rate", "20", "--prompt-len", "5", "--max-tokens", "4", "--predict"]
    with BackgroundServer(scripted_app()) as url:
        files = ["--out", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]
        result = CliRunner().invoke(app, [*args, "--url", url, *files])
    assert result.exit_code == 0, result.output
    runs = [e for i, e in enumerate(events) if e == "load" or i == 0 or events[i - 1] != e]
    # a probe; requests alone; a burst and the prompts prefilled among it; the load; the same three again; a probe
    assert runs[-9:] == ["probe", *["load"] * 7, "probe"], events
    text = " ".join(result.output.split())  # rich wraps lines at the runner's 80 columns
    assert "(2 probes around it)" in text and "the step loop's own work" in text
    assert (
        "timed on 2 requests alone, 8 together and 6 prefilled while they decoded, before the load and after it" in text
    )
    assert "measured vs predicted" in text and "TTFT" in text
    saved = json.loads((tmp_path / "r.json").read_text())["predicted"]
    assert saved["summary"]["successful"] == 3 and len(saved["loop_s"]) == 2
    assert saved["serving"]["c"] >= 0 and saved["serving"]["e"] >= 0 and saved["serving"]["prefill_scale"] > 0
    assert saved["serving"]["intake_s"] >= 0
    from prefill.costmodel.profile import MachineProfile

    profile = MachineProfile.from_json(saved["machine_profile"])  # the profile it read, to predict it again
    assert profile.bandwidth_bytes_per_s == 10e9 and profile.source == saved["profile"]
