"""The scheduling policy on its own (no model): token budget, admission, blocks as tokens arrive, preemption."""

import torch

from prefill.engine.kvcache import KVPool
from prefill.engine.request import Request
from prefill.engine.sampling import SamplingParams
from prefill.engine.scheduler import Scheduler


def pool(n_blocks: int, bs: int = 4) -> KVPool:
    return KVPool(2, 1, 4, n_blocks, torch.float32, "meta", block_size=bs)  # accounting only: no memory


def request(P: int, max_tokens: int = 8) -> Request:
    return Request(list(range(1, P + 1)), max_tokens, SamplingParams(), None, lambda ev: None)


def run(sched: Scheduler, step) -> None:
    """Pretend the step ran as the loop runs it: positions filled; a decode row, or a first prefill that just
    completed, gains a token (a resumed prefill does not: its next input is known)."""
    for req, n in step.rows:
        decoding, fresh = not req.prefilling, not req.gen.token_ids
        req.seq.length += n
        if decoding or (fresh and not req.prefilling):
            req.gen.token_ids.append(7)
            if len(req.gen.token_ids) >= req.max_tokens:
                req.done = True


def test_decode_rows_first_then_prefill_chunks_within_the_budget():
    sched = Scheduler(pool(64), chunk_size=8)
    a, b = request(10), request(5)
    sched.add(a)
    sched.add(b)
    step = sched.schedule()
    assert [(r, n) for r, n in step.rows] == [(a, 8)]  # the budget: 8 prompt tokens a step
    run(sched, step)
    step = sched.schedule()
    assert [(r, n) for r, n in step.rows] == [(a, 2), (b, 5)]  # two prompts share a step's budget
    run(sched, step)
    step = sched.schedule()
    assert [(r, n) for r, n in step.rows] == [(a, 1), (b, 1)]  # both decode: one row each, one forward
    assert a.seq.length == 10 and len(a.seq.blocks) == 3  # blocks for positions 0..10: as tokens arrive


def test_the_newest_request_is_preempted_and_resumes_first():
    sched = Scheduler(pool(6), chunk_size=None)  # 6 blocks of 4 = 24 positions
    a, b = request(9, max_tokens=12), request(9, max_tokens=12)
    sched.add(a)
    sched.add(b)
    step = sched.schedule()
    assert [n for _, n in step.rows] == [9, 9]  # both fit: 3 blocks each
    run(sched, step)
    for _ in range(3):  # positions 9 .. 11: still within the third block
        run(sched, sched.schedule())
    step = sched.schedule()  # a needs a 4th block: none free, so b (the newest) goes back to the queue
    assert step.preempted == [b] and [r for r, _ in step.rows] == [a]
    assert b.seq is None and sched.waiting[0] is b and sched.preemptions == 1
    tokens_b = list(b.gen.token_ids)
    while not a.done:
        run(sched, sched.schedule())
    sched.release_finished()
    step = sched.schedule()  # b is readmitted and recomputes its prompt and every token it made but the last
    assert step.rows == [(b, 9 + len(tokens_b) - 1)] and b.cached_target == 9 + len(tokens_b) - 1
    run(sched, step)
    assert not b.prefilling and b.gen.token_ids == tokens_b  # nothing was sampled at the resumed prefill


def test_a_request_that_fits_alone_always_completes():
    sched = Scheduler(pool(8), chunk_size=4)  # 32 positions
    reqs = [request(5, max_tokens=20) for _ in range(6)]  # each needs 24 positions: one at a time at the end
    for r in reqs:
        sched.add(r)
    for _ in range(500):
        if not sched.busy:
            break
        run(sched, sched.schedule())
        sched.release_finished()
    assert all(r.done for r in reqs) and sched.pool.used_blocks == 0
    assert sched.preemptions > 0
