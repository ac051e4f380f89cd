"""The house's floors: every import in src/prefill (at module level or inside a function, which is still an
import) runs one way, bottom to top, and no module reaches itself through others.

    errors < costmodel < device < model < machine < loading < engine | loadtest < plan < bench | server < lesson < cli

costmodel is torch-free and takes a machine's numbers as data; device says what the CPU or GPU can do; machine
probes the model's own kernels; the server knows nothing of the lesson, which mounts itself on it. The
load-test client (loadtest) measures any server and knows nothing of the planner; the simulator and the planner
(plan) read its traces. The package's own __init__ (the public API, lazy re-exports) stands above all and is
left out."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
FLOORS = [{"errors"}, {"costmodel"}, {"device"}, {"model"}, {"machine"}, {"loading"}, {"engine", "loadtest"},
          {"plan"}, {"bench", "server"}, {"lesson"}, {"cli"}]  # fmt: skip
FLOOR = {pkg: i for i, pkgs in enumerate(FLOORS) for pkg in pkgs}


def modules(root: Path = SRC) -> dict[str, Path]:
    """Every module under root/prefill by dotted name (a package by its own name)."""
    out = {}
    for path in sorted((root / "prefill").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The prefill modules that module `name` imports anywhere in its body. `from pkg import sub` imports the
    submodule sub when there is one (not the package's __init__), as Python resolves it."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
            targets = subs if len(subs) == len(node.names) else [base, *subs]
        else:
            continue
        for target in targets:
            while target and target not in known:  # an attribute of a module: the module
                target = target.rpartition(".")[0]
            if target.startswith("prefill.") and target != name:
                found.add(target)
    return found


def graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module -> the prefill modules it imports."""
    mods = modules(root)
    return {name: imports(name, path, mods) for name, path in mods.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Each import from a lower floor to a higher one, or across one floor (bench <-> server)."""
    bad = []
    for src, targets in edges.items():
        here = src.split(".")[1] if "." in src else None
        for dst in sorted(targets):
            there = dst.split(".")[1]
            if here is None or here == there:
                continue
            if here not in FLOOR or there not in FLOOR:
                bad.append(f"{src} -> {dst}: a package with no floor (add it to FLOORS)")
            elif FLOOR[there] >= FLOOR[here]:
                bad.append(f"{src} -> {dst}")
    return bad


def test_no_import_circle():
    assert circles(graph()) == []


def test_imports_run_down_the_floors():
    assert upward(graph()) == []


def test_the_server_knows_nothing_of_the_lesson():
    edges = graph()
    assert [f"{m} -> {d}" for m in edges if m.startswith("prefill.server") for d in edges[m] if ".lesson" in d] == []


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_a_planted_circle_and_an_upward_import_are_found(tmp_path):
    root = _plant(
        tmp_path,
        {
            "prefill/__init__.py": "",
            "prefill/engine/__init__.py": "",
            "prefill/engine/a.py": "from prefill.engine import b\n",
            "prefill/engine/b.py": "def f():\n    from prefill.engine.a import x  # inside a function: still counts\n",
            "prefill/costmodel/__init__.py": "",
            "prefill/costmodel/c.py": "def g():\n    from prefill.machine import probe\n",
            "prefill/machine/__init__.py": "",
            "prefill/machine/probe.py": "from ..costmodel import c\n",
        },
    )
    edges = graph(root)
    assert circles(edges) == [
        ["prefill.costmodel.c", "prefill.machine.probe"],
        ["prefill.engine.a", "prefill.engine.b"],
    ]
    assert upward(edges) == ["prefill.costmodel.c -> prefill.machine.probe"]


@pytest.mark.parametrize("line", ["from prefill.model.quant import ops", "import prefill.model.quant.ops as ops"])
def test_importing_a_submodule_is_not_importing_its_package(tmp_path, line):
    root = _plant(
        tmp_path,
        {
            "prefill/__init__.py": "",
            "prefill/model/__init__.py": "",
            "prefill/model/quant/__init__.py": "from prefill.model.quant.weight import W\n",
            "prefill/model/quant/weight.py": f"{line}\nW = 1\n",
            "prefill/model/quant/ops.py": "",
        },
    )
    assert circles(graph(root)) == []
