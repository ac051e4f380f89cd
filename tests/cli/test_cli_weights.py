"""--weights: the calculator's weight bytes by storage, and the engine commands' flag end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from prefill.cli.main import app
from prefill.loading import default_model_path

runner = CliRunner()


def test_estimate_shows_the_bytes_of_the_gguf_files_own_storage():
    r = runner.invoke(app, ["estimate", "--gguf", str(default_model_path()), "-p", "8", "--hardware", "h100", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["weights_storage"] == ["Q4_1", "Q8_0"]
    assert out["weight_bytes"] == out["decode_weight_bytes"] == 96_576_768  # tied: the step reads all of it
    assert out["decode_weight_floor_s"] == pytest.approx(96_576_768 / 3.35e12)  # the H100's 3.35 TB/s


def test_estimate_weights_option_and_bad_storage():
    r = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "--weights", "Q4_K", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["bytes_per_weight"] == 0.5625 and out["weights_storage"] == ["Q4_K", "Q4_K"]
    r = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "--weights", "Q9_9"])
    assert r.exit_code != 0 and "unknown weight storage 'Q9_9'" in r.output


@pytest.mark.slow
def test_run_with_native_weights_says_so():
    args = ["run", "What is the capital of France?", "-n", "8", "--weights", "native", "--activations", "f32"]
    r = runner.invoke(app, args)  # the path named whole: the answer is float32 activations' on the blocks
    assert r.exit_code == 0, r.output
    assert "Paris" in r.output and "float32 activations" in r.output


def test_run_rejects_a_bad_weights_value():
    r = runner.invoke(app, ["run", "hi", "--weights", "int3"])  # one `error:` line, exit 2, before any loading
    assert r.exit_code == 2
    assert "--weights must be one of auto, native, float32, bfloat16, float16" in r.output


def test_plan_and_simulate_help_list_every_gpu_weight_format_and_others_are_refused():
    import typer

    from prefill.costmodel.engines import GPU_WEIGHTS

    assert {"bfloat16", "fp8", "nvfp4", "mxfp4"} <= set(GPU_WEIGHTS)
    commands = typer.main.get_command(app).commands
    for name in ("plan", "simulate"):
        (option,) = [p for p in commands[name].params if "--weights" in p.opts]
        assert all(w in option.help for w in GPU_WEIGHTS), (name, option.help)
        assert "b200" in option.help and "h100" not in option.help  # FP4: the catalog GPUs with FP4 tensor cores
    r = runner.invoke(app, ["simulate", "-m", "llama-3.1-8b", "--hardware", "h100", "--weights", "int8"])
    assert r.exit_code == 2 and "nvfp4" in r.output and "Traceback" not in r.output, r.output
