"""The lesson API's input bounds: one table (RANGES) that both the checks (in_range, in_words) and the OpenAPI
document (limits) read, so that what the document says is accepted is what the routes accept."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefill.errors import BadInput

MAX_N = 1e14  # parameters: far past any model built, small enough to catch a slip of the exponent
MAX_P = 10_000_000  # prompt tokens
MAX_PEAK = 1e19  # FLOP/s
MAX_MASK_TOKENS = 1_000_000  # the longest prompt whose mask /api/mask sends (scaled)
MAX_BANDWIDTH = 1e16  # bytes/s
MAX_B = 4096  # sequences
MAX_S = 3600.0  # seconds of one request phase
MAX_N_OUT = 1_000_000  # output tokens


def in_range(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> float:
    """`value`, or BadInput saying the allowed range (lo excluded when lo_open)."""
    ok = math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        left = "(" if lo_open else "["
        raise BadInput(f"{name} must be in {left}{lo:g}, {hi:g}], got {value:g}")
    return value


@dataclass(frozen=True)
class Range:
    """An input's allowed range, checked by in_range and written into the OpenAPI schema (bounds): the one place
    a float's bound is set. The least values are physical (a microsecond, a GFLOP/s, a GB/s), so that every number
    derived from them (1 / ITL, peak / bandwidth, a guess / a measurement) stays finite in float64."""

    lo: float
    hi: float
    lo_open: bool = False

    def schema(self) -> dict:
        return bounds(self.lo, self.hi, self.lo_open)

    def check(self, name: str, value: float) -> float:
        return in_range(name, value, self.lo, self.hi, self.lo_open)


MIN_S = 1e-6  # seconds: the least TTFT, ITL or prefill a request can measure (a microsecond)
MAX_BYTES = 1e18  # bytes: an exabyte, past any KV cache
RANGES = {
    "N": Range(1e6, MAX_N),  # a million parameters: the smallest model worth a calculation
    "P": Range(0, MAX_P),
    "n": Range(1, MAX_N_OUT),
    "peak": Range(1e9, MAX_PEAK),  # a GFLOP/s, as the page's box allows (0.001 TFLOP/s)
    "mfu": Range(0.001, 1),  # 0.1 % of the peak
    "bandwidth": Range(1e9, MAX_BANDWIDTH),  # a GB/s (0.001 TB/s): the ridge, peak / bandwidth, stays below 1e10
    "ttft": Range(MIN_S, MAX_S),
    "itl": Range(MIN_S, MAX_S),
    "prefill_s": Range(MIN_S, MAX_S),
    "seconds": Range(0, MAX_S),  # a part of a request that may take no time: tokenization, one token's gap
    "guess_s": Range(0, MAX_S),
    "guess_bytes": Range(0, MAX_BYTES),
    "mask_P": Range(0, MAX_MASK_TOKENS),
    "B": Range(1, MAX_B),
    "store_P": Range(1, MAX_P),  # a stored prefix's tokens (bounded by the context length where the model is known)
    "store_rate": Range(1e6, MAX_BANDWIDTH),  # a storage read rate, bytes/s: from a MB/s (a slow network share)
}


def limits(name: str) -> dict:
    """RANGES[name] as the OpenAPI schema's bounds (for a Query's json_schema_extra)."""
    return RANGES[name].schema()


def check_all(values: dict[str, float | None], ranges: dict[str, str]) -> None:
    """RANGES[ranges[name]].check of each value sent (None: not sent), under its own name."""
    for name, value in values.items():
        if value is not None:
            RANGES[ranges[name]].check(name, value)


# The calculator's inputs in the page's words and units: (what it is, the unit the page shows it in, its size).
CALC_WORDS = {
    "N": ("parameters", "billion", 1e9),
    "P": ("prompt tokens", "", 1.0),
    "n": ("output tokens n", "", 1.0),
    "peak": ("the peak", "TFLOP/s", 1e12),
    "mfu": ("GPU utilisation", "", 1.0),
    "bandwidth": ("memory bandwidth", "TB/s", 1e12),
    "ttft": ("TTFT", "s", 1.0),
    "itl": ("ITL", "s", 1.0),
    "store_P": ("the stored prefix", "tokens", 1.0),  # the KV-store section's inputs
    "store_rate": ("the read speed", "GB/s", 1e9),
}


def in_words(name: str, value: float) -> float:
    """RANGES[name].check for a calculator input, said as the page says it: 'parameters must be at least 0.001
    billion and at most 100,000 billion; you typed -3 billion' (not 'N must be in [1e+06, 1e+14], got -3e+09')."""
    what, unit, size = CALC_WORDS[name]
    r = RANGES[name]

    def say(x: float) -> str:
        v = x / size
        number = f"{int(v):,}" if math.isfinite(v) and abs(v) < 1e15 and v == int(v) else f"{v:,.6g}"
        word = "token" if unit == "tokens" and v == 1 else unit
        return number + (f" {word}" if word else "")

    try:
        return r.check(name, value)
    except BadInput:
        low = f"more than {say(r.lo)}" if r.lo_open else f"at least {say(r.lo)}"
        raise BadInput(f"{what} must be {low} and at most {say(r.hi)}; you typed {say(value)}") from None


def at_most_context(what: str, value: int, context: int) -> int:
    """`value` tokens, or BadInput in the page's words where it passes this model's context length."""
    if value > context:
        raise BadInput(f"{what} must be at most {context:,} tokens, this model's context length; you typed {value:,}")
    return value


def bounds(lo: float, hi: float, lo_open: bool = False) -> dict:
    """The range in_range checks, written into the OpenAPI schema (so the document says what is accepted)."""
    return {"exclusiveMinimum" if lo_open else "minimum": lo, "maximum": hi}
