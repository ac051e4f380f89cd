"""The suite's order (tests/conftest.py): the files HEAVY_FIRST starts first are files that exist, each once,
so that a file moved or renamed does not silently fall back to the end of a worker's queue."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# tests/conftest.py by its path: under the name "conftest", another folder's conftest may answer
_spec = importlib.util.spec_from_file_location("suite_conftest", TESTS / "conftest.py")
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
HEAVY_FIRST, pytest_collection_modifyitems = _conftest.HEAVY_FIRST, _conftest.pytest_collection_modifyitems


def test_every_heavy_file_exists_once():
    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)
    missing = [name for name in HEAVY_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"tests/conftest.py's HEAVY_FIRST names files that are gone: {missing}"


def test_the_heavy_files_run_first_in_their_order():
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    items = [Item("tests/costmodel/test_costs.py::test_a"), *(Item(f"tests/{n}::test_b") for n in HEAVY_FIRST[::-1])]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid.split("::")[0].removeprefix("tests/") for i in items[:-1]] == list(HEAVY_FIRST)
    assert items[-1].nodeid == "tests/costmodel/test_costs.py::test_a"
