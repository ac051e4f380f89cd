"""A small tmpfs for the tests of a store on a hostile disk: mounted fresh where the tests run as root, skipped
(with the reason) elsewhere."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def mount_tmpfs(directory: Path, size_mb: int) -> None:
    """A fresh tmpfs of `size_mb` MiB at `directory`; pytest.skip (with the reason) where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    directory.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(directory)], capture_output=True, text=True
    )
    if run.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed: {run.stderr.strip()}")


def unmount(directory: Path) -> None:
    subprocess.run(["umount", "-l", str(directory)], capture_output=True)
