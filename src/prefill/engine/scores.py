"""A sequence's scores, and the accumulator that collects them as hidden states arrive, chunk by chunk.

Position j's final-normed hidden state predicts token j + 1. The accumulator unembeds `slice_size` positions at a
time, so at most [slice_size, vocab] logits exist at once, never [P, vocab]. A Request holds one while its prompt
is scored (echo); prefill.engine.scoring drives one over a whole text."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefill.errors import BadInput

SLICE = 256  # positions unembedded at once: [256, 49152] float32 logits = 48 MiB for SmolLM2


@dataclass(frozen=True)
class Scores:
    """Log-probabilities of ids[start:], each given the tokens before it (natural log, float32)."""

    ids: list[int]  # the whole sequence, P tokens
    start: int  # first scored position (>= 1: position 0 has no context)
    logprobs: torch.Tensor  # [P - start]: log p(ids[j] | ids[:j]) for j = start .. P-1
    is_argmax: torch.Tensor  # [P - start] bool: ids[j] was the most likely token there
    top_ids: torch.Tensor  # [P - start, k]: the k most likely tokens at j (k = top_k, may be 0)
    top_logprobs: torch.Tensor  # [P - start, k]: their log-probabilities
    next_logits: torch.Tensor  # [vocab]: logits after the last token (what a generated token is sampled from)
    seconds: float = 0.0  # the prefill and the unembedding, measured

    @property
    def P(self) -> int:
        return len(self.ids)

    @property
    def nll(self) -> float:
        """Sum of -log p over the scored tokens (nats)."""
        return -float(self.logprobs.double().sum())


class ScoreAccumulator:
    """Collects the scores of one sequence as its hidden states arrive, chunk by chunk (engine or scheduler)."""

    def __init__(self, ids: list[int], model, top_k: int = 0, start: int = 1, slice_size=SLICE):
        P = len(ids)
        unembed_w = model.unembed_weight()  # [vocab, d_model]
        if not 1 <= start <= P:
            raise BadInput(f"the first scored position must lie in [1, {P}], got {start}")
        if top_k < 0 or top_k > unembed_w.shape[0]:
            raise BadInput(f"top_k must lie in [0, {unembed_w.shape[0]}], got {top_k}")
        self.ids, self.start, self.top_k, self.slice = list(ids), start, top_k, max(1, slice_size)
        self.w = unembed_w  # [vocab, d_model]
        self.to_logits = model.logits  # the model's one unembedding (with Gemma's soft-cap where it has one)
        self.targets = torch.tensor(self.ids, dtype=torch.long, device=unembed_w.device)  # [P]
        self._lp, self._am, self._ti, self._tl = [], [], [], []
        self.next_logits: torch.Tensor | None = None

    def add(self, h: torch.Tensor, pos0: int) -> None:
        """h [C, d_model]: final-normed hidden states of positions pos0 .. pos0 + C - 1, in order."""
        P = len(self.ids)
        hi = pos0 + h.shape[0]  # positions pos0 .. hi-1 arrived
        lo = max(pos0, self.start - 1)  # position start-1 predicts the first scored token
        for a in range(lo, hi, self.slice):
            b = min(a + self.slice, hi)
            logits = self.to_logits(h[a - pos0 : b - pos0])  # [S, vocab] float32
            if b == P:
                self.next_logits = logits[-1].clone()  # [vocab]
            n = min(b, P - 1) - a  # rows that predict a token of the sequence (the last position predicts none)
            if n <= 0:
                continue
            lp = torch.log_softmax(logits[:n], dim=-1)  # [n, vocab]
            target = self.targets[a + 1 : a + 1 + n]  # [n]
            self._lp.append(lp.gather(1, target[:, None])[:, 0])  # [n]
            self._am.append(lp.argmax(-1) == target)  # [n]
            if self.top_k:
                values, indices = lp.topk(self.top_k, dim=-1)  # [n, k] each
                self._ti.append(indices)
                self._tl.append(values)

    def result(self, seconds: float = 0.0) -> Scores:
        if self.next_logits is None:
            raise RuntimeError("the last position's hidden state never arrived")
        k, dev = self.top_k, self.w.device
        cat = lambda parts, empty: torch.cat(parts) if parts else empty  # noqa: E731
        return Scores(
            self.ids,
            self.start,
            cat(self._lp, torch.zeros(0, device=dev)),
            cat(self._am, torch.zeros(0, dtype=torch.bool, device=dev)),
            cat(self._ti, torch.zeros(0, k, dtype=torch.long, device=dev)),
            cat(self._tl, torch.zeros(0, k, device=dev)),
            self.next_logits,
            seconds,
        )
