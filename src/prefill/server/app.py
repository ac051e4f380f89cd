"""The HTTP app: OpenAI-compatible routes over the scheduler, with OpenAI-style error bodies.

Routes: POST /v1/completions, POST /v1/chat/completions (stream true or false; streams are server-sent
events ending in `data: [DONE]`; logprobs, echo and max_tokens 0 score prompts), GET /v1/models,
GET /v1/models/{id}, GET /health, GET /metrics, and vLLM's POST /tokenize, POST /detokenize, GET /tokenizer_info.
Every refusal is a 4xx (or a JSON 5xx) with {"error": {"message", "type", "param", "code"}} and leaves the server
serving.

Every request the app hands to the scheduler (one job per prompt) is a `Pending` in `inflight` until it ends as
exactly one of requests (ok), errors or cancelled in /metrics. A supervisor task watches the worker: when it is dead
or stuck, /health answers 503 with the reason, every pending request gets a 503, and the process is asked to exit
non-zero (`app.state.exit_code`) so an orchestrator restarts it. On SIGTERM / SIGINT the server (serve.server) calls
`app.state.begin_shutdown`: pending requests get a 503 (streams a final error event) and new ones are refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from prefill.costmodel import costs
from prefill.engine.kvcache import KVPool
from prefill.engine.llm import Engine
from prefill.engine.loop import StepLoop
from prefill.engine.prefix_cache import RadixPrefixCache
from prefill.engine.request import Failed, Generation, TokenEvent
from prefill.engine.request import Request as Job  # fastapi's Request is the HTTP one
from prefill.errors import BadInput
from prefill.lesson.routes import add_lesson_routes
from prefill.server.config import ServeConfig, model_id_of
from prefill.server.intake import Intake, Prepared
from prefill.server.logprobs import CompletionLogprobs, chat_content, generated_entries, prompt_entries
from prefill.server.metrics import ServerMetrics
from prefill.server.openai_schema import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
    ResponseShape,
    error_body,
    usage_body,
)
from prefill.server.openapi import GENERATION_RESPONSES, HealthBody, document_errors
from prefill.server.structured import tool_calls_of
from prefill.server.supervisor import Supervisor
from prefill.server.tokenizer_routes import add_tokenizer_routes
from prefill.server.worker import QueueFull, Worker

__all__ = ["ServeConfig", "create_app", "model_id_of"]  # the server's face: tests, benchmarks and the CLI


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
        if scope["method"] == "POST" and scope["path"] in GENERATION_PATHS:
            self.metrics.received.inc()
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


GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict"}  # pydantic's names of a union's members in `loc`
log = logging.getLogger("prefill.serve")


@dataclass(frozen=True)
class Aborted:
    """The app ends a pending request itself (shutdown, dead worker, unread stream): HTTP `status`."""

    status: int
    message: str


@dataclass(eq=False)
class Pending:
    """A request handed to the scheduler (one job and one event queue per prompt), until it is settled as ok,
    error or cancelled (exactly once)."""

    jobs: list[Job]
    queues: list[asyncio.Queue]
    settled: str | None = None
    open_jobs: int = 0  # jobs whose last event (Generation / Failed) has not arrived: the worker owes them progress

    @property
    def at_scheduler(self) -> bool:
        return self.open_jobs > 0


async def disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body was read already, so only http.disconnect comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


def create_app(engine: Engine, cfg: ServeConfig) -> FastAPI:
    """The app, with its scheduler and supervisor started and stopped by the app's lifespan."""
    metrics = ServerMetrics()
    kv_bytes = cfg.kv_pool_bytes(engine)
    pool = KVPool.for_bytes(engine.spec, kv_bytes, engine.dtype, engine.device)
    prefix = RadixPrefixCache(pool, int(cfg.prefix_cache_mb * 1024**2))
    loop = StepLoop(engine.runner, pool, prefix, cfg.chunk_size, cfg.max_running)
    scheduler = Worker(loop, metrics, cfg.max_queue)
    admission = Intake(engine, cfg)
    context, vocab = admission.context, admission.vocab
    inflight: set[Pending] = set()

    def settle(p: Pending, outcome: str, **labels) -> None:
        """Count a pending request once: "ok" (requests, by endpoint and finish reason), "error" or "cancelled";
        "raised": an ApiError follows, which its handler counts."""
        if p.settled is not None:
            return
        p.settled = outcome
        inflight.discard(p)
        for job in p.jobs:
            job.cancelled = True  # no-op when finished; otherwise the scheduler drops it and frees its cache
        if outcome == "ok":
            metrics.requests.labels(**labels).inc()
        elif outcome == "error":
            metrics.errors.labels(**labels).inc()
        elif outcome == "cancelled":
            metrics.cancelled.labels(**labels).inc()

    def abort_all(status: int, message: str) -> None:
        """End every pending request with `status` (called on the event loop)."""
        for p in list(inflight):
            for q in p.queues:
                q.put_nowait(Aborted(status, message))

    def begin_shutdown() -> None:
        supervisor.refuse("the server is shutting down")
        abort_all(503, "the server is shutting down; retry on another instance")

    def fatal(reason: str) -> None:
        log.error("unrecoverable: %s; exiting with status 1", reason)
        app.state.exit_code = 1
        abort_all(503, f"the server cannot serve: {reason}")
        on_fatal = getattr(app.state, "on_fatal", None)
        if on_fatal is not None:
            on_fatal()

    def busy() -> bool:
        return any(p.at_scheduler for p in inflight)

    supervisor = Supervisor(scheduler, busy, cfg.stuck_after_s, cfg.supervise_every_s, fatal)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        scheduler.start()
        task = asyncio.create_task(supervisor.run())
        await asyncio.to_thread(engine.gemm_rate)  # measured once now, so predictions never stall a request
        await asyncio.to_thread(engine.calibration)  # read once now, not from disk for every response
        yield
        task.cancel()
        begin_shutdown()
        await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="prefill", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.prefix_cache = scheduler, metrics, prefix
    app.state.supervisor, app.state.begin_shutdown, app.state.exit_code = supervisor, begin_shutdown, 0
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes, metrics=metrics)

    def refuse(status: int, body: dict) -> JSONResponse:
        metrics.errors.labels(status=str(status)).inc()
        return JSONResponse(body, status_code=status)

    @app.exception_handler(ApiError)
    async def _api_error(_r: Request, e: ApiError) -> JSONResponse:
        return refuse(e.status, error_body(e.message, e.type, e.param, e.code))

    @app.exception_handler(BadInput)
    async def _bad_input(_r: Request, e: BadInput) -> JSONResponse:
        return refuse(400, error_body(str(e), "invalid_request_error", getattr(e, "param", None), "invalid_value"))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, e: RequestValidationError) -> JSONResponse:
        # A union field (prompt: text | ids | [text]) fails once per member: report our own check's message if one
        # fired (a lone surrogate), else the first.
        errors = e.errors()
        err = next((x for x in errors if x.get("type") == "value_error"), errors[0])
        if err.get("type") == "json_invalid":
            return refuse(400, error_body("the body is not valid JSON", "invalid_request_error", None,
                                          "invalid_json"))  # fmt: skip
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if loc[:1] in (["query"], ["path"]):  # a URL's parameter (e.g. the lesson's ?N=): its name as it is
            loc = loc[1:2]
        else:  # pydantic names the member of a union it tried ("prompt.str"): keep the field path only
            loc = [x for x in loc if not (x[:1].isupper() or x in _UNION_TAGS or any(c in x for c in "[(-'"))]
        param = ".".join(loc) or None
        if param is None:  # the body as a whole: not a JSON object (or sent without a JSON content type)
            return refuse(400, error_body("the body must be a JSON object (Content-Type: application/json)",
                                          "invalid_request_error", None, "invalid_json"))  # fmt: skip
        if err.get("type") == "extra_forbidden":
            msg, code = f"{param}: this server does not know this field; remove it", "unsupported_parameter"
        else:
            msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
            msg, code = f"{param}: {msg}", "invalid_value"
        return refuse(400, error_body(msg, "invalid_request_error", param, code))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_r: Request, e: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if e.status_code == 404 else None
        response = refuse(e.status_code, error_body(str(e.detail), "invalid_request_error", None, code))
        response.headers.update(e.headers or {})  # e.g. Allow on a 405
        return response

    @app.exception_handler(Exception)
    async def _bug(_r: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error in a request handler")
        return refuse(500, error_body(f"internal error: {type(e).__name__}", "server_error", None, "internal_error"))

    @app.get("/health", responses={503: {"model": HealthBody}})
    async def health() -> JSONResponse:
        """200 while the worker serves; 503 with the reason when it is dead, stuck or shutting down."""
        reason = supervisor.problem()
        body = {"status": "error" if reason else "ok", "reason": reason, "model": cfg.model_id,
                **scheduler.pool_state()}  # fmt: skip
        return JSONResponse(body, 503 if reason else 200)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics_route() -> Response:
        scheduler.update_gauges()
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    add_tokenizer_routes(app, engine, cfg.model_id)
    card = {"id": cfg.model_id, "object": "model", "created": 0, "owned_by": "prefill", "max_model_len": context}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model}", responses={404: {"model": ErrorResponse}})
    async def model_card(model: str) -> dict:
        if model != cfg.model_id:
            raise ApiError(404, f"model {model!r} does not exist; this server serves {cfg.model_id!r}",
                           param="model", code="model_not_found")  # fmt: skip
        return card

    def decode_one(token_id: int) -> str:
        return engine.tokenizer.decode([token_id], skip_special=False)

    def logprobs_body(chat: bool, k: int | None, entries: list) -> dict | None:
        """`choices[].logprobs` of a full answer (prefill.server.logprobs), or None when none was asked for."""
        if k is None:
            return None
        if chat:
            return {"content": chat_content(entries, decode_one, k)}
        return CompletionLogprobs(decode_one, k).block(entries)

    def entries_of(gen: Generation, scored: bool) -> list:
        """Log-probability entries of a finished job: the prompt's (echo with logprobs), then the generated tokens'."""
        prompt = prompt_entries(gen.prompt_scores) if scored and gen.prompt_scores is not None else []
        return prompt + generated_entries(gen.logprobs)

    async def handle(request: Request, body: CompletionRequest | ChatCompletionRequest, chat: bool):
        arrival = request.scope.get("state", {}).get("arrival", time.perf_counter())
        if supervisor.problem():
            raise ApiError(503, f"the server cannot take requests: {supervisor.problem()}", "server_error",
                           code="unavailable")  # fmt: skip
        if body.model != cfg.model_id:
            raise ApiError(404, f"model {body.model!r} does not exist; this server serves {cfg.model_id!r}",
                           param="model", code="model_not_found")  # fmt: skip
        sampling = admission.check(body, chat)
        prepared = await asyncio.to_thread(admission.prepare, body, chat)
        k = prepared.logprobs
        aio = asyncio.get_running_loop()
        pending = Pending([], [])

        def deliver(q: asyncio.Queue, ev) -> None:  # on the event loop
            unread = body.stream and isinstance(ev, TokenEvent) and q.qsize() >= cfg.max_unread_events
            if pending.settled is None and unread:
                settle(pending, "cancelled", reason="unread")  # a client that does not read loses its slot
            pending.open_jobs -= isinstance(ev, Generation | Failed)
            q.put_nowait(ev)

        for ids, max_tokens in zip(prepared.prompts, prepared.max_tokens, strict=True):
            q: asyncio.Queue = asyncio.Queue()
            job = Job(ids, max_tokens, sampling, engine.tokenizer,
                      lambda ev, q=q: aio.call_soon_threadsafe(deliver, q, ev), body.stop_strings(), arrival=arrival,
                      tokenize_s=prepared.tokenize_s, constraint=prepared.constraint, ignore_eos=body.ignore_eos,
                      logprobs=k, prompt_logprobs=k if prepared.scored else None)  # fmt: skip
            pending.jobs.append(job)
            pending.queues.append(q)
        pending.open_jobs = len(pending.jobs)
        try:
            for job in pending.jobs:
                scheduler.submit(job)
        except QueueFull as e:
            for job in pending.jobs:
                job.cancelled = True  # the ones already queued are dropped
            raise ApiError(429, str(e), "rate_limit_error", code="queue_full") from e
        inflight.add(pending)
        shape = ResponseShape(chat, cfg.model_id)
        endpoint = "chat" if chat else "completions"
        tools = prepared.tool_call
        if body.stream:
            return StreamingResponse(stream(pending, shape, body.stream_options, endpoint, tools, prepared),
                                     media_type="text/event-stream")  # fmt: skip
        results: list[tuple[str, Generation]] = []
        gone = asyncio.ensure_future(disconnected(request))  # nobody waits for this answer any more
        try:
            for events in pending.queues:
                parts = []
                while True:
                    get = asyncio.ensure_future(events.get())
                    await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                    if not get.done():
                        get.cancel()
                        settle(pending, "cancelled", reason="disconnect")
                        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
                    ev = get.result()
                    if isinstance(ev, TokenEvent):
                        parts.append(ev.text)
                    elif isinstance(ev, Failed):
                        settle(pending, "raised")
                        if isinstance(ev.error, BadInput):
                            raise ApiError(400, ev.message, param=getattr(ev.error, "param", None))
                        raise ApiError(500, ev.message, "server_error", code="generation_failed")
                    elif isinstance(ev, Aborted):
                        settle(pending, "raised")
                        raise ApiError(ev.status, ev.message, "server_error", code="unavailable")
                    else:
                        results.append(("".join(parts), ev))
                        break
        finally:
            gone.cancel()
            if pending.settled is None and len(results) < len(pending.jobs):  # this handler was cancelled
                settle(pending, "cancelled", reason="disconnect")
        choices, totals = [], [0, 0, 0]
        for i, ((text, gen), echoed) in enumerate(zip(results, prepared.echoes, strict=True)):
            finish, calls = gen.finish_reason, None
            if tools and finish == "stop" and (calls := tool_calls_of(text)):
                finish = "tool_calls"
            lp = logprobs_body(chat, k, entries_of(gen, prepared.scored))
            choices.append(shape.choice(echoed + text, finish, lp, index=i, tool_calls=calls))
            for j, n in enumerate((gen.P, len(gen.token_ids), gen.cached_tokens)):
                totals[j] += n
        settle(pending, "ok", endpoint=endpoint, finish_reason=choices[0]["finish_reason"])
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

    async def stream(pending: Pending, shape: ResponseShape, opts, endpoint: str, tools: bool,
                     prepared: Prepared) -> AsyncIterator[str]:  # fmt: skip
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)
        extra = {"usage": None} if include_usage else {}
        req, events, parts = pending.jobs[0], pending.queues[0], []
        k, echoed = prepared.logprobs, prepared.echoes[0]
        fmt = CompletionLogprobs(decode_one, k) if k is not None and not shape.chat else None
        sent, held = 0, []  # generated tokens whose log-probabilities were taken; those a tool call holds back

        def logprobs_of(entries: list) -> dict | None:
            if k is None or not entries:
                return None
            return fmt.block(entries) if fmt is not None else {"content": chat_content(entries, decode_one, k)}

        try:
            if shape.chat:
                yield _sse(shape.chunk("", role=True, **extra))
            if echoed and not prepared.scored:  # echo without logprobs: the prompt text first
                yield _sse(shape.chunk(echoed, **extra))
                echoed = ""
            while True:
                ev = await events.get()
                if pending.settled == "cancelled":
                    break  # not read for too long: the request was dropped
                if echoed and isinstance(ev, TokenEvent | Generation):  # the prompt's scores: known once prefilled
                    prompt = prompt_entries(req.gen.prompt_scores) if req.gen.prompt_scores is not None else []
                    yield _sse(shape.chunk(echoed, logprobs=logprobs_of(prompt), **extra))
                    echoed = ""
                if isinstance(ev, TokenEvent):
                    entries = generated_entries([ev])
                    sent += len(entries)
                    if tools:  # a tool call is sent whole, once it parses
                        parts.append(ev.text)
                        held += entries
                        continue
                    if not ev.text and not continuous and not entries:
                        continue
                    if continuous:  # vLLM's continuous_usage_stats, plus what the cache holds right now
                        n = len(req.gen.token_ids)
                        extra = {"usage": usage_body(req.P, n, req.gen.cached_tokens),
                                 "timings": {"t_s": ev.t, "kv_bytes": ev.kv_bytes, "kv_tokens": ev.kv_tokens,
                                             "kv_bytes_formula": kv_formula(ev.kv_tokens)}}  # fmt: skip
                    yield _sse(shape.chunk(ev.text, logprobs=logprobs_of(entries), **extra))
                    continue
                if isinstance(ev, Failed | Aborted):
                    if isinstance(ev, Aborted):
                        status = str(ev.status)
                    else:
                        status = "400" if isinstance(ev.error, BadInput) else "500"
                    settle(pending, "error", status=status)
                    yield _sse(error_body(ev.message, "server_error", None, f"http_{status}"))
                    break
                finish, calls = ev.finish_reason, None
                rest = held + generated_entries(ev.logprobs[sent:])  # held back, and a final EOS's (never emitted)
                if tools and finish == "stop" and (calls := tool_calls_of("".join(parts))):
                    finish = "tool_calls"
                    yield _sse(shape.chunk(None, tool_calls=calls, logprobs=logprobs_of(rest), **extra))
                    rest = []
                elif tools:
                    yield _sse(shape.chunk("".join(parts), logprobs=logprobs_of(rest), **extra))
                    rest = []
                settle(pending, "ok", endpoint=endpoint, finish_reason=finish)
                usage, timings = usage_of(ev), final_timings(ev)
                if include_usage:
                    yield _sse(shape.chunk(None, finish, logprobs=logprobs_of(rest),
                                           usage=usage if continuous else None))  # fmt: skip
                    yield _sse(shape.usage_chunk(usage, timings))
                else:  # OpenAI clients ignore the extra fields; other clients can read them
                    yield _sse(shape.chunk(None, finish, logprobs=logprobs_of(rest), usage=usage, timings=timings))
                break
            yield _sse("[DONE]")
        finally:
            settle(pending, "cancelled", reason="disconnect")  # no-op once settled; else the client went away

    @app.post("/v1/completions", responses=GENERATION_RESPONSES)
    async def completions(request: Request, body: CompletionRequest):
        return await handle(request, body, chat=False)

    @app.post("/v1/chat/completions", responses=GENERATION_RESPONSES)
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        return await handle(request, body, chat=True)

    add_lesson_routes(app, engine, cfg.model_id)
    document_errors(app, cfg.model_id, cfg.max_tokens_limit, vocab, cfg.max_prompts)
    return app
