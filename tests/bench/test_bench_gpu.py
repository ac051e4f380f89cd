"""benchmarks/gpu.sh on the CPU with tiny shapes: both engines on the same random weights, every point timed."""

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_script_runs_on_cpu_with_the_tiny_preset(tmp_path):
    cmd = [
        str(ROOT / "benchmarks" / "gpu.sh"),
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--prompt-lengths",
        "32,128",
        "--repeats",
        "2",
        "--out",
        str(tmp_path),
        "--publish",
        str(tmp_path / "results"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "gpu.json").read_text())
    assert result["spec"]["name"] == "tiny-llama" and result["device"] == "cpu"
    assert [(p["engine"], p["P"]) for p in result["points"]] == [
        ("prefill", 32),
        ("transformers", 32),
        ("prefill", 128),
        ("transformers", 128),
    ]
    assert all(p["mfu"] > 0 for p in result["points"])
    # the same weights: bf16 logits of ours and transformers agree to bf16 rounding
    assert result["logits_rel_gap_vs_transformers"] < 0.05
    assert result["bf16_gemm_flops_per_s"] > 0
    # --publish: the same table as a results file of this CPU's kind, with the command that reproduces it
    (published,) = (tmp_path / "results").glob("*/gpu.json")
    from prefill.bench.published import load

    table = load(published)
    assert [row[:2] for row in table.rows] == [
        ("32", "prefill"),
        ("32", "transformers"),
        ("128", "prefill"),
        ("128", "transformers"),
    ]
    assert table.command.startswith("benchmarks/gpu.sh --device cpu --preset tiny") and "--publish" not in table.command


def test_gpu_script_refuses_cuda_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from prefill.bench.gpu import main

    assert main(["--device", "cuda", "--out", str(tmp_path)]) == 2


def test_the_h200_run_in_docs_from_the_catalog():
    from prefill.bench.gpu import catalog_rows, load_result

    rows = catalog_rows(load_result(ROOT / "docs" / "gpu-h200.json"))
    assert [r["P"] for r in rows] == [512, 2048, 8192]
    for r in rows:
        assert r["dominant"] == "compute"  # Llama-3-8B prefill at P >= 512 on an H200
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
    predicted = [r["predicted_s"] for r in rows]
    assert predicted[0] < predicted[1] < predicted[2]
    assert predicted[2] / predicted[1] > 4  # attention's triangle: more than linear in P
