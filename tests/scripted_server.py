"""A scripted OpenAI-compatible server for the load-test client's tests and the planner's fit tests: its clocks
are known, so what the client measured can be checked to the millisecond."""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

# A scripted server: waits FIRST_S, sends one empty chunk (which must not count as the first token), then
# N_CHUNKS content chunks GAP_S apart, then a finish chunk and (when asked) a usage chunk saying N_CHUNKS.
FIRST_S, GAP_S, N_CHUNKS = 0.05, 0.02, 4


def scripted_app() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "scripted", "object": "model"}]}

    async def events(chat: bool, include_usage: bool):
        def chunk(text, finish=None):
            if chat:
                return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
            return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}

        await asyncio.sleep(FIRST_S)
        yield f"data: {json.dumps(chunk(''))}\n\n"
        for i in range(N_CHUNKS):
            if i:
                await asyncio.sleep(GAP_S)
            yield f"data: {json.dumps(chunk(f'w{i} '))}\n\n"
        yield f"data: {json.dumps(chunk('', 'length'))}\n\n"
        if include_usage:
            usage = {"prompt_tokens": 7, "completion_tokens": N_CHUNKS, "prompt_tokens_details": {"cached_tokens": 3}}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    async def route(request: Request, chat: bool):
        body = await request.json()
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        assert body["stream"] is True and body["model"] == "scripted"
        return StreamingResponse(events(chat, usage), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await route(request, False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await route(request, True)

    return app
