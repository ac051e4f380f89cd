"""docs/design.md draws the package tree: every module in src/prefill is on it, and nothing on it is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "prefill"


def tree_block(text: str) -> str:
    """The ```text block that starts with src/prefill/."""
    start = text.index("```text\nsrc/prefill/")
    return text[start : text.index("\n```", start + 1)]


def named(block: str) -> tuple[set[str], set[str]]:
    """(module file names, package folder names) the block names, up to the tests/ line."""
    block = block.split("\ntests/", 1)[0]
    return set(re.findall(r"\b([A-Za-z_0-9]+\.py)\b", block)), set(re.findall(r"^\s+([a-z_0-9]+)/", block, re.M))


def missing_and_stale(block: str, package: Path = PACKAGE) -> tuple[list[str], list[str]]:
    files, folders = named(block)
    modules = [p for p in package.rglob("*.py") if "static" not in p.parts]
    here = {p.name for p in modules} | {p.parent.name for p in modules if p.parent != package}
    missing = sorted(
        str(p.relative_to(package))
        for p in modules
        if (p.name != "__init__.py" and p.name not in files)
        or (p.name == "__init__.py" and p.parent.name not in folders and p.parent != package)
    )
    stale = sorted(name for name in files | folders if name not in here)
    return missing, stale


def test_the_design_page_draws_every_module_and_no_ghost():
    missing, stale = missing_and_stale(tree_block((ROOT / "docs" / "design.md").read_text()))
    assert missing == [], f"add these to docs/design.md's tree: {missing}"
    assert stale == [], f"docs/design.md's tree names what src/prefill no longer has: {stale}"


def test_a_new_module_and_a_removed_one_are_both_seen(tmp_path):
    (tmp_path / "engine").mkdir()
    for name in ("__init__.py", "engine/__init__.py", "engine/loop.py", "engine/new_one.py"):
        (tmp_path / name).write_text("")
    block = "```text\nsrc/prefill/\n  engine/\n    loop.py   the loop\n    gone.py   removed\ntests/  x.py\n"
    assert missing_and_stale(block, tmp_path) == (["engine/new_one.py"], ["gone.py"])
