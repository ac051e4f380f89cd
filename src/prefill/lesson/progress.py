"""A long prefill's real progress, chunk by chunk: GET /api/progress?P=1824.

The page sends its prompt through the OpenAI routes, which say nothing before the first token. Meanwhile it polls
this route: the step loop notes each prefill forward on the request (`Generation.prefill_chunks`: positions cached,
seconds since arrival), and the route reads those notes on the server's worker thread, between two steps, so a
chunk is reported as soon as its forward has run. The request is found by its prompt length (the newest request of
that length in the loop; the page runs one prompt at a time), so the server needs no lesson-only field.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, Query, Request

from prefill.engine.request import Request as Job
from prefill.lesson.limits import RANGES, limits
from prefill.lesson.state import lesson_of
from prefill.lesson.words import plural

router = APIRouter(prefix="/api", tags=["lesson: live model"])


def chunks_of(job: Job) -> list[dict]:
    """The forwards a request's prefill has run so far, in order: tokens first..last (0-based, inclusive) and the
    milliseconds from the request's arrival to the end of that forward."""
    out, first = [], job.gen.cached_tokens
    for k, (cached, t_s) in enumerate(list(job.gen.prefill_chunks)):
        out.append({"k": k + 1, "first": first, "last": cached - 1, "t_ms": 1e3 * t_s})
        first = cached
    return out


def progress_of(job: Job | None, P: int, chunk_size: int | None) -> dict:
    """What the loop knows of the newest request of P prompt tokens: queued, prefilling (the chunks done, of how
    many), or decoding; `words` says it in the page's words ("chunk 2 of 8 done at 96 ms (tokens 256-511)")."""
    if job is None:
        return {"state": "not seen", "P": P, "chunks": [], "of": 0, "words": f"no request of {P} tokens is running"}
    chunks = chunks_of(job)
    done = chunks[-1]["last"] + 1 if chunks else job.gen.cached_tokens
    step = chunk_size or P
    of = len(chunks) + -(-max(0, P - done) // step)  # the forwards run, and those the rest will take
    state = "queued" if job.seq is None and not chunks else "prefilling" if done < P else "prefilled"
    if not chunks:
        words = f"{state}: no chunk has run yet ({plural(of, 'forward')} to go)"
    else:
        c = chunks[-1]
        words = f"chunk {c['k']} of {of} done at {c['t_ms']:,.0f} ms (tokens {c['first']}-{c['last']})"
    return {"state": state, "P": P, "cached": job.gen.cached_tokens, "chunks": chunks, "of": of, "words": words}


def newest(jobs: Iterable[Job], P: int) -> Job | None:
    """The request of P prompt tokens that arrived last, or None."""
    mine = [j for j in jobs if j.P == P]
    return max(mine, key=lambda j: j.arrival) if mine else None


@router.get("/progress")
async def progress(
    request: Request, P: int = Query(description="the prompt's tokens", json_schema_extra=limits("P"))
) -> dict:
    """The prefill progress of the newest request of P prompt tokens in the server's step loop: each chunk's
    tokens and when its forward ended (ms after the request arrived), read between two steps."""
    RANGES["P"].check("P", P)
    lesson = lesson_of(request)
    return await lesson.run(lambda: progress_of(newest(lesson.requests(), P), P, lesson.chunk_size))
