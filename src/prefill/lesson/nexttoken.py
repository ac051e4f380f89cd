"""What the model weighed before it chose (POST /api/next-token): the first answer token's probabilities.

The prompt's last position gives logits over the whole vocabulary; softmax turns them into probabilities and the
server, at temperature 0, takes the most likely. The page shows the most likely few beside the token chosen, and
where a token the student names (" Paris") ranked, with its probability: the real model's numbers, from a
separate pass on the server's worker (prefill.lesson.probe.next_token), not from the serving path.
"""

from __future__ import annotations

import asyncio
from functools import partial

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from prefill.errors import BadInput
from prefill.lesson.live import encode, labels
from prefill.lesson.probe import next_token
from prefill.lesson.state import lesson_of
from prefill.server.openai_schema import int_in

router = APIRouter(prefix="/api", tags=["lesson: live model"])
MAX_LOOKUP = 200  # characters of the token looked up
# A prompt whose every character could be 4 byte tokens still fits the embedded model's 8,192-token context with
# its chat template: so a request the document allows is never refused for its length (schemathesis ST202).
MAX_NEXT_TEXT = 2_000


class NextTokenBody(BaseModel):
    """The prompt (as the live section sends it), how many of the likeliest tokens to list, and a token to find."""

    model_config = ConfigDict(extra="forbid")
    # The bound is the document's (document_next_text: so a request it allows always fits) and the route's own
    # check, which says it in the lesson's words where the page sends a longer prompt (a 1,000-token prompt is
    # ~5,000 characters).
    text: StrictStr = Field(min_length=1)
    chat: StrictBool = False
    top: int_in(ge=1, le=50) = Field(10, description="how many of the most likely tokens to list")
    lookup: StrictStr = Field(
        "", max_length=MAX_LOOKUP, description="text whose first token's rank and probability to give (' Paris')"
    )


def document_next_text(doc: dict) -> None:
    """Write MAX_NEXT_TEXT into the OpenAPI document as the bound of NextTokenBody's text (the route checks it)."""
    doc["components"]["schemas"][NextTokenBody.__name__]["properties"]["text"]["maxLength"] = MAX_NEXT_TEXT


@router.post("/next-token")
async def next_token_route(request: Request, body: NextTokenBody) -> dict:
    """The first answer token's distribution for the prompt: the `top` most likely tokens with their probabilities
    (the first is the one temperature 0 chooses), and the rank (from 1) and probability of `lookup`'s first token
    (it may take several tokens: all are listed, the first is ranked)."""
    if len(body.text) > MAX_NEXT_TEXT:
        raise BadInput(
            f"the next token is shown for prompts of at most {MAX_NEXT_TEXT:,} characters (so that any text that long"
            f" fits the model's context, whatever its tokens); this one has {len(body.text):,}"
        )
    lesson = lesson_of(request)
    engine = lesson.engine
    ids = await asyncio.to_thread(encode, engine, body.text, body.chat)
    wanted = await asyncio.to_thread(engine.need_tokenizer().encode, body.lookup) if body.lookup else []
    got = await lesson.run(partial(next_token, engine.model, ids, body.top, wanted[:1]))
    words = labels(engine, [i for i, _ in got.top])
    top = [{"id": i, "token": t, "p": p} for (i, p), t in zip(got.top, words, strict=True)]
    out: dict = {"P": len(ids), "top": top, "chosen": top[0], "vocab": engine.spec.vocab_size, "lookup": None}
    if got.looked:
        ((i, rank, p),) = got.looked
        out["lookup"] = {"text": body.lookup, "id": i, "rank": rank, "p": p, "tokens": labels(engine, wanted)}
    return out
