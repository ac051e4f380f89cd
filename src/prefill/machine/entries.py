"""A probe's measurements (an "entry": GEMM curves, attention curves, bandwidth, overhead) as plain data: checked
for what no idle machine produces, and merged point by point over several probes.

    implausible(entry)        what in it no idle machine produces (other processes took the cores), or None
    median_entry(entries)     the point-wise medians of several probes' entries
    best_entry(entries)       the point-wise fastest of several probes' entries (other load only slows a probe)
    undisturbed(entry, measure)  an entry, probed again where other processes disturbed it
    curve_points(rows)        a curve's [[size, rate], ...] as a tuple of (int, float)
    entry_key(device, threads, dtype)  the cache's name of this machine's entry in a dtype
    stamp(), current(entry)   an entry's probe version and kernels, and whether they are this code's (else
                              it is measured again)
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

from prefill.costmodel.costs import canonical_dtype
from prefill.device.cache import machine_key

PROBE_VERSION = 16  # entries of another version are measured again (its history: `git log -p` of this line)
PROBE_RETRIES = 2  # probes more when one is disturbed (implausible), their point-wise fastest kept


def curve_points(rows: list) -> tuple[tuple[int, float], ...]:
    return tuple((int(n), float(r)) for n, r in rows)


def median_entry(entries: list[dict]) -> dict:
    """The point-wise median of several probes' entries: each curve at the sizes every probe reached (a probe
    in a slow second stops its curve earlier), each scalar the median of its values."""

    def curve(lists: list) -> list:
        rates = [dict(curve_points(rows)) for rows in lists]
        sizes = sorted(set.intersection(*(set(r) for r in rates)))
        return [[n, statistics.median(r[n] for r in rates)] for n in sizes]

    first = entries[0]
    out = {k: statistics.median(e[k] for e in entries) for k, v in first.items() if isinstance(v, int | float)}
    out["gemm"] = {name: curve([e["gemm"][name] for e in entries]) for name in first["gemm"]}
    out["attention"] = {
        heads: {
            part: curve([e["attention"][heads][part] for e in entries if part in e["attention"].get(heads, {})])
            for part in ("prefill", "decode")
        }
        for heads in first["attention"]
    }
    return out


FASTEST_SCALARS = {"bandwidth_bytes_per_s": max, "cache_bandwidth_bytes_per_s": max, "op_overhead_s": min}


def best_entry(entries: list[dict]) -> dict:
    """The point-wise fastest of several probes' entries of the same shapes: each curve at every size any probe
    reached, its highest rate; the bandwidths their highest, the launch overhead its lowest. Other processes on
    the cores can only slow a measurement down (a parallel kernel waits a scheduler slice for its second thread),
    so on a busy machine the fastest of a few probes is the nearest to what the machine does."""

    def curve(lists: list) -> list:
        rates: dict[int, float] = {}
        for rows in lists:
            for n, r in curve_points(rows):
                rates[n] = max(rates.get(n, 0.0), r)
        return [[n, rates[n]] for n in sorted(rates)]

    out = dict(entries[0])
    for key, pick in FASTEST_SCALARS.items():
        values = [e[key] for e in entries if e.get(key) is not None]
        if values:
            out[key] = pick(values)
    out["gemm"] = {name: curve([e["gemm"][name] for e in entries if name in e["gemm"]]) for name in out["gemm"]}
    out["attention"] = {
        heads: {
            part: curve([e["attention"][heads][part] for e in entries if part in e["attention"].get(heads, {})])
            for part in ("prefill", "decode")
        }
        for heads in out["attention"]
    }
    return out


def implausible(entry: dict) -> str | None:
    """What in a probe's measurements no idle machine produces (other processes took the cores meanwhile: a
    parallel kernel then waits a whole scheduler slice for its second thread), or None. A GEMM at a few rows is
    never much slower per FLOP than at one row, nor, reading the same weights for M times the FLOPs, more than
    M times faster; and the cache is never slower than memory."""
    for name, points in entry.get("gemm", {}).items():
        rates = dict(curve_points(points))
        K, N = name.split(":")[0].split("x")
        slow = [m for m, r in rates.items() if 1 < m <= 64 and 1 in rates and r < 0.5 * rates[1]]
        if slow:
            return (
                f"the probe's GEMM of {slow[0]} rows at K={K}, N={N} ran {rates[1] / rates[slow[0]]:.0f}x slower per "
                "FLOP than of one row: other processes were using the cores"
            )
        stalled = [m for m, r in rates.items() if 1 < m <= 64 and 1 in rates and r > 2 * m * rates[1]]
        if stalled:
            m = stalled[0]
            return (
                f"the probe's GEMM of one row at K={K}, N={N} ran {rates[m] / rates[1] / m:.0f}x slower per weight "
                f"read than of {m} rows: other processes were using the cores"
            )
    cache, memory = entry.get("cache_bandwidth_bytes_per_s"), entry.get("bandwidth_bytes_per_s")
    if cache and memory and 4 * cache < memory:  # bfloat16's conversions: 0.7x memory on the AMX Xeon, not 0.25x
        return "the probe measured elementwise work 4x slower than memory reads: other processes were using the cores"
    return None


def undisturbed(entry: dict, measure: Callable[[dict], object], echo: Callable[[str], None] | None) -> dict:
    """`entry`, or where other processes disturbed it (implausible), the point-wise fastest (best_entry) of it and
    up to PROBE_RETRIES fresh probes (`measure(e)` fills an empty entry e), with a warning to `echo` if even that
    still looks disturbed."""
    entries = [entry]
    while (busy := implausible(best_entry(entries))) and len(entries) <= PROBE_RETRIES:
        if echo is not None:
            echo(f"the probe was disturbed ({busy}): probing again, keeping each point's fastest")
        entries.append({})
        measure(entries[-1])
    if busy and echo is not None:
        echo(f"warning: {busy}; predictions will be off: run `prefill calibrate` again on an idle machine")
    return best_entry(entries)


def entry_key(device: str, threads: int | None, dtype: str) -> str:
    """The cache's name of this machine's entry (or fit) in `dtype` with `threads` CPU threads."""
    return f"{machine_key(device, threads)}|{canonical_dtype(dtype)}"


@functools.cache
def kernels() -> str:
    """The engine's kernel library these sources build (its name carries their digest): the probe timed them, so
    a measurement of other kernels is measured again. Once per process (it hashes the sources)."""
    from prefill.model.quant.build import library_name

    return library_name()


def stamp() -> dict:
    """What an entry or a fit is stored with, for current() to check: this probe version and these kernels."""
    return {"version": PROBE_VERSION, "kernels": kernels()}


def current(entry: dict) -> bool:
    """Was `entry` (a probe's or a fit's) made by this probe version, on these kernels?"""
    return entry.get("version") == PROBE_VERSION and entry.get("kernels") == kernels()
