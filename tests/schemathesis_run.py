"""schemathesis `--checks all` against a running server's /openapi.json, as the suite runs it: an API key, a fixed
seed, few examples per operation, one worker, a response-time limit of the caller's, the report and the cache in
`cwd`, the hooks of schemathesis_hooks.py. Returns the finished process; the caller asserts on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_schemathesis(
    url: str, key: str, cwd: Path, *, max_response_s: float, examples: int, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """`st run` over `url`'s document with `extra` options (e.g. which operations), limited to 10 minutes."""
    st = Path(sys.executable).parent / "st"
    cmd = [
        str(st),
        "run",
        f"{url}/openapi.json",
        *extra,
        "--checks",
        "all",
        "--max-response-time",
        str(max_response_s),
        "--header",
        f"Authorization: Bearer {key}",
        "--max-examples",
        str(examples),
        "--seed",
        "13",
        "--request-timeout",
        str(max_response_s + 30),
        "--workers",
        "1",
        "--report-dir",
        str(cwd),
    ]
    hooks = {"SCHEMATHESIS_HOOKS": str(Path(__file__).with_name("schemathesis_hooks.py"))}  # rules beyond the schema
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd, env={**os.environ, **hooks})
