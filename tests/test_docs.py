"""The documentation cannot drift: its examples run (scripts/docs_examples.py) and the site builds strictly."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "docs_examples.py"


def docs_examples(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def test_every_torch_free_example_prints_what_the_docs_show():
    """estimate, kv, mask, the errors and the exercise: exact text; long commands: their options exist; links,
    repository paths and `prefill.` names in the README and the pages resolve."""
    r = docs_examples("--check", "--fast")
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 problems" in r.stdout and "examples checked (fast)" in r.stdout


def test_the_check_refuses_a_drifted_page(tmp_path):
    """A check that cannot fail proves nothing: a wrong output, a stale path, a stale module name, an unmarked
    command block, an unknown option of a long command and a malformed URL are each reported."""
    page = tmp_path / "drifted.md"
    page.write_text(
        "<!-- example -->\n```console\n$ prefill kv --layers 32 --kv-heads 8 --head-dim 128 -p 2048\n"
        "268,435,457 B\n```\n\n"
        "```console\n$ prefill mask --tokens 3\n```\n\n"
        "<!-- example: long -->\n```\nprefill bench --no-such-option\n```\n\n"
        "`src/prefill/costs.py` and `prefill.costmodel.costs.no_such_formula` and [x](https://)\n"
    )
    r = docs_examples("--check", "--fast", str(page))
    assert r.returncode == 1
    assert "prints something else now" in r.stderr and "+│ bytes                     │ 268,435,456 B" in r.stderr
    assert "without an <!-- example --> marker" in r.stderr
    assert "--no-such-option is not an option of prefill" in r.stderr
    assert "`src/prefill/costs.py` does not exist" in r.stderr
    assert "`prefill.costmodel.costs.no_such_formula` names no module or definition" in r.stderr
    assert "malformed URL 'https://'" in r.stderr
    assert "6 problems" in r.stdout


def test_mkdocs_builds_strictly(tmp_path):
    """Broken internal links or anchors, and pages left out of the navigation, fail the build."""
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra: pip install -e '.[dev]'")
    pytest.importorskip("material", reason="mkdocs-material is in the dev extra: pip install -e '.[dev]'")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "index.html").is_file() and (tmp_path / "performance" / "index.html").is_file()
    assert (tmp_path / "lesson-calculator.png").is_file()  # the screenshots the browser tests write


# The examples that load the model (demo, run, verify, the curl sessions against `prefill serve`) take minutes:
# `make docs-all` runs every one; the CLI and server tests run the same commands and routes in the suite.
