"""End to end, as a user runs it: `prefill demo`, `prefill run`, `prefill verify` through the console script."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PREFILL = Path(sys.executable).parent / "prefill"


def cli(*args, timeout=600):
    env = {**os.environ, "COLUMNS": "160"}  # wide enough that table cells are not wrapped
    return subprocess.run([str(PREFILL), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_demo_answers_and_shows_every_part():
    """`prefill demo` with its default options answers Paris on float32 activations and float32 K/V (issue 51: the
    8-bit-activation path answered "L'Étoile" on an AVX-512 Xeon), and says which path ran."""
    r = cli("demo")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "answer: The capital of France is Paris." in out
    said = [line for line in r.stderr.splitlines() if line.startswith("path auto: ")]
    assert len(said) == 1 and said[0].split(", predicted")[0].endswith("float32 activations"), r.stderr
    assert "float32 activations, float32 K/V" in out  # the model table's path row (Engine.path_label)
    for part in (
        "prompt tokens P",
        "37",
        "K and V each [B, H_kv, P, d_head] = [1, 3, 37, 64]",
        "TTFT",
        "ITL p50 / p90",
        "TTFT + (n-1)·ITL",
        "MFU",
        "prefill achieved",
    ):
        assert part in out, part
    # measured KV bytes beside the formula: 2 * 30 * 1 * 3 * 37 * 64 * 4
    assert out.count("1,704,960 B") == 2 and "equal" in out
    # the time model beside each measurement: error, what dominates, cold apart from warm
    for part in ("time to first token (warm", "ITL p50 predicted", "request time predicted", "cold (the first prefill"):
        assert part in out, part
    assert "-bound (" in out and "%" in out


def test_run_raw_bfloat16_chunked():
    r = cli("run", "The capital of France is", "--raw", "--dtype", "bfloat16", "-n", "4", "--chunk-size", "2")
    assert r.returncode == 0, r.stderr
    assert "chunks of 2" in r.stdout
    assert "[1, 3, 5, 64]" in r.stdout  # 5 raw prompt tokens, no chat template
    assert r.stdout.count("115,200 B") == 2  # measured and formula, bf16: 2 * 30 * 1 * 3 * 5 * 64 * 2


def test_verify_passes_without_reference():
    r = cli("verify", "--no-reference")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASS") == 10 and "FAIL" not in r.stdout  # KV bytes == formula for each of 4 K/V dtypes
    assert "batched decode (B = 4" in r.stdout
    for kv in ("float32", "bfloat16", "float16", "q8_0"):
        assert f"KV-cache bytes held vs formula ({kv} K/V)" in r.stdout


def test_calibrate_probes_again_and_shows_the_profile(monkeypatch):
    """The probe, run by the command; `--json` prints the profile it saved (read back here in-process instead of
    probing a second time: the printing is what that half checks)."""
    import json

    from typer.testing import CliRunner

    from prefill.cli.main import app
    from prefill.device.cache import cache_dir
    from prefill.machine import profiles

    r = cli("calibrate", "--model", "smollm2-135m", "--dtype", "float32", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "probing this machine for HuggingFaceTB/SmolLM2-135M in float32" in r.stderr  # a note, not the result
    out = " ".join(r.stdout.split())  # the lines below the table wrap at its width
    for part in ("GEMM GFLOP/s by rows M", "K=576, N=3072", "K=1536, N=576", "one decode query", "saved in"):
        assert part in out, part
    probe, asked = profiles.probe_profile, []

    def saved(*args, refresh: bool = False, **kw):  # the profile the command above saved, from the cache
        asked.append(refresh)
        return probe(*args, **{**kw, "refresh": False, "max_age_s": None})

    monkeypatch.setattr(profiles, "probe_profile", saved)
    args = ("calibrate", "--model", "smollm2-135m", "--dtype", "float32", "--threads", "1", "--json")
    printed = CliRunner().invoke(app, args)
    assert printed.exit_code == 0 and asked[0] is True, printed.output  # the command asked for a fresh probe
    profile = json.loads(printed.stdout)
    assert profile["dtype"] == "float32" and len(profile["gemm"]) == 5 and profile["bandwidth_bytes_per_s"] > 0
    on_disk = json.loads((cache_dir() / profiles.PROFILE_FILE).read_text()).values()
    assert profile["bandwidth_bytes_per_s"] in {e["bandwidth_bytes_per_s"] for e in on_disk}  # the one saved above


def test_calibrate_refuses_bad_input_in_one_line():
    for args in (("--threads", "0"), ("--model", "no-such-model")):
        r = cli("calibrate", *args)
        assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr, args


def test_run_twice_on_a_kv_store_finds_the_prompt_the_second_time(tmp_path):
    prompt = "A short history of Paris for a school essay, in plain sentences. " * 8
    args = ("run", prompt, "--raw", "-n", "6", "--kv-store", str(tmp_path), "--kv-store-mb", "64")
    first, second = cli(*args), cli(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "KV store: " in first.stderr and "loads at" in first.stderr
    assert not re.search(r"KV store: (load|compute|both)", first.stdout)  # nothing stored yet
    assert re.search(r"KV store: (load|compute|both) \d+ tokens", second.stdout)  # found; the cost model chose
    # the four paths side by side, each predicted; the one taken measured (the files were just written: the
    # page cache holds them)
    table = second.stdout[second.stdout.index("stored tokens, compute or load") :]
    assert "compute (prefill them)" in table and "load from the page cache" in table and "load from the disk" in table
    assert re.search(r"both: compute [\d,]+, load [\d,]+ meanwhile\s*│\s*[\d.,]+ ms|cannot win here", table)
    if re.search(r"KV store: load \d+ tokens", second.stdout):
        assert re.search(r"load from the page cache\s*│\s*[\d.,]+ ms\s*│\s*[\d.,]+ ms", table)
        assert re.search(r"\d+% of their\s+pages\s+were\s+in\s+the\s+page", table)  # the caption wraps
    answer = [line for line in first.stdout.splitlines() if line.startswith("answer:")]
    assert answer and answer[0] in second.stdout.splitlines()


def test_a_kv_store_size_of_zero_is_one_error_line(tmp_path):
    r = cli("run", "Hi", "-n", "1", "--kv-store", str(tmp_path), "--kv-store-mb", "0")
    assert r.returncode == 2 and "--kv-store-mb must be > 0" in r.stderr and "Traceback" not in r.stderr
