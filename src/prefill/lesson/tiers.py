"""The lesson page's "compute or load": the K/V of a stored prefix read back from the KV store (its RAM tier, the
page cache, or its disk) against the prefill that would compute them again, over the prompt length, on this machine.

GET /api/compute-or-load: for prefixes of P tokens (whole blocks, from one block to the context length), the time
model's prefill of P tokens as the store's own decision predicts it (this server's chunk size, this machine's
profile) beside the seconds to read their block files at the store's measured rates: those of the server's store
when it runs with --kv-store, else the store's probe in a temporary directory, once per server, on the worker
thread. Also the lengths where the answer flips and the slowest read rate at which loading still wins everywhere.
Every formula is prefill.costmodel.kv_store's; the page draws what this returns.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from fastapi import APIRouter, Request

from prefill.costmodel.kv_store import LoadDecision, break_even_rate, choice_flips, compute_or_load
from prefill.engine.kv_store import Fingerprint, KVStore, StoreBandwidth, probe_bandwidth
from prefill.engine.kv_store.fingerprint import BLOCK_SIZE
from prefill.engine.kv_store.format import file_size
from prefill.engine.kv_tier import PROBE_BYTES
from prefill.lesson.api import finite
from prefill.lesson.state import LessonState, lesson_of
from prefill.lesson.words import human

MAX_P = 32768  # the curve's longest prefix (or the context length, if shorter)
router = APIRouter(prefix="/api", tags=["lesson: compute or load"])


@dataclass(frozen=True)
class Rates:
    """How fast this machine reads block files back: from the page cache and from the disk (None where the OS
    cannot drop a file's cached pages), the bytes of one block file, and where the rates come from."""

    ram_bytes_per_s: float
    disk_bytes_per_s: float | None
    block_file_bytes: int
    source: str


def measure_rates(lesson: LessonState) -> Rates | None:
    """On the worker thread: the server's store's rates, or the same probe in a temporary directory (removed
    after); None when nothing could be measured (then the page says so)."""
    engine, L = lesson.engine, lesson.spec.L
    tier = engine.kv_store
    if tier is not None:
        where, bw, fp = f"this server's KV store ({tier.store.directory})", tier.bandwidth, tier.store.fp
    else:
        fp = Fingerprint("lesson-probe", lesson.spec, lesson.dtype)
        with tempfile.TemporaryDirectory(prefix="prefill-tiers-") as d:
            store = KVStore(d, fp, max_bytes=4 * PROBE_BYTES)
            try:
                bw: StoreBandwidth | None = probe_bandwidth(store, PROBE_BYTES)
            finally:
                store.close()
        where = f"probed in {tempfile.gettempdir()} (this server runs without --kv-store)"
    if bw is None:
        return None
    source = f"{where}: {bw.n_blocks} block files, {human(bw.nbytes, 'B')} read cold and again from the page cache"
    return Rates(bw.ram_bytes_per_s, bw.disk_bytes_per_s, file_size(fp, L), source)


class StoreRates:
    """The rates, measured once per server on the page's first ask (and again after a failure)."""

    def __init__(self, lesson: LessonState) -> None:
        self.lesson = lesson
        self._rates: Future | None = None

    async def get(self) -> Rates | None:
        if self._rates is None or (self._rates.done() and self._rates.exception() is not None):
            self._rates = self.lesson.on_worker(lambda: measure_rates(self.lesson))
        return await asyncio.wrap_future(self._rates)


def lengths(block: int, context: int) -> list[int]:
    """Prefix lengths from one block to min(context, MAX_P): powers of two and 1.5 times them, whole blocks."""
    top = min(context, MAX_P) // block * block
    out, n = set(), block
    while n <= top:
        out |= {n, n * 3 // 2 // block * block}
        n *= 2
    return sorted(p for p in out | {top} if block <= p <= top)


def explanation(
    points: list[dict], tiers: dict, break_even: tuple[float, int], rates: Rates, lesson: LessonState
) -> str:
    """Which side wins where, in plain words, with the curve's own numbers."""
    per_token = rates.block_file_bytes / BLOCK_SIZE
    mid = min(points, key=lambda p: abs(p["P"] - 2048))
    parts = [
        f"Each token's K and V take {human(per_token, 'B')} in the store ({lesson.spec.L} layers of "
        f"{lesson.spec.H_kv} KV heads of {lesson.spec.d_head} values, {lesson.dtype}, and the block's header). "
        f"A prefix of {mid['P']:,} tokens is {human(mid['bytes'], 'B')}: "
        f"{human(mid['ram_s'], 's')} from the page cache"
        + (f", {human(mid['disk_s'], 's')} from the disk" if mid["disk_s"] is not None else "")
        + f", against {human(mid['compute_s'], 's')} to compute."
    ]
    first, last = points[0]["P"], points[-1]["P"]
    for name, tier in tiers.items():
        if tier is None:
            continue
        if not tier["flips"]:
            side = "loading" if points[0][f"{name}_choice"] == "load" else "computing"
            parts.append(f"From the {tier['label']}, {side} wins at every length from {first:,} to {last:,} tokens.")
        else:
            at = ", ".join(f"{P:,}" for P in tier["flips"])
            parts.append(f"From the {tier['label']}, the faster side changes at P = {at}.")
    parts.append(
        f"Computing pays for reading every weight once a forward and for every token's FLOPs; loading pays bytes "
        f"only. Computing would win at some length on this machine only from storage slower than "
        f"{human(break_even[0], 'B/s')}, and first at P = {break_even[1]:,}, where a prefill costs least per byte of "
        "K/V."
    )
    return " ".join(parts)


def decider(lesson: LessonState, rates: Rates, profile) -> Callable[[int, float], LoadDecision]:
    """The store's decision for a stored prefix of P tokens (whole blocks) read at `rate` bytes/s, as
    StoreTier.load makes it: (P, rate) -> LoadDecision, each P's prefill predicted once (this server's chunks)."""

    @functools.cache
    def prefill_s(P: int) -> float:
        return lesson.engine.predict_prefill(P, 0, lesson.chunk_size, profile=profile).seconds

    def decide(P: int, rate: float) -> LoadDecision:
        return compute_or_load(P, 0, P // BLOCK_SIZE * rates.block_file_bytes, rate, lambda n, past: prefill_s(n))

    return decide


def curve(lesson: LessonState, rates: Rates, profile) -> tuple[list[int], list[dict], Callable]:
    """The prefix lengths, each one's predicted prefill and loads with the store's choice for each tier, and the
    decision itself (decider)."""
    decide = decider(lesson, rates, profile)
    grid, points, disk = lengths(BLOCK_SIZE, lesson.spec.context_length), [], rates.disk_bytes_per_s
    for P in grid:
        ram = decide(P, rates.ram_bytes_per_s)
        on_disk = decide(P, disk) if disk else None
        points.append(
            {
                "P": P,
                "bytes": ram.load_bytes,
                "compute_s": ram.compute_s,
                "ram_s": ram.load_s,
                "ram_choice": ram.choice,
                "disk_s": on_disk.load_s if on_disk else None,
                "disk_choice": on_disk.choice if on_disk else None,
            }
        )
    return grid, points, decide


async def store_inputs(request: Request):
    """(the lesson, the store's measured read rates, this machine's profile) for a compute-or-load answer, or the
    page's {"available": False, "note": why} where this server keeps no store (sliding-window layers) or no read
    rate could be measured."""
    lesson = lesson_of(request)
    spec = lesson.spec
    if any(w is not None for w in spec.windows):
        return {"available": False, "note": f"{spec.name} has sliding-window layers: it is served without a KV store."}
    rates = await lesson.part(StoreRates).get()
    if rates is None:
        return {"available": False, "note": "No read rate could be measured here (the directory was not writable)."}
    return lesson, rates, await lesson.profile()


@router.get("/compute-or-load")
async def compute_or_load_curve(request: Request) -> dict:
    """For stored prefixes of P tokens: the predicted prefill (this server's chunk size, this machine's profile)
    beside the seconds to read their K/V back from the page cache and from the disk at rates measured here, the
    choice the store makes for each, the lengths where it flips, and the slowest storage at which loading still
    wins at every P."""
    got = await store_inputs(request)
    if isinstance(got, dict):
        return got
    lesson, rates, profile = got
    grid, points, decide = curve(lesson, rates, profile)
    break_even, at = break_even_rate([p["bytes"] for p in points], [p["compute_s"] for p in points])
    at_P = points[at]["P"]

    def tier(label: str, rate: float | None) -> dict | None:
        if rate is None:
            return None
        flips = choice_flips(grid, lambda P: decide(P, rate).choice == "load", BLOCK_SIZE)
        return {"label": label, "bytes_per_s": rate, "flips": flips}

    tiers = {"ram": tier("page cache", rates.ram_bytes_per_s), "disk": tier("disk", rates.disk_bytes_per_s)}
    return finite(
        {
            "available": True,
            "block_tokens": BLOCK_SIZE,
            "block_file_bytes": rates.block_file_bytes,
            "points": points,
            "ram": tiers["ram"],
            "disk": tiers["disk"],
            "break_even_bytes_per_s": break_even,
            "break_even_P": at_P,
            "rates_source": rates.source,
            "profile": profile.name,
            "explanation": explanation(points, tiers, (break_even, at_P), rates, lesson),
            "human": {
                "per_token": human(rates.block_file_bytes / BLOCK_SIZE, "B"),
                "ram": human(rates.ram_bytes_per_s, "B/s"),
                "disk": human(rates.disk_bytes_per_s, "B/s") if rates.disk_bytes_per_s else "not measurable here",
                "break_even": human(break_even, "B/s"),
            },
        }
    )
