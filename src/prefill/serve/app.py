"""The HTTP app: OpenAI-compatible routes over the scheduler, with OpenAI-style error bodies.

Routes: POST /v1/completions, POST /v1/chat/completions (stream true or false; streams are server-sent
events ending in `data: [DONE]`), GET /v1/models, GET /health, GET /metrics. Every refusal is a 4xx
with {"error": {"message", "type", "param", "code"}} and leaves the server serving.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from prefill.engine import Engine
from prefill.errors import BadInput
from prefill.sampling import SamplingParams
from prefill.serve.logprobs import CompletionLogprobs, chat_content
from prefill.serve.metrics import ServerMetrics
from prefill.serve.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseShape,
    error_body,
    usage_body,
)
from prefill.serve.prefix_cache import RadixPrefixCache
from prefill.serve.scheduler import Failed, Finished, GenRequest, PromptLogprobs, QueueFull, Scheduler, TextDelta
from prefill.serve.tokenizer_routes import add_tokenizer_routes


@dataclass(frozen=True)
class ServeConfig:
    """Limits and sizes of one server. Bytes, tokens."""

    model_id: str
    prefix_cache_mb: float = 256.0
    max_queue: int = 64
    max_running: int = 32
    chunk_size: int = 256
    max_body_bytes: int = 4 * 1024 * 1024
    max_tokens_limit: int = 4096  # the most tokens one request may ask for
    default_max_tokens: int = 256  # when a request names none (OpenAI's completions default is 16)
    max_prompts: int = 64  # prompts in one /v1/completions request (one choice each)
    max_echo_tokens: int = 16384  # prompt tokens one request may score (echo with logprobs), all prompts together


class ApiError(Exception):
    """A refusal with an HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


class BodyLimit:
    """ASGI middleware: stamps the arrival time and refuses bodies over `max_bytes` with 413.

    The body is read here (bounded), so a chunked upload without Content-Length is limited too.
    """

    def __init__(self, app, max_bytes: int, metrics: ServerMetrics) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})["arrival"] = time.perf_counter()
        declared = dict(scope["headers"]).get(b"content-length")
        too_large = declared is not None and declared.isdigit() and int(declared) > self.max_bytes
        chunks, size, more = [], 0, scope["method"] in ("POST", "PUT", "PATCH") and not too_large
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
            too_large = size > self.max_bytes
            if too_large:
                break
        if too_large:
            self.metrics.errors.labels(status="413").inc()
            msg = f"request body is over the limit of {self.max_bytes} bytes; send a shorter prompt"
            response = JSONResponse(error_body(msg, "invalid_request_error", None, "request_too_large"), 413)
            return await response(scope, receive, send)
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def model_id_of(engine: Engine) -> str:
    """The id clients name in `model`: the weights file or folder name, e.g. SmolLM2-135M-Instruct.Q4_1."""
    name = Path(engine.source).name
    return name.removesuffix(".gguf") or engine.spec.name


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


def create_app(engine: Engine, cfg: ServeConfig) -> FastAPI:
    """The app, with its scheduler started and stopped by the app's lifespan."""
    metrics = ServerMetrics()
    prefix = RadixPrefixCache(int(cfg.prefix_cache_mb * 1024 * 1024))
    scheduler = Scheduler(engine, prefix, metrics, cfg.max_queue, cfg.max_running, cfg.chunk_size)
    context = engine.spec.context_length

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="prefill", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.prefix_cache = scheduler, metrics, prefix
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes, metrics=metrics)

    def refuse(status: int, body: dict) -> JSONResponse:
        metrics.errors.labels(status=str(status)).inc()
        return JSONResponse(body, status_code=status)

    @app.exception_handler(ApiError)
    async def _api_error(_r: Request, e: ApiError) -> JSONResponse:
        return refuse(e.status, error_body(e.message, e.type, e.param, e.code))

    @app.exception_handler(BadInput)
    async def _bad_input(_r: Request, e: BadInput) -> JSONResponse:
        return refuse(400, error_body(str(e), "invalid_request_error", None, "invalid_value"))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, e: RequestValidationError) -> JSONResponse:
        err = e.errors()[0]
        if err.get("type") == "json_invalid":
            return refuse(400, error_body("the body is not valid JSON", "invalid_request_error", None,
                                          "invalid_json"))  # fmt: skip
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        if param is None:  # the body as a whole: not a JSON object (or sent without a JSON content type)
            return refuse(400, error_body("the body must be a JSON object (Content-Type: application/json)",
                                          "invalid_request_error", None, "invalid_json"))  # fmt: skip
        msg = f"{param}: {err.get('msg', 'invalid value')}"
        return refuse(400, error_body(msg, "invalid_request_error", param, "invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_r: Request, e: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if e.status_code == 404 else None
        return refuse(e.status_code, error_body(str(e.detail), "invalid_request_error", None, code))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": cfg.model_id}

    @app.get("/metrics")
    async def metrics_route() -> Response:
        metrics.kv_bytes.set(scheduler.kv_cache_bytes())
        metrics.prefix_bytes.set(prefix.nbytes)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    add_tokenizer_routes(app, engine, cfg.model_id)

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": cfg.model_id, "object": "model", "created": 0, "owned_by": "prefill",
                "max_model_len": context}  # fmt: skip
        return {"object": "list", "data": [card]}

    def prompts_of(body: CompletionRequest | ChatCompletionRequest, chat: bool) -> list[tuple[list[int], str | None]]:
        """Token ids of each prompt, with its text where it came as text (what `echo` returns)."""
        tok = engine.need_tokenizer()
        if chat:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            return [(tok.encode(tok.render_chat(messages, add_generation_prompt=True)), None)]
        p = body.prompt
        items = [p] if isinstance(p, str) or not p or isinstance(p[0], int) else list(p)
        if len(items) > cfg.max_prompts:
            raise ApiError(400, f"{len(items)} prompts in one request; at most {cfg.max_prompts}", param="prompt")
        out = []
        for item in items:
            if isinstance(item, str):
                out.append((tok.encode(item, add_special_tokens=True), item))
                continue
            if any(not 0 <= t < engine.spec.vocab_size for t in item):
                raise ApiError(400, f"token ids must lie in [0, {engine.spec.vocab_size})", param="prompt")
            out.append((list(item), None))
        return out

    def decode_one(token_id: int) -> str:
        return engine.tokenizer.decode([token_id], skip_special=False)

    def logprobs_k(body: CompletionRequest | ChatCompletionRequest, chat: bool) -> int | None:
        """k alternatives per token, or None when the request asks for no log-probabilities."""
        if not chat:
            return body.logprobs
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (body.top_logprobs or 0) if body.logprobs else None

    def logprobs_body(chat: bool, k: int | None, entries: list) -> dict | None:
        if k is None:
            return None
        if chat:
            return {"content": chat_content(entries, decode_one, k)}
        return CompletionLogprobs(decode_one, k).block(entries)

    def new_request(ids: list[int], body, arrival: float, tokenize_s: float, k: int | None, echo: bool, on_event):
        P = len(ids)
        if P == 0:
            raise ApiError(400, "the prompt is empty", param="prompt")
        if P >= context:  # noqa: SIM300 - P is the prompt length, not a constant
            raise ApiError(400, f"the prompt has {P} tokens; this model's context length is {context}; "
                           "shorten it", param="prompt", code="context_length_exceeded")  # fmt: skip
        requested = body.requested_max_tokens()
        if requested == 0 and not echo:
            raise ApiError(400, "max_tokens 0 returns nothing without echo: true (a scoring request)",
                           param="max_tokens")  # fmt: skip
        max_tokens = requested if requested is not None else min(cfg.default_max_tokens, context - P)
        if max_tokens > cfg.max_tokens_limit or P + max_tokens > context:
            raise ApiError(400, f"max_tokens={max_tokens} is over the limit: at most "
                           f"{min(cfg.max_tokens_limit, context - P)} for this {P}-token prompt "
                           f"(context length {context})", param="max_tokens",
                           code="context_length_exceeded")  # fmt: skip
        sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p, seed=body.seed)
        return GenRequest(ids, max_tokens, sampling, body.stop_strings(), on_event, arrival, tokenize_s,
                          prompt_logprobs=k if echo else None, logprobs=k)  # fmt: skip

    async def collect(req: GenRequest, events: asyncio.Queue) -> tuple[str, list, list, Finished]:
        """Text, prompt log-probabilities, generated tokens' log-probabilities and the end of one request."""
        parts, prompt, generated = [], [], []
        while True:
            ev = await events.get()
            if isinstance(ev, TextDelta):
                parts.append(ev.text)
                generated.extend(ev.logprobs)
            elif isinstance(ev, PromptLogprobs):
                prompt = ev.entries
            elif isinstance(ev, Failed):
                raise ApiError(500, ev.message, "server_error")
            else:
                return "".join(parts), prompt, generated, ev

    async def handle(request: Request, body: CompletionRequest | ChatCompletionRequest, chat: bool):
        arrival = request.scope.get("state", {}).get("arrival", time.perf_counter())
        if body.model != cfg.model_id:
            raise ApiError(404, f"model {body.model!r} does not exist; this server serves {cfg.model_id!r}",
                           param="model", code="model_not_found")  # fmt: skip
        t0 = time.perf_counter()
        prompts = prompts_of(body, chat)
        tokenize_s = time.perf_counter() - t0
        echo, k = (not chat and body.echo), logprobs_k(body, chat)
        if echo and k is not None and sum(len(ids) for ids, _ in prompts) > cfg.max_echo_tokens:
            raise ApiError(400, f"echo with logprobs of {sum(len(ids) for ids, _ in prompts)} prompt tokens; at most "
                           f"{cfg.max_echo_tokens} per request: send fewer or shorter prompts", param="echo",
                           code="echo_too_long")  # fmt: skip
        if body.stream and len(prompts) > 1:
            raise ApiError(400, "stream one prompt at a time", param="prompt")
        loop = asyncio.get_running_loop()
        runs = []
        for ids, _ in prompts:
            events: asyncio.Queue = asyncio.Queue()
            on_event = lambda ev, q=events: loop.call_soon_threadsafe(q.put_nowait, ev)  # noqa: E731
            runs.append((new_request(ids, body, arrival, tokenize_s, k, echo, on_event), events))
        try:
            for req, _ in runs:
                scheduler.submit(req)
        except QueueFull as e:
            for req, _ in runs:
                req.cancelled = True
            raise ApiError(429, str(e), "rate_limit_error", code="queue_full") from e
        shape = ResponseShape(chat, cfg.model_id)
        endpoint = "chat" if chat else "completions"
        echoes = [(text if text is not None else engine.tokenizer.decode(ids, skip_special=False)) if echo else ""
                  for ids, text in prompts]  # fmt: skip
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            req, events = runs[0]
            return StreamingResponse(stream(req, events, shape, include_usage, endpoint, echoes[0], k),
                                     media_type="text/event-stream")  # fmt: skip
        try:
            results = [await collect(req, events) for req, events in runs]
        finally:
            for req, _ in runs:
                req.cancelled = True  # no-op when finished; frees the cache if this handler was cancelled
        choices, totals = [], [0, 0, 0]
        for i, ((text, prompt, generated, ev), echoed) in enumerate(zip(results, echoes, strict=True)):
            metrics.requests.labels(endpoint=endpoint, finish_reason=ev.finish_reason).inc()
            logprobs = logprobs_body(chat, k, (prompt if echo else []) + generated)
            choices.append(shape.choice(echoed + text, ev.finish_reason, logprobs, index=i))
            for j, n in enumerate((ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens)):
                totals[j] += n
        timings = [r[3].timings for r in results]
        return shape.full_choices(choices, usage_body(*totals), timings[0] if len(timings) == 1 else timings)

    async def stream(req: GenRequest, events: asyncio.Queue, shape: ResponseShape, include_usage: bool,
                     endpoint: str, echoed: str, k: int | None) -> AsyncIterator[str]:  # fmt: skip
        extra = {"usage": None} if include_usage else {}
        fmt = CompletionLogprobs(decode_one, k) if k is not None and not shape.chat else None

        def logprobs_of(entries) -> dict | None:
            if k is None:
                return None
            return fmt.block(entries) if fmt is not None else {"content": chat_content(entries, decode_one, k)}

        try:
            if shape.chat:
                yield _sse(shape.chunk("", role=True, **extra))
            if echoed and req.prompt_logprobs is None:  # echo without logprobs: the prompt text first
                yield _sse(shape.chunk(echoed, **extra))
            while True:
                ev = await events.get()
                if isinstance(ev, PromptLogprobs):  # echo with logprobs: the prompt text and its log-probabilities
                    yield _sse(shape.chunk(echoed, logprobs=logprobs_of(ev.entries), **extra))
                    continue
                if isinstance(ev, TextDelta):
                    yield _sse(shape.chunk(ev.text, logprobs=logprobs_of(ev.logprobs) if ev.logprobs else None,
                                           **extra))  # fmt: skip
                    continue
                if isinstance(ev, Failed):
                    metrics.errors.labels(status="500").inc()
                    yield _sse(error_body(ev.message, "server_error"))
                    break
                metrics.requests.labels(endpoint=endpoint, finish_reason=ev.finish_reason).inc()
                usage = usage_body(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens)
                if include_usage:
                    yield _sse(shape.chunk(None, ev.finish_reason, usage=None))
                    yield _sse(shape.usage_chunk(usage, ev.timings))
                else:  # OpenAI clients ignore the extra fields; other clients can read them
                    yield _sse(shape.chunk(None, ev.finish_reason, usage=usage, timings=ev.timings))
                break
            yield _sse("[DONE]")
        finally:
            req.cancelled = True  # a disconnected client: the scheduler drops the request and its cache

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest):
        return await handle(request, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        return await handle(request, body, chat=True)

    return app
