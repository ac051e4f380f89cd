"""The step loop: schedule -> run -> accept, for one request (`prefill run`) or many (the server).

Each `step()`:
1. admits waiting requests while their blocks can be reserved in the shared KV pool (a request reserves its
   whole capacity, prompt + max_tokens, at admission, so it can never run out of cache mid-answer; the longest
   cached prefix of its prompt is shared from the prefix cache instead of being prefilled again);
2. runs ONE forward for every request that is decoding: B = their number, each row at its own position,
   the projections and MLP one GEMM over all rows, attention per row over that row's blocks only. Decode
   reads all the weights once per step whatever B is, so batching is what makes many streams cheap;
3. runs one chunk (at most `chunk_size` tokens) of the oldest unfinished prefill against its growing cache, so
   a long prompt delays running streams by one chunk per step rather than by its whole prefill (chunked
   prefill, as in vLLM and Sarathi-Serve).
Every logits row goes to its request's `accept` (prefill.engine.request): the one place a token is accepted.
A failure inside a step fails the requests it touched, never the loop.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import torch

from prefill.costmodel import costs
from prefill.engine.kvcache import KVPool, PoolFull
from prefill.engine.prefix_cache import PrefixCache
from prefill.engine.prompt import check_chunk_size, check_prompt
from prefill.engine.request import Event, Request
from prefill.engine.runner import ModelRunner
from prefill.engine.scoring import ScoreAccumulator, prefill_scored
from prefill.errors import BadInput


class StepLoop:
    """Waiting and running requests over one model runner and one KV pool. Not thread-safe: one thread calls it.

    `observer(req, event)`, if given, sees every event of every request before the request's own `emit` does
    (the server's metrics).
    """

    def __init__(self, runner: ModelRunner, pool: KVPool, prefix_cache: PrefixCache | None = None,
                 chunk_size: int | None = None, max_running: int = 64,
                 observer: Callable[[Request, Event], None] | None = None) -> None:  # fmt: skip
        check_chunk_size(chunk_size)
        self.runner, self.pool, self.prefix_cache = runner, pool, prefix_cache
        self.chunk_size, self.max_running, self.observer = chunk_size, max_running, observer
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []

    # ---- requests in ----
    def check(self, req: Request) -> None:
        """BadInput when the request can never run: its prompt (prefill.engine.prompt), or more cache positions
        than the pool holds (it would wait forever). Reads nothing that changes: safe from any thread."""
        check_prompt(req.prompt_ids, self.runner.spec, max_tokens=req.max_tokens)
        if self.pool.blocks_for(req.capacity) > self.pool.n_blocks:
            held = self.pool.n_blocks * self.pool.block_size
            raise BadInput(f"the request needs {req.capacity} cache positions; the KV pool holds {held} "
                           "(raise --kv-cache-mb or ask for fewer tokens)")  # fmt: skip

    def add(self, req: Request) -> None:
        """The only way in: check the request, then queue it (admitted at a later step, first come first served)."""
        self.check(req)
        req.observer = self.observer
        req.enqueued = req.enqueued or time.perf_counter()
        self.waiting.append(req)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ----
    def step(self) -> None:
        self._admit()
        self._drop_finished()
        decoding = [r for r in self.running if not r.prefilling]
        if decoding:
            self._decode(decoding)
        prefilling = [r for r in self.running if r.prefilling]
        if prefilling:
            self._prefill_chunk(prefilling[0])
        self._drop_finished()

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            if req.cancelled:
                self.waiting.popleft()
                continue
            try:
                seq = self._reserve(req)
            except PoolFull:
                return  # the oldest waits for blocks (first come, first served)
            except Exception as e:  # noqa: BLE001 - this request's failure, not the loop's
                self.waiting.popleft()
                req.fail(e)
                continue
            self.waiting.popleft()
            self.running.append(req)
            try:
                req.start(seq, self.runner.device)
            except Exception as e:  # noqa: BLE001 - e.g. a seed the generator refuses
                req.fail(e)

    def _reserve(self, req: Request):
        """Blocks for the request's whole capacity, sharing its longest cached prefix; PoolFull if they are not
        free even after evicting cached prefixes no request holds."""
        match = None
        if self.prefix_cache is not None:
            # The last token must run for logits; a scoring request runs every token (all hidden states needed).
            match = self.prefix_cache.match_prefix(req.prompt_ids[: -1 if req.prompt_logprobs is None else 0])
        prefix, n = (match.blocks, match.n_tokens) if match else ((), 0)
        need = self.pool.blocks_for(req.capacity) - len(prefix)
        if need > self.pool.free_blocks and self.prefix_cache is not None:
            self.pool.retain(prefix)  # keep the matched blocks while evicting others
            try:
                self.prefix_cache.evict(need - self.pool.free_blocks)
            finally:
                self.pool.release(prefix)
        return self.pool.new_seq(req.capacity, prefix, n)

    def _drop_finished(self) -> None:
        for req in [r for r in self.running if r.done or r.cancelled]:
            self.running.remove(req)
            if req.seq is not None:
                req.seq.free()  # shared prefix blocks stay with the prefix cache
            if req.cancelled and not req.done:
                req.done = True

    # ---- the forwards ----
    def _decode(self, reqs: list[Request]) -> None:
        ids = torch.tensor([[r.next_input()] for r in reqs])  # [B, 1]
        try:
            logits = self.runner.forward(ids, [r.seq for r in reqs])  # [B, vocab]
        except Exception as e:  # noqa: BLE001
            for r in reqs:
                r.fail(e)
            return
        for r, row in zip(reqs, logits, strict=True):
            self._accept(r, row)

    def _prefill_chunk(self, req: Request) -> None:
        start, end = costs.prefill_chunks(req.P, self.chunk_size, req.seq.length)[0]
        ids = torch.tensor([req.prompt_ids[start:end]])  # [1, T]
        t0 = time.perf_counter()
        try:
            # [1, vocab]: the chunk's last position; a scoring request unembeds every position (engine.scoring)
            scoring = req.prompt_logprobs is not None
            logits = self._score_chunk(req, ids) if scoring else self.runner.forward(ids, [req.seq])
            self.runner.sync()
        except Exception as e:  # noqa: BLE001
            return req.fail(e)
        req.gen.prefill_s += time.perf_counter() - t0
        if req.prefilling:
            return
        if self.prefix_cache is not None:
            self.prefix_cache.insert_prefix(req.prompt_ids, req.seq)
        req.prefilled()
        if not req.done:
            self._accept(req, logits[0])

    def _score_chunk(self, req: Request, ids: torch.Tensor) -> torch.Tensor | None:
        """Prefill a chunk of a scoring request; at the prompt's end, its scores go to req.gen.prompt_scores and
        the logits after the last token [1, vocab] come back (for a generated token, if any)."""
        if req.scorer is None:
            req.scorer = ScoreAccumulator(req.prompt_ids, self.runner.model, req.prompt_logprobs)
        prefill_scored(self.runner, ids[0].tolist(), req.seq, req.scorer)
        if req.prefilling:
            return None
        req.gen.prompt_scores, req.scorer = req.scorer.result(), None
        return req.gen.prompt_scores.next_logits[None]

    @staticmethod
    def _accept(req: Request, row: torch.Tensor) -> None:
        try:
            req.accept(row)
        except Exception as e:  # noqa: BLE001 - sampling or detokenizing failed for this request alone
            req.fail(e)

    def close(self) -> None:
        """Fail everything still waiting or running (shutting down)."""
        for req in list(self.waiting) + self.running:
            req.fail(RuntimeError("the server is shutting down"))
        self.waiting.clear()
        self._drop_finished()
