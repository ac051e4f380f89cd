"""The lesson's coding exercise: five functions to write, and the checks a solution must pass.

`prefill exercise` writes SKELETON to a file; `prefill exercise check FILE` imports the student's file (on
their own machine; the server never runs code sent to it) and runs every check against prefill.costmodel.costs and
prefill.costmodel.causal, the project's own answers. Numpy only.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from prefill.costmodel import costs
from prefill.costmodel.causal import causal_mask, causal_pairs
from prefill.errors import BadInput

FUNCTIONS = ("prefill_flops", "prefill_seconds", "causal_pairs", "causal_mask", "prefill_matches_sequential")

SKELETON = '''"""The prefill exercise. Fill in the five functions, then run: prefill exercise check {name}

prefill_flops(N, P): 2 * N * P.
prefill_seconds(N, P, flops_per_sec, utilization=1.0): prefill_flops / (flops_per_sec * utilization);
    utilization must be in (0, 1] (raise ValueError otherwise).
causal_pairs(P): the number of (token, earlier-or-same token) pairs: P(P+1)/2.
causal_mask(P): a (P, P) boolean array, True where a token may attend (column <= row).
prefill_matches_sequential(X, W): X is (P, d) prompt vectors, W a (d, d) matrix. Compute a causal running sum
    of X @ W two ways: all positions at once (np.cumsum) and one position at a time in a loop.
    Return True if they agree.
"""

import numpy as np


def prefill_flops(N, P):
    pass


def prefill_seconds(N, P, flops_per_sec, utilization=1.0):
    pass


def causal_pairs(P):
    pass


def causal_mask(P):
    pass


def prefill_matches_sequential(X, W):
    pass
'''


def skeleton(name: str = "prefill_exercise.py") -> str:
    """The file `prefill exercise` writes, with the command that checks it."""
    return SKELETON.replace("{name}", name)


def write_skeleton(path: Path, force: bool = False) -> Path:
    """Write the skeleton to `path`; BadInput if the file exists (a solution in progress) and not `force`."""
    if path.exists() and not force:
        raise BadInput(f"{path} exists; check it with `prefill exercise check {path}` or pass --force to overwrite")
    path.write_text(skeleton(path.name))
    return path


@dataclass(frozen=True)
class Check:
    """One check of a solution: what it tests, whether it passed, and what was seen when it did not."""

    function: str
    name: str
    ok: bool
    detail: str = ""


def load_solution(path: Path):
    """Import the student's file as a module; BadInput (one line) if it is missing or does not import."""
    if not path.is_file():
        raise BadInput(f"{path} does not exist; write one with `prefill exercise --out {path}`")
    spec = importlib.util.spec_from_file_location(f"prefill_exercise_solution_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # any error in the student's file: one line, not a traceback
        line = getattr(e, "lineno", None)
        where = f" (line {line})" if line else ""
        raise BadInput(f"{path} does not import: {type(e).__name__}: {e}{where}") from None
    sys.modules.pop(spec.name, None)
    return module


def _close(a, b) -> bool:
    return isinstance(a, (int, float, np.number)) and math.isclose(float(a), b, rel_tol=1e-9)


def _raises_value_error(fn: Callable[[], object]) -> tuple[bool, str]:
    try:
        got = fn()
    except ValueError:
        return True, ""
    return False, f"returned {got!r} instead of raising ValueError"


def _value(fn: Callable, args: tuple, want: float) -> tuple[bool, str]:
    got = fn(*args)
    return _close(got, want), f"got {got!r}, expected {want:.6g}"


def _mask(m, P: int) -> tuple[bool, str]:
    got = np.asarray(m.causal_mask(P))
    want = causal_mask(P)
    if got.shape != want.shape:
        return False, f"shape {got.shape}, expected {want.shape}"
    return bool(np.array_equal(got.astype(bool), want)), f"got {got.astype(int).tolist()}"


def _agrees(m, X: np.ndarray, W: np.ndarray) -> tuple[bool, str]:
    got = m.prefill_matches_sequential(X, W)
    return got is True or got is np.True_, f"returned {got!r} for X {X.shape}, W {W.shape}"


def _disagrees(m, X: np.ndarray, W: np.ndarray) -> tuple[bool, str]:
    got = m.prefill_matches_sequential(X, W)
    return got is False or got is np.False_, f"returned {got!r}, expected False (NaN never agrees)"


def _with_nan(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    X, W = rng.standard_normal((4, 3)), rng.standard_normal((3, 3))
    X[2, 1] = np.nan  # NaN != NaN: the two ways cannot agree, so a function that never compares is caught
    return X, W


def _same(fn: Callable, reference: Callable, *args) -> Callable[[], tuple[bool, str]]:
    """A test that `fn(*args)` equals the cost model's `reference(*args)`."""
    return partial(_value, fn, args, reference(*args))


def _cases(m) -> list[tuple[str, str, Callable[[], tuple[bool, str]]]]:
    """(function, what is checked, a test returning (passed, what was seen))."""
    rng = np.random.default_rng(0)
    flops, seconds = m.prefill_flops, m.prefill_seconds
    return [
        ("prefill_flops", "2 · 7e9 · 1,000 = 1.4e13", _same(flops, costs.prefill_flops, 7e9, 1000)),
        ("prefill_flops", "2 · 135e6 · 64", _same(flops, costs.prefill_flops, 135e6, 64)),
        (
            "prefill_seconds",
            "7e9, 1,000 at 1e14 × 0.5 = 0.28 s",
            _same(seconds, costs.prefill_seconds, 7e9, 1000, 1e14, 0.5),
        ),
        (
            "prefill_seconds",
            "7e9, 1,000 at 3e14 × 0.5 = 0.0933 s",
            _same(seconds, costs.prefill_seconds, 7e9, 1000, 3e14, 0.5),
        ),
        ("prefill_seconds", "utilization defaults to 1.0", _same(seconds, costs.prefill_seconds, 7e9, 1000, 1e14)),
        (
            "prefill_seconds",
            "utilization 0 raises ValueError",
            partial(_raises_value_error, partial(seconds, 7e9, 1000, 1e14, 0)),
        ),
        (
            "prefill_seconds",
            "utilization 1.5 raises ValueError",
            partial(_raises_value_error, partial(seconds, 7e9, 1000, 1e14, 1.5)),
        ),
        *[("causal_pairs", f"P = {P}", _same(m.causal_pairs, causal_pairs, P)) for P in (1, 4, 5, 1000)],
        *[("causal_mask", f"P = {P}", partial(_mask, m, P)) for P in (1, 3, 5, 8)],
        *[
            (
                "prefill_matches_sequential",
                f"random X ({P}, {d}), W ({d}, {d}) agree",
                partial(_agrees, m, rng.standard_normal((P, d)), rng.standard_normal((d, d))),
            )
            for P, d in ((1, 2), (5, 3), (16, 8))
        ],
        (
            "prefill_matches_sequential",
            "NaN input: the two ways disagree (False)",
            partial(_disagrees, m, *_with_nan(rng)),
        ),
    ]


def run_checks(module) -> list[Check]:
    """Every check against the module's five functions; a missing function or an exception fails its check."""
    missing = [f for f in FUNCTIONS if not callable(getattr(module, f, None))]
    if missing:
        return [Check(f, "is defined", False, "not found in the file") for f in missing]
    results = []
    for function, name, test in _cases(module):
        try:
            ok, seen = test()
        except Exception as e:  # the student's code raised: report it as this check's failure
            ok, seen = False, f"raised {type(e).__name__}: {e}"
        results.append(Check(function, name, bool(ok), "" if ok else seen))
    return results
