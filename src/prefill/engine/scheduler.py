"""The scheduling policy: which requests run in the next step, with how many tokens each. Pure policy, no torch.

Each `schedule()` (as vLLM v1 and Sarathi-Serve schedule):
1. every running request that is decoding gets one token (one row of the step's single forward; the simulator's
   engine rules may count these rows against the budget, or run a step with prefill work without them);
2. requests still prefilling get chunks of their prompt, oldest first, within the step's prefill budget of
   `chunk_size` tokens (so a long prompt delays running streams by one chunk per step, not its whole prefill);
3. waiting requests are admitted, first come first served, while the budget and `max_running` allow and the
   pool has blocks for their first chunk; the longest cached prefix of a prompt is shared from the prefix cache
   instead of being computed again.
Blocks are allocated as tokens arrive, not reserved up front. When a running request needs a block and none is
free, blocks cached by the prefix cache that no request holds are evicted first; then the newest running request
is preempted: its blocks go back (its computed ones offered to the prefix cache first), it returns to the head of
the queue, and its prefill is recomputed when it is admitted again (vLLM's recompute preemption). The oldest
request is never preempted for a newer one, so every request that fits the pool alone completes.

With a KV store (prefill.engine.kv_tier), admission may load a request's stored prefix, or start loading its
tail while its head is computed (both from opposite ends): its prefill then stops at the split until the tail
is in, and a step with nothing else to run waits for it.

The step loop (prefill.engine.loop) runs the schedule on the model; the simulator (prefill.plan.simulate) runs
the same policy with a simulated clock.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prefill.engine.blocks import PoolFull

if TYPE_CHECKING:
    from prefill.engine.kv_tier import StoreTier
    from prefill.engine.kvcache import KVPool
    from prefill.engine.prefix_cache import PrefixCache
    from prefill.engine.request import Request


@dataclass
class Step:
    """One step's work: rows [(request, tokens)] in order (decode rows first), and the requests preempted."""

    rows: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.rows)


class Scheduler:
    """Waiting and running requests over one KV pool; `schedule()` says what the next forward runs."""

    def __init__(
        self,
        pool: KVPool,
        prefix_cache: PrefixCache | None = None,
        chunk_size: int | None = None,
        max_running: int = 64,
        kv_tier: StoreTier | None = None,
    ) -> None:
        self.pool, self.prefix_cache = pool, prefix_cache
        self.kv_tier = kv_tier  # the KV store below the prefix cache (prefill.engine.kv_tier), or None
        self.chunk_size, self.max_running = chunk_size, max_running
        # A GPU engine's rules, which the simulator sets (prefill.costmodel.engines); the defaults are ours:
        # decode_in_budget: decode rows count against chunk_size (vLLM's max_num_batched_tokens); mixed: prefill
        # chunks share a step with decode rows (False: a step with prefill work runs only that, as SGLang's).
        self.decode_in_budget, self.mixed = False, True
        # prefill_cap: at most this many of one request's prompt tokens a step (vLLM's long_prefill_token_threshold)
        self.prefill_cap: int | None = None
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.preemptions = 0  # since the start

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    # ---- one step ----
    def schedule(self) -> Step:
        self.release_finished()
        step = Step()
        if not self.mixed:  # a step with prefill work runs only that (SGLang's default); else the decode rows
            self._prefill(step, self.chunk_size or float("inf"))
            if not step.rows:
                self._decode(step)
        else:
            self._decode(step)
            budget = (self.chunk_size or float("inf")) - (len(step.rows) if self.decode_in_budget else 0)
            self._prefill(step, budget)
        if not step.rows and self.kv_tier is not None and self.kv_tier.wait_for_tail(self.running):
            return self.schedule()  # only a loading tail was left to wait for: it is in now
        return step

    def _decode(self, step: Step) -> None:
        """One token for every running request that is decoding."""
        for req in list(self.running):  # a request preempted by an older one's growth has no seq any more
            if req.seq is not None and not req.prefilling and self._grow(req, req.seq.length + 1, step):
                step.rows.append((req, 1))

    def _prefill(self, step: Step, budget: float) -> None:
        """Chunks of the prefilling requests, oldest first, then admissions, within `budget` tokens."""
        for req in list(self.running):
            if budget <= 0:
                break
            if req.prefilling:  # False for a request preempted meanwhile (no seq)
                budget -= self._chunk(req, budget, step)
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            if self.waiting[0].cancelled or self.waiting[0].done:
                self.waiting.popleft()
                continue
            if not self._admit(self.waiting[0]):
                break  # the oldest waits for blocks (first come, first served)
            req = self.waiting.popleft()
            self.running.append(req)
            budget -= self._chunk(req, budget, step)

    def _chunk(self, req: Request, budget: float, step: Step) -> int:
        """Schedule the next chunk of a prefilling request (at most `budget` tokens); returns its tokens."""
        target = req.cached_target
        if self.kv_tier is not None:  # stops at the split while its stored tail loads
            target = self.kv_tier.prefill_target(req, target)
        n = int(min(target - req.seq.length, budget, self.prefill_cap or budget))
        if n > 0 and self._grow(req, req.seq.length + n, step):
            step.rows.append((req, n))
            return n
        return 0

    def _admit(self, req: Request) -> bool:
        """Give the oldest waiting request its cache: the longest cached prefix, shared; False when the pool has
        no blocks for its first chunk even after evicting unheld cached prefixes (it waits; nobody is preempted
        for a newcomer)."""
        seq = self._new_seq(req)
        first = min(
            req.cached_target,
            seq.length + min(self.chunk_size or req.cached_target, self.prefill_cap or req.cached_target),
        )
        if not self._fits(seq.reserve_needs(first)):
            seq.free()
            return False
        if self.kv_tier is not None:  # stored blocks beyond the RAM match, when loading beats computing them
            self.kv_tier.admit(req, seq, self._fits, self.chunk_size)
        req.start(seq)
        return True

    def _new_seq(self, req: Request):
        match = None
        if self.prefix_cache is not None:
            match = self.prefix_cache.match_prefix(req.reusable_ids(), req.cache_salt)
        if match is None or not match.n_tokens:
            return self.pool.new_seq()
        return self.pool.new_seq([match.blocks], match.n_tokens)

    def _fits(self, needs: list[int]) -> bool:
        """Are `needs` fresh blocks (one count per layer group) free, after evicting unheld cached prefixes?"""
        short = sum(max(0, n - m.free_blocks) for n, m in zip(needs, self.pool.managers, strict=True))
        if short and self.prefix_cache is not None:
            self.prefix_cache.evict(short)
        return all(n <= m.free_blocks for n, m in zip(needs, self.pool.managers, strict=True))

    def _grow(self, req: Request, end: int, step: Step) -> bool:
        """Blocks for req's positions up to `end`, preempting newer requests while they are short; False when
        req itself had to be preempted (it was the newest)."""
        while True:
            needs = req.seq.reserve_needs(end)
            if not any(needs):  # the blocks it holds cover `end` (a decode step's usual case)
                return True
            if self._fits(needs):
                try:
                    req.seq.reserve(end)
                    return True
                except PoolFull:  # pragma: no cover - _fits just checked every group
                    pass
            victim = self.running[-1]
            self._preempt(victim, step)
            if victim is req:
                return False

    def _preempt(self, req: Request, step: Step) -> None:
        if self.kv_tier is not None:
            self.kv_tier.abandon(req)  # a tail still loading into its blocks stops first
        if self.prefix_cache is not None and req.seq.length:
            self.prefix_cache.insert_prefix(req.all_ids()[: req.seq.length], req.seq, req.cache_salt)
        req.seq.free()
        req.preempted()
        self.running.remove(req)
        self.waiting.appendleft(req)
        step.rows = [(r, n) for r, n in step.rows if r is not req]
        step.preempted.append(req)
        self.preemptions += 1

    def release_finished(self) -> None:
        """Let go of the requests that finished, failed or were cancelled since the last step."""
        for req in [r for r in self.running if r.done or r.cancelled]:
            self.finish(req)

    def finish(self, req: Request) -> None:
        """A request left the running set (done, cancelled or failed): its blocks go back (a shared prefix stays
        with the prefix cache)."""
        if req in self.running:
            self.running.remove(req)
        if req.seq is not None:
            if self.kv_tier is not None:
                self.kv_tier.abandon(req)  # a tail still loading into its blocks stops first
                if req.seq.length:
                    self.kv_tier.save(req)  # its whole blocks, to the store (written in the background)
            req.seq.free()
        if req.cancelled and not req.done:
            req.done = True
