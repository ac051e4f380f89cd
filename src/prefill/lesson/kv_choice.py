"""The student's own compute or load: one stored prefix and one storage speed (GET /api/compute-or-load/at).

The page's KV-store section lets the student pick a prefix length (tokens) and how fast the storage reads (bytes/s:
a named kind of storage, or this machine's measured page cache and disk) and shows the two sides: the time model's
prefill of those tokens in this server's chunks, and their block files read at that rate. The decision is the
store's own (prefill.lesson.tiers.decider over prefill.costmodel.kv_store.compute_or_load); nothing is computed here.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from prefill.engine.kv_store.fingerprint import BLOCK_SIZE
from prefill.lesson.api import finite
from prefill.lesson.limits import at_most_context, in_words, limits
from prefill.lesson.state import lesson_of
from prefill.lesson.tiers import decider, store_inputs
from prefill.lesson.words import human, plural

router = APIRouter(prefix="/api", tags=["lesson: compute or load"])
# Kinds of storage the page offers, with a typical sequential read rate (bytes/s), beside this machine's measured.
STORAGE = (
    ("NVMe SSD", 3e9),
    ("SATA SSD", 5.5e8),
    ("network, 10 Gbit/s", 1.25e9),
    ("network, 1 Gbit/s", 1.25e8),
    ("hard disk", 1.5e8),
)


def times(ratio: float) -> str:
    """213.4 -> '213', 5114.2 -> '5,114', 1.234 -> '1.23'."""
    return f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.3g}"


def words(d, asked: int, rate: float, profile: str) -> str:
    """The decision in the page's words, with its numbers."""
    blocks = d.n_tokens // BLOCK_SIZE
    whole = (
        ""
        if asked == d.n_tokens
        else f" (the store keeps whole blocks of {BLOCK_SIZE}: {asked:,} tokens keep {d.n_tokens:,})"
    )
    side, fast, slow = (
        ("loading", d.load_s, d.compute_s) if d.choice == "load" else ("computing", d.compute_s, d.load_s)
    )
    return (
        f"{d.n_tokens:,} tokens stored in {plural(blocks, 'block file')}{whole}: {human(d.load_bytes, 'B')} read at "
        f"{human(rate, 'B/s')} take {human(d.load_s, 's')}; computing them again takes {human(d.compute_s, 's')} "
        f"(the time model on the {profile} profile, in this server's chunks). The store chooses {side}, "
        f"{times(slow / fast)} times faster."
    )


@router.get("/compute-or-load/at")
async def compute_or_load_at(
    request: Request,
    P: int = Query(2048, description="tokens of the stored prefix", json_schema_extra=limits("store_P")),
    rate: float = Query(3e9, description="the storage's read rate, bytes/s", json_schema_extra=limits("store_rate")),
) -> dict:
    """One stored prefix of P tokens (whole blocks) read at `rate` bytes/s against computing it again: the
    seconds of each, the bytes, and the store's choice; with the kinds of storage the page offers."""
    in_words("store_P", P)  # said as the page's boxes say them: tokens, and GB/s
    in_words("store_rate", rate)
    at_most_context("the stored prefix", P, lesson_of(request).spec.context_length)
    got = await store_inputs(request)
    if isinstance(got, dict):
        return got
    lesson, rates, profile = got
    stored = max(BLOCK_SIZE, P // BLOCK_SIZE * BLOCK_SIZE)
    d = decider(lesson, rates, profile)(stored, rate)
    storage = [{"name": n, "bytes_per_s": r} for n, r in STORAGE]
    storage.append({"name": "page cache here (measured)", "bytes_per_s": rates.ram_bytes_per_s})
    if rates.disk_bytes_per_s:
        storage.append({"name": "disk here (measured)", "bytes_per_s": rates.disk_bytes_per_s})
    return finite(
        {
            "available": True,
            "asked": P,
            "rate": rate,
            **d.as_dict(),
            "words": words(d, P, rate, profile.name),
            "storage": storage,
            "human": {
                "load": human(d.load_s, "s"),
                "compute": human(d.compute_s, "s"),
                "bytes": human(d.load_bytes, "B"),
            },
        }
    )
