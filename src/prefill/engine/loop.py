"""The step loop: schedule -> run -> sample -> accept, for one request (`prefill run`) or many (the server).

Each `step()` asks the scheduler (prefill.engine.scheduler: pure policy) which requests run and with how many
tokens, runs them as ONE forward on the model runner (decode rows and prefill chunks side by side: one GEMM per
weight per step; attention per row over that row's blocks, read in place), samples every row that needs a token
in one call with one host sync (prefill.engine.sampling), and hands each token to its request's `accept`
(prefill.engine.request): the one place a token is accepted. A failure inside a step fails the requests it
touched, never the loop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from itertools import accumulate

import torch

from prefill.engine.kv_tier import StoreTier
from prefill.engine.kvcache import KVPool
from prefill.engine.prefix_cache import PrefixCache
from prefill.engine.prompt import check_chunk_size, check_prompt
from prefill.engine.request import Event, Request
from prefill.engine.runner import ModelRunner
from prefill.engine.sampling import NothingToSample, sample_rows
from prefill.engine.scheduler import Scheduler, Step
from prefill.engine.scores import ScoreAccumulator
from prefill.errors import BadInput


class StepLoop:
    """Requests over one model runner and one KV pool. Not thread-safe: one thread calls it.

    `observer(req, event)`, if given, sees every event of every request before the request's own `emit` does
    (the server's metrics). `runner` is a ModelRunner, or anything with its run / sync / spec (the simulator's).
    """

    def __init__(
        self,
        runner: ModelRunner,
        pool: KVPool,
        prefix_cache: PrefixCache | None = None,
        chunk_size: int | None = None,
        max_running: int = 64,
        observer: Callable[[Request, Event], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        kv_tier: StoreTier | None = None,
    ) -> None:
        check_chunk_size(chunk_size)
        self.runner, self.pool, self.prefix_cache, self.observer = runner, pool, prefix_cache, observer
        self.clock = clock  # seconds: perf_counter, or a simulated clock (prefill.plan.simulate)
        self.scheduler = Scheduler(pool, prefix_cache, chunk_size, max_running, kv_tier)
        self.last_step: Step | None = None  # what the latest step ran (the server's metrics read it)

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def running(self) -> list[Request]:
        return self.scheduler.running

    @property
    def busy(self) -> bool:
        return self.scheduler.busy

    # ---- requests in ----
    def check(self, req: Request) -> None:
        """BadInput when the request can never run: its prompt (prefill.engine.prompt), or more cache positions
        than the pool could ever hold (it would wait forever). Reads nothing that changes: safe from any thread."""
        check_prompt(req.prompt_ids, self.runner.spec, max_tokens=req.max_tokens)
        if req.capacity > self.pool.max_tokens():
            raise BadInput(
                f"the request needs {req.capacity} cache positions; the KV pool holds "
                f"{self.pool.max_tokens()} (raise --kv-cache-mb or ask for fewer tokens)"
            )

    def add(self, req: Request) -> None:
        """The only way in: check the request, then queue it (admitted at a later step, first come first served)."""
        self.check(req)
        req.observer, req.clock = self.observer, self.clock
        req.enqueued = req.enqueued or self.clock()
        self.scheduler.add(req)

    # ---- one step ----
    def step(self) -> Step:
        step = self.scheduler.schedule()
        if step.rows:
            # a step holding an exact request (scoring) runs every row on float32 activations, the prompt's
            # unembedding (in _after_chunk) included
            exact = any(req.exact for req, _ in step.rows)
            with self.runner.exact() if exact else contextlib.nullcontext():
                self._run(step)
        self.scheduler.release_finished()
        self.last_step = step
        return step

    def _run(self, step: Step) -> None:
        reqs = [req for req, _ in step.rows]
        decoding = [not req.prefilling for req in reqs]  # decode rows feed their last token
        rows = [
            (req.seq, [req.next_input()] if dec else req.chunk_ids(n))
            for (req, n), dec in zip(step.rows, decoding, strict=True)
        ]
        scoring = any(req.prompt_logprobs is not None and not dec for req, dec in zip(reqs, decoding, strict=True))
        t0 = self.clock()
        try:
            out = self.runner.run(rows, "hidden" if scoring else "last")  # [N, d_model] or [R, vocab]
            if scoring:  # each row's last position among the step's N tokens
                last = torch.tensor(list(accumulate(len(ids) for _, ids in rows))) - 1  # [R]
            logits = self.runner.model.logits(out[last]) if scoring else out  # [R, vocab]
            self.runner.sync()
        except Exception as e:  # noqa: BLE001 - these requests fail, the loop goes on
            for req in reqs:
                req.fail(e)
            return
        ready = self.clock()
        sampling, offset = [], 0
        for i, ((req, n), dec) in enumerate(zip(step.rows, decoding, strict=True)):
            if not dec:
                req.gen.prefill_s += ready - t0
                req.gen.prefill_chunks.append((req.seq.length, ready - req.arrival))
                req.gen.cold = req.gen.cold or self.runner.first_of_shape
                self._after_chunk(req, out[offset : offset + n] if scoring else None, offset)
            offset += len(rows[i][1])
            if not req.done and (dec or (not req.prefilling and not req.gen.token_ids)):
                sampling.append(i)
        self._sample(reqs, logits, sampling, ready)

    def _after_chunk(self, req: Request, hidden: torch.Tensor | None, offset: int) -> None:
        """A prefill chunk ran: score its positions if asked; at the prompt's end note the cache (and share the
        prompt's blocks with the prefix cache)."""
        try:
            if req.prompt_logprobs is not None and hidden is not None:
                if req.scorer is None:
                    req.scorer = ScoreAccumulator(req.prompt_ids, self.runner.model, req.prompt_logprobs)
                req.scorer.add(hidden, req.seq.length - hidden.shape[0])
            if req.prefilling or req.gen.token_ids:
                return  # more prompt to come, or a resumed prefill (nothing new to note)
            if req.scorer is not None:
                req.gen.prompt_scores, req.scorer = req.scorer.result(), None
            if self.prefix_cache is not None:
                self.prefix_cache.insert_prefix(req.prompt_ids, req.seq, req.cache_salt)
            if self.scheduler.kv_tier is not None:
                self.scheduler.kv_tier.prefilled(req)
            req.prefilled()
        except Exception as e:  # noqa: BLE001 - this request's failure, not the loop's
            req.fail(e)

    def _sample(self, reqs: list[Request], logits: torch.Tensor, rows: list[int], ready: float) -> None:
        """One token for each of `rows` (indices into reqs / logits) in one call, one host sync; then accept."""
        if not rows:
            return
        picked = logits[torch.tensor(rows)]  # [S, vocab]
        live = []
        for j, i in enumerate(rows):
            req = reqs[i]
            try:
                if req.constraint is not None:
                    picked[j] = req.constraint.mask(picked[j])
                live.append(j)
            except Exception as e:  # noqa: BLE001 - a grammar failed for this request alone
                req.fail(e)
        if not live:
            return
        sel = [rows[j] for j in live]
        tokens, ok = sample_rows(picked[live], [reqs[i].sampling for i in sel], [reqs[i].generator for i in sel])
        chosen, good_rows = torch.stack([tokens, ok.long()]).tolist()  # the step's one host sync
        for i, j, token, good in zip(sel, live, chosen, good_rows, strict=True):
            req = reqs[i]
            try:
                if not good:
                    raise NothingToSample("no token can be sampled: every token is banned (logit_bias, grammar) or NaN")
                req.accept(token, picked[j] if req.logprobs is not None else None, ready)  # a view a row costs
            except Exception as e:  # noqa: BLE001 - sampling or detokenizing failed for this request alone
                req.fail(e)

    def close(self) -> None:
        """Fail everything still waiting or running (shutting down)."""
        for req in list(self.waiting) + list(self.running):
            req.fail(RuntimeError("the server is shutting down"))
        self.waiting.clear()
        self.scheduler.release_finished()
