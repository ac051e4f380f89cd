"""Compute or load: whether K/V of a stored prefix are cheaper to read back than to prefill again.

Loading n bytes at a measured rate of r bytes/s takes n / r seconds (the store's probe measures r for the disk
and for the page cache, prefill.engine.kv_store.probe); prefilling the same tokens takes what the engine's
time model predicts. The engine loads only when the load is predicted faster. Or both, from opposite ends
(Cake, ICML'25): the first blocks are computed while the last are read in the background; they meet at the
split where both take as long, and the pair takes max(compute(head), load(tail)), less than either alone
when the two are of the same order (a slow store). Torch-free, like all of costmodel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prefill.errors import BadInput

DEFAULT_STORE_MB = 4096.0  # the KV store's default size cap, MiB: a few dozen long prompts of a small model
# Both ends runs two things at once on shared cores, where the time model knows least: the tail's verifying and
# copying takes CPU from the head's prefill beyond its own CPU time (on a 2-core Zen 3, with the prefill's two
# OpenMP threads waiting for the one that lost its core, a page-cache load slowed the head by 2-5x the loader's
# CPU time). So both is chosen only when predicted at most this share of the better single path's time.
BOTH_MARGIN = 0.8


@dataclass(frozen=True)
class LoadDecision:
    """One compute-or-load decision: `choice` is "load", "compute" or "both"; seconds are predictions."""

    choice: str
    n_tokens: int  # stored tokens the decision is about (beyond the `past` already cached)
    past: int  # tokens cached before them (the RAM prefix cache's match)
    load_bytes: int  # bytes a load reads (block files, headers included)
    load_s: float  # predicted seconds to read and verify them
    compute_s: float  # predicted seconds to prefill the same tokens after `past`
    split: int = 0  # "both": tokens computed from the head (after `past`); the rest is loaded meanwhile
    both_s: float | None = None  # predicted seconds of both at `split` (None: not considered)

    @property
    def seconds(self) -> float:
        """Predicted seconds of the choice."""
        return {"load": self.load_s, "compute": self.compute_s, "both": self.both_s}[self.choice]

    @property
    def saved_s(self) -> float:
        """Predicted seconds the choice saves against always computing (0 when it computes)."""
        return max(0.0, self.compute_s - self.seconds)

    def as_dict(self) -> dict:
        return {
            "choice": self.choice,
            "n_tokens": self.n_tokens,
            "past": self.past,
            "load_bytes": self.load_bytes,
            "predicted_load_s": self.load_s,
            "predicted_compute_s": self.compute_s,
            "split": self.split,
            "predicted_both_s": self.both_s,
            "predicted_saved_s": self.saved_s,
        }


def load_seconds(nbytes: int, bytes_per_s: float) -> float:
    """Seconds to read `nbytes` at `bytes_per_s`."""
    if bytes_per_s <= 0:
        raise BadInput(f"a load rate must be > 0 bytes/s, got {bytes_per_s}")
    return nbytes / bytes_per_s


def compute_or_load(
    n_tokens: int,
    past: int,
    load_bytes: int,
    load_bytes_per_s: float,
    prefill_seconds_fn: Callable[[int, int], float],
    block_bytes: Sequence[int] = (),
    block_size: int = 16,
    cpu_bytes_per_s: float | None = None,
) -> LoadDecision:
    """Load the `n_tokens` stored tokens after `past` cached ones (`load_bytes` at `load_bytes_per_s`) or compute
    them: `prefill_seconds_fn(n, past)` is the time model's seconds for a prefill of n tokens after `past`. With
    `block_bytes` (the bytes of each stored block of `block_size` tokens, in order, summing to load_bytes),
    both from opposite ends is considered too (split_ends; `cpu_bytes_per_s`: the rate a load runs at when its
    bytes are in memory, its CPU work, which the head's prefill loses). The fastest predicted wins, both only
    by BOTH_MARGIN; a tie computes (no disk), then loads (no second thread)."""
    if n_tokens < 0 or past < 0 or load_bytes < 0:
        raise BadInput("n_tokens, past and load_bytes must be >= 0")
    if n_tokens == 0:
        return LoadDecision("compute", 0, past, 0, 0.0, 0.0)
    load_s = load_seconds(load_bytes, load_bytes_per_s)
    compute_s = float(prefill_seconds_fn(n_tokens, past))
    split, both_s = 0, None
    single = min(load_s, compute_s)
    if len(block_bytes) >= 2 and _both_may_win(
        BOTH_MARGIN * single, past, block_bytes, load_bytes_per_s, prefill_seconds_fn, block_size
    ):
        split, both_s = split_ends(
            n_tokens, past, block_bytes, load_bytes_per_s, prefill_seconds_fn, block_size, cpu_bytes_per_s
        )
    choice = "compute" if compute_s <= load_s else "load"  # a tie computes
    if both_s is not None and both_s <= BOTH_MARGIN * single:
        choice = "both"
    return LoadDecision(choice, n_tokens, past, load_bytes, load_s, compute_s, split, both_s)


def _both_may_win(
    target_s: float,
    past: int,
    block_bytes: Sequence[int],
    load_bytes_per_s: float,
    prefill_seconds_fn: Callable[[int, int], float],
    block_size: int,
) -> bool:
    """Whether both ends could take at most `target_s`: it loads one block at least and computes one block at
    least (so a bisection is wasted where either alone takes longer)."""
    if load_seconds(block_bytes[-1], load_bytes_per_s) >= target_s:
        return False
    return prefill_seconds_fn(block_size, past) < target_s


def split_ends(
    n_tokens: int,
    past: int,
    block_bytes: Sequence[int],
    load_bytes_per_s: float,
    prefill_seconds_fn: Callable[[int, int], float],
    block_size: int = 16,
    cpu_bytes_per_s: float | None = None,
) -> tuple[int, float]:
    """Both from opposite ends: compute the first j blocks (j * block_size tokens after `past`) while the other
    blocks load, for the j in 1 .. len(block_bytes) - 1 where max(compute, load) is least; (tokens computed,
    predicted seconds). The head's compute also pays the tail's CPU work (its bytes at `cpu_bytes_per_s`, when
    given): the loader verifies and copies on the cores the prefill runs on. Computing grows with j and loading
    shrinks, so the best j is at their crossing, found by bisection (a few predictions, not one per block)."""
    k = len(block_bytes)
    if k < 2:
        raise BadInput("both ends need two blocks at least")
    tail = [0] * (k + 1)  # tail[j]: bytes of blocks j .. k - 1
    for j in range(k - 1, -1, -1):
        tail[j] = tail[j + 1] + block_bytes[j]

    def times(j: int) -> tuple[float, float]:
        head = min(n_tokens, j * block_size)
        stolen = load_seconds(tail[j], cpu_bytes_per_s) if cpu_bytes_per_s else 0.0
        return float(prefill_seconds_fn(head, past)) + stolen, load_seconds(tail[j], load_bytes_per_s)

    lo, hi = 1, k - 1  # the first j in lo..hi whose compute reaches its load, else hi
    while lo < hi:
        mid = (lo + hi) // 2
        c, ld = times(mid)
        lo, hi = (lo, mid) if c >= ld else (mid + 1, hi)
    best = min({max(lo - 1, 1), lo}, key=lambda j: max(times(j)))
    return min(n_tokens, best * block_size), max(times(best))


def choice_flips(lengths: Sequence[int], loads: Callable[[int], bool], step: int) -> list[int]:
    """Where compute-or-load changes its answer along the prompt length: for each two neighbours of `lengths`
    (increasing multiples of `step`) whose answers differ (`loads(P)`: True when loading P tokens is predicted
    faster), the first multiple of `step` on the new side, found by bisection. Empty when one answer holds at
    every length (assumed to hold between the points where it does at both ends)."""
    if any(P % step or P <= 0 for P in lengths) or list(lengths) != sorted(set(lengths)):
        raise BadInput(f"lengths must be increasing positive multiples of {step}")
    flips, answers = [], [loads(P) for P in lengths]
    for i in range(len(lengths) - 1):
        (lo, a), (hi, b) = (lengths[i], answers[i]), (lengths[i + 1], answers[i + 1])
        if a == b:
            continue
        while hi - lo > step:  # loads(lo) == a, loads(hi) == b
            mid = (lo + hi) // (2 * step) * step
            lo, hi = (mid, hi) if loads(mid) == a else (lo, mid)
        flips.append(hi)
    return flips


def break_even_rate(load_bytes: Sequence[int], compute_s: Sequence[float]) -> tuple[float, int]:
    """The read rate, bytes/s, above which loading is predicted faster than computing at every point (point i:
    `load_bytes[i]` to read or `compute_s[i]` seconds of prefill), below it computing wins at one point at least;
    and the index of the point that sets it, where computing is cheapest per byte of K/V (the largest bytes /
    seconds)."""
    if not load_bytes or len(load_bytes) != len(compute_s) or min(compute_s) <= 0:
        raise BadInput("one positive compute time is needed for each load size")
    rates = [n / s for n, s in zip(load_bytes, compute_s, strict=True)]
    i = max(range(len(rates)), key=rates.__getitem__)
    return rates[i], i
