"""The one check of a prompt, run by every entry (the engine, a request, the server, the CLI, scoring).

The context rule is vLLM's: a request of P prompt tokens that may generate max_tokens more needs
P + max_tokens <= the model's context length (a cached prefix of `past` tokens counts as prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput


def check_text(text: str) -> None:
    """BadInput for a text prompt with nothing in it (empty or only whitespace)."""
    if not text.strip():
        raise BadInput("the prompt is empty: give some text")


def check_chunk_size(chunk_size: int | None) -> None:
    """BadInput unless chunk_size is None (one pass) or at least 1 token."""
    if chunk_size is not None and chunk_size < 1:
        raise BadInput(f"chunk size must be >= 1, got {chunk_size}")


def check_prompt(
    ids: Sequence[int],
    spec: ModelSpec,
    *,
    max_tokens: int = 0,
    past: int = 0,
    chunk_size: int | None = None,
    within_context: bool = True,
    max_tokens_name: str = "max_tokens",
) -> None:
    """BadInput, with what to do, when the token ids cannot be run: empty, outside the vocabulary, past the
    context length (unless `within_context` is False: scoring in windows), or with a chunk size below 1.
    `max_tokens_name` is what the caller calls max_tokens in its messages (max_new_tokens for Engine.generate)."""
    if not ids:
        raise BadInput("the prompt is empty: at least one token is needed")
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= spec.vocab_size:
        raise BadInput(f"token ids must lie in [0, {spec.vocab_size}), got {lo if lo < 0 else hi}")
    if max_tokens < 0:
        raise BadInput(f"{max_tokens_name} must be >= 0, got {max_tokens}")
    P, ctx = past + len(ids), spec.context_length
    if within_context and P + max_tokens > ctx:
        asked = f"{P} prompt tokens" + (f" + {max_tokens_name} {max_tokens}" if max_tokens else "")
        raise BadInput(
            f"{asked} exceed the model's context length {ctx}: shorten the prompt"
            + (" or ask for fewer tokens" if max_tokens else "")
        )
    check_chunk_size(chunk_size)
