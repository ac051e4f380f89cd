"""One request's life, and the one place where a token is accepted.

A `Request` holds the prompt ids, the generated ids, the sampling parameters and their seeded generator, the
stop rule, the streaming detokenizer, the timings and the finish reason. Whoever runs the forward passes (the
step loop, for `prefill run` and the server alike) masks each row's logits by the request's constraint, samples
every row in one call and hands each token to `Request.accept`, which decides: emit text, stop (EOS, a stop
string, the token limit, a finished grammar), or go on. Events go out through the request's `emit` callback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from prefill.engine.kvcache import SeqKV
from prefill.engine.sampling import SamplingParams
from prefill.engine.streaming import TextStream
from prefill.errors import BadInput
from prefill.loading.tokenizer import Tokenizer

if TYPE_CHECKING:
    from prefill.engine.kv_tail import StoreUse
    from prefill.engine.scores import ScoreAccumulator, Scores


class Constraint(Protocol):
    """A rule on which tokens may come next (a grammar for structured output)."""

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [vocab] float32 -> the same with forbidden tokens at -inf."""

    def accept(self, token_id: int) -> None:
        """Advance past the chosen token."""

    def done(self) -> bool:
        """True when the output is complete (the request stops)."""


@dataclass
class TokenEvent:
    """One generated token: its id, the text it adds (after stop-string hold-back), seconds since arrival, the
    K/V bytes the request holds at that moment, and its log-probability (with top alternatives) when asked."""

    token_id: int
    text: str
    t: float
    kv_bytes: int = 0
    kv_tokens: int = 0  # positions the request's cache holds at that moment
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class Generation:
    """A finished request with its measured timings (seconds)."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"  # "stop" (EOS, stop string, finished grammar) | "length"
    eos_id: int | None = None  # the EOS token the model generated to end (not in token_ids, never emitted)
    queue_s: float = 0.0
    tokenize_s: float = 0.0
    prefill_s: float = 0.0  # compute seconds of this request's prefill forwards
    # After each prefill forward (chunk), in order: (positions cached then, seconds since arrival). A caller on the
    # loop's thread may read it while the prefill runs (the lesson page's progress line).
    prefill_chunks: list[tuple[int, float]] = field(default_factory=list)
    cold: bool = False  # one of them was its thread's first forward of that many tokens (ModelRunner.run)
    first_token_s: float = 0.0  # sampling the first token from the prefill's logits
    ttft_s: float = 0.0  # arrival -> first token ready
    itl_s: list[float] = field(default_factory=list)
    total_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache or the KV store, not this prefill
    kv_store: StoreUse | None = None  # the KV store's compute-or-load decision and what it loaded, if a store looked
    kv_bytes: int = 0  # K/V bytes held right after the prefill (measured off the cache)
    kv_shape: tuple[int, int, int, int] = (0, 0, 0, 0)  # one layer's K as filled then: [B, H_kv, P, d_head]
    logprobs: list[TokenEvent] = field(default_factory=list)  # per generated token (EOS too), when asked
    prompt_scores: Scores | None = None  # every prompt position's log-probability, when asked (echo)

    @property
    def P(self) -> int:
        return len(self.prompt_ids)

    def timings(self) -> dict[str, float | list[float] | list[dict] | dict]:
        out = {
            "queue_s": self.queue_s,
            "tokenize_s": self.tokenize_s,
            "prefill_s": self.prefill_s,
            "cold": self.cold,
            "first_token_s": self.first_token_s,
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
            "itl_s": list(self.itl_s),
        }
        if len(self.prefill_chunks) > 1:  # a chunked prefill: each chunk's positions and when its forward ended
            firsts = [self.cached_tokens] + [n for n, _ in self.prefill_chunks[:-1]]
            out["prefill_chunks"] = [
                {"first": a, "last": n - 1, "t_s": t} for a, (n, t) in zip(firsts, self.prefill_chunks, strict=True)
            ]
        if self.kv_store is not None:
            out["kv_store"] = self.kv_store.as_dict()
        return out


@dataclass(frozen=True)
class Failed:
    """The request could not be served; `error` is the exception (a BadInput is the client's fault)."""

    message: str
    error: BaseException | None = None


Event = TokenEvent | Generation | Failed


@dataclass(eq=False)
class Request:
    """A generation request as the step loop sees it. `emit` is called from whichever thread runs the loop."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    tokenizer: Tokenizer | None
    emit: Callable[[Event], None]
    stop: tuple[str, ...] = ()
    arrival: float = field(default_factory=time.perf_counter)
    tokenize_s: float = 0.0
    constraint: Constraint | None = None
    logprobs: int | None = None  # record the chosen token's log-probability and this many alternatives
    prompt_logprobs: int | None = None  # score every prompt position, with this many alternatives (engine.scoring)
    ignore_eos: bool = False  # keep going past EOS to max_tokens (vLLM's benchmark option)
    cache_salt: str | None = None  # vLLM's: cached prefixes are shared only with requests of the same salt
    exact: bool = False  # run its steps on float32 activations (a scoring request: ModelRunner.exact)
    cancelled: bool = False  # set by the caller (a client went away); the loop drops the request
    clock: Callable[[], float] = time.perf_counter  # seconds; the loop's (a simulation's clock is simulated)
    # ---- state, set by the loop ----
    observer: Callable[[Request, Event], None] | None = None  # the loop's sink: sees each event before `emit`
    seq: SeqKV | None = None
    enqueued: float = 0.0
    done: bool = False
    generator: torch.Generator | None = None
    scorer: ScoreAccumulator | None = None  # collects the prompt's log-probabilities chunk by chunk
    n_preemptions: int = 0
    gen: Generation = field(init=False)
    _stream: TextStream | None = field(default=None, init=False)
    _last_token_at: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.gen = Generation(prompt_ids=list(self.prompt_ids), tokenize_s=self.tokenize_s)

    def _send(self, event: Event) -> None:
        if self.observer is not None:
            self.observer(self, event)
        self.emit(event)

    # ---- what the scheduler asks ----
    @property
    def P(self) -> int:
        return len(self.prompt_ids)

    @property
    def capacity(self) -> int:
        """Cache positions this request may need: the prompt and every generated token but the last."""
        return self.P + max(0, self.max_tokens - 1)

    @property
    def cached_target(self) -> int:
        """Positions that must be in the cache before the next decode step: the prompt, and after a preemption
        also every generated token but the last (which is the next step's input)."""
        return self.P + max(0, len(self.gen.token_ids) - 1)

    @property
    def prefilling(self) -> bool:
        return self.seq is not None and self.seq.length < self.cached_target

    def all_ids(self) -> list[int]:
        """Prompt and generated tokens: position p holds all_ids()[p]."""
        return self.prompt_ids + self.gen.token_ids

    def reusable_ids(self) -> list[int]:
        """The tokens whose K/V may come from the prefix cache: none for a scoring request (every position's
        hidden state is needed), all but the last prompt token for a new request (its logits give the first
        token), everything cached before a preemption for a resumed one."""
        if self.prompt_logprobs is not None and not self.gen.token_ids:
            return []
        return self.all_ids()[: self.cached_target] if self.gen.token_ids else self.prompt_ids[:-1]

    def start(self, seq: SeqKV) -> None:
        """Admitted: the request now holds `seq` (its first `seq.length` positions already cached)."""
        self.seq = seq
        if self.n_preemptions:
            return  # resumed: its generator, stream and timings go on where they were
        self.gen.cached_tokens = seq.length
        self.gen.queue_s = self.clock() - (self.enqueued or self.arrival)
        self.generator = self.sampling.generator("cpu")  # drawn on the CPU for every device (prefill.engine.sampling)
        if self.tokenizer is not None:
            self._stream = TextStream(self.tokenizer, self.stop)

    def preempted(self) -> None:
        """Its blocks were taken back: it waits again and recomputes its cache when readmitted."""
        self.seq, self.scorer = None, None
        self.n_preemptions += 1

    def next_input(self) -> int:
        """The token to feed in the next decode step: the last one accepted."""
        return self.gen.token_ids[-1]

    def chunk_ids(self, n: int) -> list[int]:
        """The next n tokens to prefill (from the prompt, or after a preemption also the generated ones)."""
        return self.all_ids()[self.seq.length : self.seq.length + n]

    def prefilled(self) -> None:
        """The whole prompt is in the cache: note what it holds (measured)."""
        self.gen.kv_bytes, self.gen.kv_shape = self.seq.nbytes(), self.seq.shape()
        if self.max_tokens == 0:
            self.finish("length")

    # ---- the one place a token is accepted ----
    def accept(self, token: int, logits: torch.Tensor | None, logits_ready: float) -> None:
        """Take the token sampled from next-token logits [vocab] (float32, after this request's constraint; ready
        at perf_counter time `logits_ready`; None where the request asks no logprobs): record it, then emit, stop
        or go on."""
        now = self.clock()
        g = self.gen
        if not g.token_ids and g.ttft_s == 0.0:
            g.first_token_s, g.ttft_s = now - logits_ready, now - self.arrival
        else:
            g.itl_s.append(now - self._last_token_at)
        self._last_token_at = now
        if self.constraint is not None:
            self.constraint.accept(token)
        eos = self.tokenizer.eos_ids if self.tokenizer is not None and not self.ignore_eos else set()
        if token in eos:
            g.eos_id = token
            if self.logprobs is not None:  # reported as vLLM does (harnesses drop the last entry), never emitted
                g.logprobs.append(TokenEvent(token, "", now - self.arrival))
                g.logprobs[-1].logprob, g.logprobs[-1].top_logprobs = _logprobs(logits, token, self.logprobs)
            return self.finish("stop", flush=True)
        g.token_ids.append(token)
        text, stopped = self._stream.add(token) if self._stream else ("", False)
        seq = self.seq
        event = TokenEvent(token, text, now - self.arrival, seq.nbytes() if seq else 0, seq.length if seq else 0)
        if self.logprobs is not None:
            event.logprob, event.top_logprobs = _logprobs(logits, token, self.logprobs)
            g.logprobs.append(event)
        if stopped:
            self._send(event)
            return self.finish("stop")
        at_limit = len(g.token_ids) >= self.max_tokens
        if at_limit and self._stream:
            event.text += self._stream.flush()
        self._send(event)
        if at_limit:
            self.finish("length")
        elif self.constraint is not None and self.constraint.done():
            self.finish("stop", flush=True)

    def finish(self, reason: str, flush: bool = False) -> None:
        """The request ends: send text held back (when no stop string claimed it) and the summary."""
        if self.done:
            return
        if flush and self._stream is not None:
            tail = self._stream.flush()
            if tail:
                self._send(TokenEvent(-1, tail, self.clock() - self.arrival))
        g = self.gen
        g.finish_reason = reason
        g.text = self._stream.sent if self._stream else ""
        g.total_s = self.clock() - self.arrival
        self.done = True
        self._send(g)

    def fail(self, error: BaseException) -> None:
        """This request alone failed; the loop goes on with the others."""
        if not self.done:
            self.done = True
            self._send(
                Failed(f"{type(error).__name__}: {error}" if not isinstance(error, BadInput) else str(error), error)
            )


def _logprobs(logits: torch.Tensor, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """log p(token) and the top-k (id, log p) under the distribution the token was drawn from (logits [vocab])."""
    lp = torch.log_softmax(logits.float(), dim=-1)  # [vocab]
    top = torch.topk(lp, k) if k > 0 else None
    alts = [] if top is None else [(int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True)]
    return float(lp[token]), alts
