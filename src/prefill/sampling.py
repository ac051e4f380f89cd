"""Choosing the next token from logits: greedy, temperature, top-k, top-p, reproducible with a seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefill.errors import BadInput


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 means no cut; top_p 1.0 means no nucleus cut."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise BadInput(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise BadInput(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise BadInput(f"top_p must be in (0, 1], got {self.top_p}")

    def generator(self, device) -> torch.Generator | None:
        """A generator seeded for this request, or None for greedy / unseeded sampling."""
        if self.seed is None or self.temperature == 0:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Token ids [B] drawn from float32 logits [B, vocab]."""
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= params.top_p  # keep the smallest set reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
