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
    """Token ids [B] drawn from float32 logits [B, vocab] under one set of parameters; raises NothingToSample when a
    row has no finite logit."""
    tokens, ok = sample_rows(logits, [params] * logits.shape[0], [generator] * logits.shape[0])
    if not bool(ok.all()):
        raise NothingToSample("no token can be sampled: every token is banned (logit_bias, grammar) or NaN")
    return tokens


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]):
    """Every row's token in one pass: logits [R, vocab] float32, row r under params[r] with generators[r] (its own
    seeded generator, or None: torch's global one). Returns (tokens [R] long, ok [R] bool); ok is False for a row
    with nothing to draw (every logit banned or NaN), whose token is meaningless. Nothing here waits for the
    device: the caller reads both with one host sync.

    Sampled rows use the Gumbel-max trick: argmax(logits / T + g) with g = -log(-log(u)), u ~ U(0, 1), draws from
    softmax(logits / T) exactly, so rows with different temperatures, cuts and generators share one argmax."""
    logits = logits.float()
    for r, p in enumerate(params):
        if p.logit_bias:
            logits[r : r + 1] = apply_logit_bias(logits[r : r + 1], p.logit_bias)
    greedy_cpu = logits.device.type == "cpu" and all(p.greedy for p in params)
    if greedy_cpu and (picked := _greedy_cpu(logits)) is not None:
        return picked
    logits = logits.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))  # NaN never wins
    ok = (logits > float("-inf")).any(dim=-1)  # [R]
    posinf = logits == float("inf")  # [R, vocab]: a sure pick among them (softmax of inf is NaN)
    sure = posinf.any(-1)  # [R]
    best = torch.where(sure, posinf.float().argmax(-1), logits.argmax(-1))  # [R]: the greedy choice
    hot = [r for r, p in enumerate(params) if not p.greedy]
    if not hot:
        return best, ok
    idx = torch.tensor(hot, device=logits.device)
    x = logits[idx]  # [H, vocab]
    # Subtract each row's best first: the best becomes 0 and stays finite however small the temperature.
    temps = torch.tensor([params[r].temperature for r in hot], device=x.device)[:, None]  # [H, 1]
    x = (x - x.max(dim=-1, keepdim=True).values) / temps
    x = _cut(x, [params[r] for r in hot])
    noise = torch.stack([_gumbel(x.shape[-1], generators[r]) for r in hot]).to(x.device)  # [H, vocab]
    drawn = torch.where(sure[idx], best[idx], (x + noise).argmax(-1))
    return best.index_copy(0, idx, drawn), ok


def _greedy_cpu(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Greedy rows in one pass over float32 logits [R, vocab] on the CPU (where reading a value waits for
    nothing): argmax propagates NaN, so a row whose pick is not NaN holds none, and its pick is the greedy choice
    (the first +inf if any, which sample_rows' full path also picks); a pick of -inf means every token is banned.
    None when a pick is NaN: the full path then sets NaN aside (a decode step's 8 passes over the vocabulary)."""
    best = logits.argmax(-1)  # [R]
    value = logits.gather(-1, best[:, None])[:, 0]  # [R]
    if bool(value.isnan().any()):
        return None
    return best, value > float("-inf")


def _cut(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Scaled logits [H, vocab] with each row's top-k and top-p cuts applied (-inf outside)."""
    V = x.shape[-1]
    ks = [min(p.top_k, V) if p.top_k else V for p in params]
    if min(ks) < V:
        top = torch.topk(x, max(k for k in ks if k < V), dim=-1).values  # [H, k_max]
        kth = torch.stack([top[r, k - 1] if k < V else x.new_tensor(float("-inf")) for r, k in enumerate(ks)])
        x = x.masked_fill(x < kth[:, None], float("-inf"))
    tops = torch.tensor([p.top_p for p in params], device=x.device)[:, None]  # [H, 1]
    if bool((tops < 1.0).any()):
        sorted_x, order = x.sort(dim=-1, descending=True)  # [H, vocab]
        probs = sorted_x.softmax(-1)
        drop = (probs.cumsum(-1) - probs >= tops) & (tops < 1.0)  # keep the smallest set reaching top_p
        drop[:, 0] = False  # the best token always stays (a top_p that rounds to 0 in float32 would drop all)
        x = torch.full_like(x, float("-inf")).scatter(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return x


def _gumbel(V: int, generator: torch.Generator | None) -> torch.Tensor:
    """Gumbel(0, 1) noise [V] float32 from `generator` (on the CPU, so a seed draws the same on every device)."""
    u = torch.rand(V, generator=generator)
    return -torch.log(-torch.log(u))
