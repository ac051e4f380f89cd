"""`prefill exercise` writes the skeleton; `prefill exercise check FILE` passes a right solution and catches
wrong ones, check by check, with one error line for a file that is missing or does not import."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefill.cli.main import app
from prefill.lesson.exercise import FUNCTIONS, skeleton

runner = CliRunner()

RIGHT = """
import numpy as np

def prefill_flops(N, P):
    return 2 * N * P

def prefill_seconds(N, P, flops_per_sec, utilization=1.0):
    if not 0 < utilization <= 1:
        raise ValueError("utilization must be in (0, 1]")
    return prefill_flops(N, P) / (flops_per_sec * utilization)

def causal_pairs(P):
    return P * (P + 1) // 2

def causal_mask(P):
    return np.tril(np.ones((P, P), dtype=bool))

def prefill_matches_sequential(X, W):
    parallel = np.cumsum(X @ W, axis=0)
    running, rows = np.zeros(X.shape[1]), []
    for i in range(X.shape[0]):
        running = running + X[i] @ W
        rows.append(running)
    return bool(np.allclose(parallel, np.array(rows)))
"""

# Each a plausible mistake, and the check that must catch it.
# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
WRONG = {
    "def prefill_flops(N, P):\n    return 2 * N * P": ("def prefill_flops(N, P):\n    return N * P", "prefill_flops"),
    "    if not 0 < utilization <= 1:\n        raise ValueError(\"utilization must be in (0, 1]\")\n": (
        "", "utilization 1.5 raises ValueError"),
    "return P * (P + 1) // 2": ("return P * P", "causal_pairs: P = 4"),
    "np.tril(np.ones((P, P), dtype=bool))": ("np.ones((P, P), dtype=bool)", "causal_mask: P = 3"),
    "return bool(np.allclose(parallel, np.array(rows)))": ("return True", "NaN input"),
}
# fmt: on


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "solution.py"
    path.write_text(text)
    return path


def test_skeleton_is_written_once_and_fails_every_check(tmp_path):
    out = tmp_path / "ex.py"
    result = runner.invoke(app, ["exercise", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == skeleton("ex.py")
    assert all(f"def {f}(" in out.read_text() for f in FUNCTIONS)
    again = runner.invoke(app, ["exercise", "--out", str(out)])
    assert again.exit_code == 2 and "exists" in again.output
    check = runner.invoke(app, ["exercise", "check", str(out)])
    assert check.exit_code == 1 and "0 of 19 checks pass" in check.output


def test_a_right_solution_passes_every_check(tmp_path):
    result = runner.invoke(app, ["exercise", "check", str(write(tmp_path, RIGHT))])
    assert result.exit_code == 0, result.output
    assert "19 of 19 checks pass" in result.output and "FAIL" not in result.output
    assert "PASS prefill_seconds: 7e9, 1,000 at 1e14 × 0.5 = 0.28 s" in result.output


@pytest.mark.parametrize("right,wrong", list(WRONG.items()), ids=[v[1] for v in WRONG.values()])
def test_each_wrong_implementation_is_caught(tmp_path, right, wrong):
    replacement, failing_check = wrong
    assert right in RIGHT
    result = runner.invoke(app, ["exercise", "check", str(write(tmp_path, RIGHT.replace(right, replacement)))])
    assert result.exit_code == 1, result.output
    failed = [line for line in result.output.splitlines() if line.startswith("FAIL")]
    assert failed and any(failing_check in line for line in failed), result.output


def test_missing_function_missing_file_and_broken_file_are_one_line_errors(tmp_path):
    partial = runner.invoke(
        app, ["exercise", "check", str(write(tmp_path, "def prefill_flops(N, P):\n    return 0\n"))]
    )
    assert partial.exit_code == 1 and "FAIL causal_mask: is defined (not found in the file)" in partial.output
    missing = runner.invoke(app, ["exercise", "check", str(tmp_path / "nope.py")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    broken = runner.invoke(app, ["exercise", "check", str(write(tmp_path, "def f(:\n"))])
    assert broken.exit_code == 2 and "does not import: SyntaxError" in broken.output
    assert "Traceback" not in broken.output


def test_an_exception_in_the_solution_fails_its_check_and_the_others_still_run(tmp_path):
    text = RIGHT.replace("return P * (P + 1) // 2", "raise RuntimeError('todo')")
    result = runner.invoke(app, ["exercise", "check", str(write(tmp_path, text))])
    assert result.exit_code == 1
    assert "FAIL causal_pairs: P = 1 (raised RuntimeError: todo)" in result.output
    assert "PASS causal_mask: P = 8" in result.output
