"""Choosing the next token from logits: greedy, temperature, top-k, top-p, logit bias, reproducible with a seed.

No input can make it divide by zero or draw from NaN: a temperature under MIN_TEMPERATURE is greedy (as in vLLM),
the nucleus always keeps the best token, NaN logits count as banned, and a row with nothing left to draw from
raises NothingToSample (the request fails, not the process).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefill.errors import BadInput, PrefillError

MIN_TEMPERATURE = 1e-5  # below this, temperature scaling overflows float32 logits: sample greedily instead
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts
LOGIT_BIAS_MAX = 100.0  # OpenAI's range is [-100, 100]; -100 bans the token, +100 all but forces it


class NothingToSample(PrefillError):
    """Every token of a row is banned (logit bias, a grammar, or NaN logits): there is nothing to draw."""


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 (or under MIN_TEMPERATURE) means greedy; top_k 0 means no cut; top_p 1.0 means no nucleus cut.

    `logit_bias` is ((token id, bias), ...) with bias in [-100, 100], added to the logits before anything else;
    a bias of -100 bans the token outright.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise BadInput(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise BadInput(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise BadInput(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise BadInput(f"seed must be in [{SEED_MIN}, {SEED_MAX}], got {self.seed}")
        for token, bias in self.logit_bias:
            if token < 0 or not -LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX:
                raise BadInput(f"logit_bias: token {token} bias {bias}: ids must be >= 0, biases in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    def generator(self, device) -> torch.Generator | None:
        """A generator seeded for this request, or None for greedy / unseeded sampling."""
        if self.seed is None or self.greedy:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


def apply_logit_bias(logits: torch.Tensor, bias: tuple[tuple[int, float], ...]) -> torch.Tensor:
    """float32 logits [B, vocab] with `bias` added to every row; a bias of -100 sets the logit to -inf."""
    if not bias:
        return logits
    ids = torch.tensor([t for t, _ in bias], dtype=torch.long, device=logits.device)  # [n]
    add = torch.tensor([b for _, b in bias], dtype=logits.dtype, device=logits.device)  # [n]
    add = add.masked_fill(add <= -LOGIT_BIAS_MAX, float("-inf"))
    logits = logits.clone()
    logits[:, ids] += add
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Token ids [B] drawn from float32 logits [B, vocab]; raises NothingToSample when a row has no finite logit."""
    logits = apply_logit_bias(logits.float(), params.logit_bias)
    logits = logits.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))  # NaN never wins
    if not bool((logits > float("-inf")).any(dim=-1).all()):
        raise NothingToSample("no token can be sampled: every token is banned (logit_bias, grammar) or NaN")
    posinf = logits == float("inf")  # [B, vocab]
    if params.greedy or bool(posinf.any()):
        # +inf logits: a sure pick among them (softmax of inf is NaN); greedy: argmax
        return torch.where(posinf.any(-1), posinf.float().argmax(-1), logits.argmax(-1))
    # Subtract each row's best first: the best becomes 0 and stays finite however small the temperature.
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / params.temperature  # [B, vocab], <= 0
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # [B, vocab]
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= params.top_p  # keep the smallest set reaching top_p
        drop[:, 0] = False  # the best token always stays (a top_p that rounds to 0 in float32 would drop all)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
