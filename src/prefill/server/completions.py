"""POST /v1/completions and POST /v1/chat/completions: check the body, prepare its prompts, hand one job per
prompt to the worker, and answer (prefill.server.replies) with one JSON body or a stream."""

from __future__ import annotations

import asyncio
import time
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from prefill.engine.request import Request as Job  # fastapi's Request is the HTTP one
from prefill.engine.sampling import SamplingParams
from prefill.server.intake import Body, Prepared
from prefill.server.openai_schema import ChatCompletionRequest, CompletionRequest, ResponseShape
from prefill.server.openapi import GENERATION_RESPONSES
from prefill.server.replies import Reply, full_reply, stream_reply
from prefill.server.state import Pending, ServerState, state_of

router = APIRouter()


@router.post("/v1/completions", responses=GENERATION_RESPONSES)
async def completions(request: Request, body: CompletionRequest):
    return await generate(request, body, chat=False)


@router.post("/v1/chat/completions", responses=GENERATION_RESPONSES)
async def chat_completions(request: Request, body: ChatCompletionRequest):
    return await generate(request, body, chat=True)


async def generate(request: Request, body: Body, chat: bool):
    """The cheap checks on the event loop, tokenizing on a thread, the jobs queued with the worker, the answer."""
    state = state_of(request)
    arrival = request.scope.get("state", {}).get("arrival", time.perf_counter())
    state.refuse_unless_serving(body.model)
    sampling = state.intake.check(body, chat)
    prepared = await asyncio.to_thread(state.intake.prepare, body, chat)
    pending = pending_of(state, body, prepared, sampling, arrival)
    state.submit(pending)
    reply = Reply(state, pending, prepared, ResponseShape(chat, state.cfg.model_id))
    if body.stream:
        return StreamingResponse(stream_reply(reply, body.stream_options), media_type="text/event-stream")
    return await full_reply(request, reply)


def pending_of(state: ServerState, body: Body, prepared: Prepared, sampling: SamplingParams, arrival: float) -> Pending:
    """One job per prompt, each sending its events (from the worker thread) to its own queue on this loop."""
    aio = asyncio.get_running_loop()
    pending = Pending([], [], stream=body.stream)
    k = prepared.logprobs
    # Scoring is exact: echo / logprobs run float32 activations, in a prefix cache of their own, unless the server
    # was started naming its path (--activations)
    exact = state.cfg.exact_scoring and (k is not None or prepared.scored) and state.engine.activations != "f32"
    salt = f"exact|{body.cache_salt or ''}" if exact else body.cache_salt
    for ids, max_tokens in zip(prepared.prompts, prepared.max_tokens, strict=True):
        queue: asyncio.Queue = asyncio.Queue()
        emit = partial(aio.call_soon_threadsafe, state.deliver, pending, queue)
        job = Job(
            ids,
            max_tokens,
            sampling,
            state.engine.tokenizer,
            emit,
            body.stop_strings(),
            arrival=arrival,
            tokenize_s=prepared.tokenize_s,
            constraint=prepared.constraint,
            ignore_eos=body.ignore_eos,
            cache_salt=salt,
            logprobs=k,
            prompt_logprobs=k if prepared.scored else None,
            exact=exact,
        )
        pending.jobs.append(job)
        pending.queues.append(queue)
    return pending
