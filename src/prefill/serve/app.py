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

from prefill import costs
from prefill.engine import Engine
from prefill.errors import BadInput
from prefill.kvcache import KVPool
from prefill.loop import StepLoop
from prefill.prefix_cache import RadixPrefixCache
from prefill.request import Failed, Generation, TokenEvent
from prefill.request import Request as Job  # fastapi's Request is the HTTP one
from prefill.sampling import SamplingParams
from prefill.serve.logprobs import CompletionLogprobs, chat_content, generated_entries, prompt_entries
from prefill.serve.metrics import ServerMetrics
from prefill.serve.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseShape,
    error_body,
    usage_body,
)
from prefill.serve.scheduler import QueueFull, Scheduler
from prefill.serve.tokenizer_routes import add_tokenizer_routes


@dataclass(frozen=True)
class ServeConfig:
    """Limits and sizes of one server. Bytes, tokens."""

    model_id: str
    prefix_cache_mb: float = 256.0
    kv_cache_mb: float | None = None  # the shared KV pool; None: default_kv_cache_bytes()
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


def default_kv_cache_bytes(engine: Engine) -> int:
    """A quarter of the memory free now on the engine's device, at most 2 GiB (pages are touched only as used)."""
    if engine.device.type == "cuda":
        import torch

        free = torch.cuda.mem_get_info(engine.device)[0]
    else:
        import psutil

        free = psutil.virtual_memory().available
    return int(min(free // 4, 2 * 1024**3))


def model_id_of(engine: Engine) -> str:
    """The id clients name in `model`: the weights file or folder name, e.g. SmolLM2-135M-Instruct.Q4_1."""
    name = Path(engine.source).name
    return name.removesuffix(".gguf") or engine.spec.name


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


def create_app(engine: Engine, cfg: ServeConfig) -> FastAPI:
    """The app, with its scheduler started and stopped by the app's lifespan."""
    metrics = ServerMetrics()
    kv_bytes = default_kv_cache_bytes(engine) if cfg.kv_cache_mb is None else int(cfg.kv_cache_mb * 1024**2)
    pool = KVPool.for_bytes(engine.spec, kv_bytes, engine.dtype, engine.device)
    prefix = RadixPrefixCache(pool, int(cfg.prefix_cache_mb * 1024**2))
    loop = StepLoop(engine, pool, prefix, cfg.chunk_size, cfg.max_running)
    scheduler = Scheduler(loop, metrics, cfg.max_queue)
    context = engine.spec.context_length

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        scheduler.start()
        await asyncio.to_thread(engine.gemm_rate)  # measured once now, so predictions never stall a request
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
        return {"status": "ok", "model": cfg.model_id, **scheduler.pool_state()}

    @app.get("/metrics")
    async def metrics_route() -> Response:
        scheduler._update_gauges()
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

    def new_job(ids: list[int], body, arrival: float, tokenize_s: float, k: int | None, echo: bool, emit) -> Job:
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
        return Job(ids, max_tokens, sampling, engine.tokenizer, emit, body.stop_strings(), arrival=arrival,
                   tokenize_s=tokenize_s, ignore_eos=body.ignore_eos, logprobs=k,
                   prompt_logprobs=k if echo and k is not None else None)  # fmt: skip

    def entries_of(gen: Generation, echo: bool) -> list:
        """Log-probability entries of a finished request: the prompt's (with echo), then the generated tokens'."""
        prompt = prompt_entries(gen.prompt_scores) if echo and gen.prompt_scores is not None else []
        return prompt + generated_entries(gen.logprobs)

    async def collect(req: Job, events: asyncio.Queue) -> tuple[str, Generation]:
        parts = []
        while True:
            ev = await events.get()
            if isinstance(ev, TokenEvent):
                parts.append(ev.text)
            elif isinstance(ev, Failed):
                if isinstance(ev.error, BadInput):
                    raise ApiError(400, ev.message)
                raise ApiError(500, ev.message, "server_error")
            else:
                return "".join(parts), ev

    async def handle(request: Request, body: CompletionRequest | ChatCompletionRequest, chat: bool):
        arrival = request.scope.get("state", {}).get("arrival", time.perf_counter())
        if body.model != cfg.model_id:
            raise ApiError(404, f"model {body.model!r} does not exist; this server serves {cfg.model_id!r}",
                           param="model", code="model_not_found")  # fmt: skip
        t0 = time.perf_counter()
        prompts = prompts_of(body, chat)
        tokenize_s = time.perf_counter() - t0
        echo, k = (not chat and body.echo), logprobs_k(body, chat)
        scored = sum(len(ids) for ids, _ in prompts)
        if echo and k is not None and scored > cfg.max_echo_tokens:
            raise ApiError(400, f"echo with logprobs of {scored} prompt tokens; at most {cfg.max_echo_tokens} per "
                           "request: send fewer or shorter prompts", param="echo", code="echo_too_long")  # fmt: skip
        if body.stream and len(prompts) > 1:
            raise ApiError(400, "stream one prompt at a time", param="prompt")
        aio = asyncio.get_running_loop()
        jobs = []
        for ids, _ in prompts:
            events: asyncio.Queue = asyncio.Queue()
            emit = lambda ev, q=events: aio.call_soon_threadsafe(q.put_nowait, ev)  # noqa: E731
            jobs.append((new_job(ids, body, arrival, tokenize_s, k, echo, emit), events))
        try:
            for req, _ in jobs:
                scheduler.submit(req)
        except QueueFull as e:
            for req, _ in jobs:
                req.cancelled = True
            raise ApiError(429, str(e), "rate_limit_error", code="queue_full") from e
        shape = ResponseShape(chat, cfg.model_id)
        endpoint = "chat" if chat else "completions"
        echoes = [(text if text is not None else engine.tokenizer.decode(ids, skip_special=False)) if echo else ""
                  for ids, text in prompts]  # fmt: skip
        if body.stream:
            req, events = jobs[0]
            return StreamingResponse(stream(req, events, shape, body.stream_options, endpoint, echoes[0], k),
                                     media_type="text/event-stream")  # fmt: skip
        try:
            results = [await collect(req, events) for req, events in jobs]
        finally:
            for req, _ in jobs:
                req.cancelled = True  # no-op when finished; frees the cache if this handler was cancelled
        choices, totals = [], [0, 0, 0]
        for i, ((text, gen), echoed) in enumerate(zip(results, echoes, strict=True)):
            metrics.requests.labels(endpoint=endpoint, finish_reason=gen.finish_reason).inc()
            choices.append(shape.choice(echoed + text, gen.finish_reason, logprobs_body(chat, k, entries_of(gen, echo)),
                                        index=i))  # fmt: skip
            for j, n in enumerate((gen.P, len(gen.token_ids), gen.cached_tokens)):
                totals[j] += n
        timings = [final_timings(gen) for _, gen in results]
        return shape.full_choices(choices, usage_body(*totals), timings[0] if len(timings) == 1 else timings)

    def usage_of(gen: Generation) -> dict:
        return usage_body(gen.P, len(gen.token_ids), gen.cached_tokens)

    def final_timings(gen: Generation) -> dict:
        """The server's measured timings, with the cost model's prediction of the prefill beside them."""
        predicted, how = engine.predict_prefill_seconds(gen.P - gen.cached_tokens, gen.cached_tokens, cfg.chunk_size)
        out = {**gen.timings(), "predicted_prefill_s": predicted, "predicted_by": how,
               "kv_bytes": gen.kv_bytes, "kv_bytes_formula": kv_formula(gen.P)}  # fmt: skip
        if gen.prompt_scores is not None:  # a scoring prefill: every position unembedded
            count = costs.scoring_flops_exact(engine.spec, gen.P)
            out.update(scoring_flops=count.total, scoring_unembed_share=count.unembed_share)
        return out

    def kv_formula(tokens: int) -> int:
        return costs.kv_cache_bytes_for(engine.spec, tokens, engine.dtype.itemsize)

    async def stream(req: Job, events: asyncio.Queue, shape: ResponseShape, opts, endpoint: str, echoed: str,
                     k: int | None) -> AsyncIterator[str]:  # fmt: skip
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)
        extra = {"usage": None} if include_usage else {}
        fmt = CompletionLogprobs(decode_one, k) if k is not None and not shape.chat else None
        sent = 0  # generated tokens whose log-probabilities went out

        def logprobs_of(entries: list) -> dict | None:
            if k is None or not entries:
                return None
            return fmt.block(entries) if fmt is not None else {"content": chat_content(entries, decode_one, k)}

        try:
            if shape.chat:
                yield _sse(shape.chunk("", role=True, **extra))
            if echoed and req.prompt_logprobs is None:  # echo without logprobs: the prompt text first
                yield _sse(shape.chunk(echoed, **extra))
            while True:
                ev = await events.get()
                if echoed and req.prompt_logprobs is not None:  # the prompt's scores are known once it is prefilled
                    prompt = prompt_entries(req.gen.prompt_scores) if req.gen.prompt_scores is not None else []
                    yield _sse(shape.chunk(echoed, logprobs=logprobs_of(prompt), **extra))
                    echoed = ""
                if isinstance(ev, TokenEvent):
                    entries = generated_entries([ev])
                    sent += len(entries)
                    if not ev.text and not continuous and not entries:
                        continue
                    if continuous:  # vLLM's continuous_usage_stats, plus what the cache holds right now
                        n = len(req.gen.token_ids)
                        extra = {"usage": usage_body(req.P, n, req.gen.cached_tokens),
                                 "timings": {"t_s": ev.t, "kv_bytes": ev.kv_bytes, "kv_tokens": ev.kv_tokens,
                                             "kv_bytes_formula": kv_formula(ev.kv_tokens)}}  # fmt: skip
                    yield _sse(shape.chunk(ev.text, logprobs=logprobs_of(entries), **extra))
                    continue
                if isinstance(ev, Failed):
                    metrics.errors.labels(status="400" if isinstance(ev.error, BadInput) else "500").inc()
                    yield _sse(error_body(ev.message, "server_error"))
                    break
                metrics.requests.labels(endpoint=endpoint, finish_reason=ev.finish_reason).inc()
                usage, timings = usage_of(ev), final_timings(ev)
                rest = logprobs_of(generated_entries(ev.logprobs[sent:]))  # a final EOS token's, never emitted
                if include_usage:
                    yield _sse(shape.chunk(None, ev.finish_reason, logprobs=rest,
                                           usage=usage if continuous else None))  # fmt: skip
                    yield _sse(shape.usage_chunk(usage, timings))
                else:  # OpenAI clients ignore the extra fields; other clients can read them
                    yield _sse(shape.chunk(None, ev.finish_reason, logprobs=rest, usage=usage, timings=timings))
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
