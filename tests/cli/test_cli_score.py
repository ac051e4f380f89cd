"""`prefill score` through the console script: perplexity, FLOPs, the per-token view, JSON, and one-line errors."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

PREFILL = Path(sys.executable).parent / "prefill"
TEXT = "The quick brown fox jumps over the lazy dog. Paris is the capital of France.\n"


def cli(*args, stdin=None, timeout=600):
    env = {**os.environ, "COLUMNS": "160"}
    return subprocess.run([str(PREFILL), *args], capture_output=True, text=True, timeout=timeout, env=env, input=stdin)


@pytest.mark.slow
def test_score_json_from_stdin(smollm):
    r = cli("score", "-", "--json", "--tokens", stdin=TEXT)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    ids = smollm.tokenizer.encode(TEXT, add_special_tokens=True)
    assert out["tokens"] == len(ids) == 18 and out["windows"] == 1 and out["scored_tokens"] == 17
    lps = [t["logprob"] for t in out["token_logprobs"]]
    assert lps[0] is None and [t["id"] for t in out["token_logprobs"]] == ids
    assert out["perplexity"] == pytest.approx(math.exp(-sum(lps[1:]) / 17), rel=1e-9)
    assert 5 < out["perplexity"] < 100
    # FLOPs from the cost model: 18 positions unembedded (2 * 576 * 49152 each)
    assert out["flops"]["unembed"] == 18 * 2 * 576 * 49_152
    assert out["flops"]["unembed_share"] == pytest.approx(0.20996, abs=1e-5)
    assert out["seconds"] > 0 and out["tokens_per_s"] == pytest.approx(18 / out["seconds"])
    assert out["path"].endswith("float32 activations, float32 K/V")  # scoring is exact by default (issue 51)


@pytest.mark.slow
def test_score_file_with_window_and_stride_prints_the_tables(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT * 3)
    r = cli("score", str(path), "--window", "24", "--stride", "12", "--tokens")
    assert r.returncode == 0, r.stderr
    for part in ("perplexity", "windows of 24 every 12", "unembedding share", "tokens/s", "' Paris'"):
        assert part in r.stdout, part


@pytest.mark.parametrize(
    "args,stdin,match",
    [
        (("-",), "  \n", "standard input is empty"),
        (("-", "--window", "8", "--stride", "9"), TEXT, "larger than the window"),
    ],
)
def test_bad_input_is_one_error_line_before_the_model_loads(args, stdin, match):
    from typer.testing import CliRunner

    from prefill.cli.main import app

    result = CliRunner().invoke(app, ["score", *args], input=stdin)
    assert result.exit_code == 2 and not isinstance(result.exception, Exception)  # a clean exit, no traceback
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], result.stderr


@pytest.mark.slow
def test_a_window_past_the_context_is_one_error_line():
    r = cli("score", "-", "--window", "9000", stdin=TEXT)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()  # notes (the dtype and weights chosen) may come first, then one error
    assert lines[-1].startswith("error:") and "context length 8192" in lines[-1] and "Traceback" not in r.stderr
    assert sum(line.startswith("error:") for line in lines) == 1


@pytest.mark.slow
def test_score_twice_on_a_kv_store_gives_the_same_perplexity(tmp_path):
    """The second run loads each later window's unscored context from the first run's blocks. Both on float32
    activations, named (either exact path: float32 in another summation order, far inside rel 1e-4)."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 6)  # ~105 tokens: windows of 48 every 32
    args = ("score", str(text), "--json", "--window", "48", "--stride", "32", "--kv-store", str(tmp_path / "kv"))
    args += ("--activations", "f32")
    first, second = cli(*args), cli(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    blocks = list((tmp_path / "kv" / "blocks").rglob("*.kv"))
    assert blocks  # the windows' whole blocks were stored
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert b["perplexity"] == pytest.approx(a["perplexity"], rel=1e-4)  # float32 rounding, not another answer
