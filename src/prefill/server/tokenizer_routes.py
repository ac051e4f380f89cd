"""vLLM's tokenizer endpoints: POST /tokenize, POST /detokenize, GET /tokenizer_info.

Evaluation harnesses (lm-eval's `tokenizer_backend=remote`) count context and continuation tokens with the
server's own tokenizer through them, so nothing has to be downloaded on the client side. Text is checked as the
generation routes check it (valid Unicode, and no longer than the context could hold: a 400 before tokenizing);
tokenizing runs on a worker thread, as theirs does.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, StrictBool

from prefill.errors import BadInput
from prefill.server.openai_schema import Int, Text
from prefill.server.state import state_of

router = APIRouter()


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    prompt: Text
    add_special_tokens: StrictBool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[Int]


@router.post("/tokenize")
async def tokenize(request: Request, body: TokenizeRequest) -> dict:
    state = state_of(request)
    state.intake.check_chars(len(body.prompt))  # a text longer than the context can hold is not tokenized
    engine = state.engine
    tok = engine.need_tokenizer()
    ids = await asyncio.to_thread(tok.encode, body.prompt, add_special_tokens=body.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": engine.spec.context_length}


@router.post("/detokenize")
async def detokenize(request: Request, body: DetokenizeRequest) -> dict:
    engine = state_of(request).engine
    if any(not 0 <= t < engine.spec.vocab_size for t in body.tokens):
        raise BadInput(f"token ids must lie in [0, {engine.spec.vocab_size})")
    return {"prompt": engine.need_tokenizer().decode(body.tokens, skip_special=False)}


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> dict:
    state = state_of(request)
    tok = state.engine.need_tokenizer()
    return {
        "model": state.cfg.model_id,
        "eos_token": tok.eos_token or None,
        "bos_token": tok.bos_token or None,
        "pad_token": None,
        "chat_template": tok.chat_template,
        "model_max_length": state.engine.spec.context_length,
    }
