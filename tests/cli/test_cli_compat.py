"""Issue 21's CLI cases: errors that name what is wrong (a zero shape, an unsupported architecture, heads that T GPUs
cannot split), a warning for a prompt beyond the model's context, and `prefill run`'s dtype line on stderr after
the model path is checked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefill.cli.main import app

runner = CliRunner()
PREFILL = Path(sys.executable).parent / "prefill"


def run(*args: str):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize("flag", ["--layers", "--kv-heads", "--head-dim"])
def test_a_zero_shape_names_its_flag(flag):
    shapes = {"--layers": "2", "--kv-heads": "4", "--head-dim": "64", flag: "0"}
    result = run("kv", *[x for kv in shapes.items() for x in kv])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {flag} must be >= 1, got 0"


GPT2 = {"model_type": "gpt2", "n_head": 12, "n_embd": 768, "n_layer": 12, "vocab_size": 50257, "n_positions": 1024}
MAMBA = {"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "vocab_size": 50280, "state_size": 16}


@pytest.mark.parametrize("config", [GPT2, MAMBA], ids=["gpt2", "mamba"])
@pytest.mark.parametrize("command", ["estimate", "kv"])
def test_an_unsupported_architecture_is_named(tmp_path, config, command):
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run(command, "--config", str(tmp_path))
    assert result.exit_code == 2
    err = result.stderr.strip()
    assert err.startswith(f"error: architecture '{config['model_type']}' is not supported (supported: "), err
    assert "llama" in err and "qwen2" in err and "num_attention_heads" not in err


def test_a_prompt_beyond_the_context_is_estimated_with_a_warning():
    result = run("estimate", "-m", "llama-3-8b", "-p", "100000000", "--json")
    assert result.exit_code == 0, result.output
    reason = "P = 100000000 is beyond meta-llama/Meta-Llama-3-8B's context length of 8192 tokens"
    assert reason in result.stderr and result.stderr.startswith("warning: ")
    assert reason in json.loads(result.stdout)["warnings"][0]
    inside = run("estimate", "-m", "llama-3-8b", "-p", "8192", "--json")
    assert inside.stderr == "" and "warnings" not in json.loads(inside.stdout)


def test_a_tp_that_cannot_split_the_heads_is_refused_with_the_reason():
    result = run("estimate", "-m", "llama-3-8b", "--tp", "3")  # 32 query heads, 8 KV heads
    assert result.exit_code == 2
    assert "T = 3 does not divide the 32 query heads" in result.stderr
    assert "use T in [1, 2, 4, 8, 16, 32]" in result.stderr
    for ok in ("2", "8", "16"):  # 16 > H_kv = 8: each KV head copied to two GPUs
        assert run("estimate", "-m", "llama-3-8b", "--tp", ok, "--json").exit_code == 0


def test_run_checks_the_model_path_before_choosing_a_dtype(tmp_path):
    result = run("run", "Hi", "--model", str(tmp_path / "missing.gguf"))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: model not found:") and "dtype" not in result.output


@pytest.mark.slow
def test_run_prints_its_path_line_to_stderr():
    env = {**os.environ, "COLUMNS": "160"}
    r = subprocess.run(
        [str(PREFILL), "run", "Hi", "-n", "1", "--dtype", "auto"], capture_output=True, text=True, timeout=600, env=env
    )
    assert r.returncode == 0, r.stderr
    assert "path auto: " in r.stderr and "path auto" not in r.stdout  # the choice and its predictions, on stderr


def test_an_unsupported_gguf_architecture_is_named(tmp_path):
    import gguf

    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")  # writes general.architecture
    writer.add_uint32("mamba.embedding_length", 768)
    writer.add_uint32("mamba.block_count", 24)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = run("kv", "--gguf", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: architecture 'mamba' is not supported (supported: "), result.stderr
