"""Log-probabilities on the wire, as vLLM's OpenAI-compatible server writes them.

Completions (the legacy format): `choices[].logprobs = {tokens, token_logprobs, top_logprobs, text_offset}`, one
entry per token; a prompt's first token (with `echo`) has no context, so its token_logprob and top_logprobs are
null. Each top_logprobs entry is {token: logprob} over the k most likely tokens plus the chosen one (so up to k + 1
keys, the chosen first), as the OpenAI API defines `logprobs: k`.
Chat: `choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}` with
exactly the k most likely tokens in `top_logprobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefill.engine.request import TokenEvent
    from prefill.engine.scores import Scores

MAX_TOP_LOGPROBS = 20  # OpenAI's and vLLM's default bound on k
FLOOR = -9999.0  # what OpenAI writes for a log-probability of -inf (JSON has no infinity)


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability given everything before it, and the k most likely tokens at its position."""

    token_id: int
    logprob: float | None  # None: the first prompt token, which nothing predicts
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


def prompt_entries(scores: Scores) -> list[TokenLogprob]:
    """Entries of a scored prompt (prefill.engine.scoring.Scores with start = 1): the first token's logprob is None."""
    lps = scores.logprobs.tolist()  # [P-1]
    if scores.top_ids.numel():  # [P-1, k]
        tops = [
            tuple(zip(ti, tl, strict=True))
            for ti, tl in zip(scores.top_ids.tolist(), scores.top_logprobs.tolist(), strict=True)
        ]
    else:  # k = 0 (logprobs: 0): no alternatives, whatever shape the empty tensors have
        tops = [()] * len(lps)
    first = [TokenLogprob(int(scores.ids[0]), None)]
    return first + [TokenLogprob(int(t), lp, top) for t, lp, top in zip(scores.ids[1:], lps, tops, strict=True)]


def generated_entries(events: Sequence[TokenEvent]) -> list[TokenLogprob]:
    """Entries of generated tokens: the events (prefill.engine.request.TokenEvent) that carry a log-probability, which
    Request.accept records under the distribution each token was drawn from."""
    return [TokenLogprob(e.token_id, e.logprob, tuple(e.top_logprobs or ())) for e in events if e.logprob is not None]


def _clip(x: float) -> float:
    return max(x, FLOOR)


class CompletionLogprobs:
    """Builds `choices[].logprobs` of /v1/completions; keeps the text offset across the chunks of a stream."""

    def __init__(self, decode: Callable[[int], str], k: int, offset: int = 0) -> None:
        self.decode, self.k, self.offset = decode, k, offset

    def block(self, entries: Sequence[TokenLogprob]) -> dict:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            token = self.decode(e.token_id)
            out["tokens"].append(token)
            out["text_offset"].append(self.offset)
            self.offset += len(token)
            if e.logprob is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(_clip(e.logprob))
            top = {token: _clip(e.logprob)}  # the chosen token is always reported, then the k most likely
            for tid, lp in e.top[: self.k]:
                top.setdefault(self.decode(tid), _clip(lp))
            out["top_logprobs"].append(top)
        return out


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_content(entries: Sequence[TokenLogprob], decode: Callable[[int], str], k: int) -> list[dict]:
    """`choices[].logprobs.content` of /v1/chat/completions for generated tokens."""
    out = []
    for e in entries:
        token = decode(e.token_id)
        top = [{"token": (t := decode(tid)), "logprob": _clip(lp), "bytes": _token_bytes(t)} for tid, lp in e.top[:k]]
        out.append(
            {
                "token": token,
                "logprob": _clip(e.logprob if e.logprob is not None else FLOOR),
                "bytes": _token_bytes(token),
                "top_logprobs": top,
            }
        )
    return out
