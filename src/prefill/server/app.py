"""The HTTP app: OpenAI-compatible routes over the worker, with OpenAI-style error bodies.

Routes: POST /v1/completions, POST /v1/chat/completions (prefill.server.completions: stream true or false;
streams are server-sent events ending in `data: [DONE]`; logprobs, echo and max_tokens 0 score prompts),
GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics (prefill.server.info), and vLLM's POST /tokenize,
POST /detokenize, GET /tokenizer_info (prefill.server.tokenizer_routes). Every refusal is a 4xx (or a JSON 5xx)
with {"error": {"message", "type", "param", "code"}} and leaves the server serving (prefill.server.error_handlers).
The routers live at module level and read one `ServerState` (prefill.server.state) from `request.app.state.server`.
The lesson page mounts itself on this app (its add_lesson); the server knows nothing of it.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI

from prefill.engine.llm import Engine
from prefill.server import completions, info, tokenizer_routes
from prefill.server.config import ServeConfig, model_id_of
from prefill.server.error_handlers import add_error_handlers
from prefill.server.middleware import BodyLimit
from prefill.server.openapi import bearer_auth, document, generation_bounds, refusals_are_400, server_limits
from prefill.server.security import Guard, OpenPaths
from prefill.server.state import ServerState

__all__ = ["ServeConfig", "create_app", "model_id_of"]


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Start the worker and its supervisor and measure the GEMM rate (on the worker) once now, so that predictions
    never stall a request; on the way out, end what is pending and stop the worker."""
    state: ServerState = app.state.server
    state.worker.start()
    task = asyncio.create_task(state.supervisor.run())
    await asyncio.wrap_future(state.worker.call(state.engine.gemm_rate))
    yield
    task.cancel()
    state.begin_shutdown()
    await asyncio.to_thread(state.worker.stop)
    if state.engine.kv_store is not None:  # what the last requests queued reaches the directory
        await asyncio.to_thread(state.engine.kv_store.flush)


def create_app(engine: Engine, cfg: ServeConfig) -> FastAPI:
    """The app over `engine`, its worker and supervisor started and stopped by the app's lifespan."""
    state = ServerState.build(engine, cfg)
    app = FastAPI(title="prefill", lifespan=lifespan)
    app.state.server = state
    app.state.open_paths = OpenPaths()  # what a mounted application (the lesson page) may open beside /health
    body = {"max_bytes": cfg.max_body_bytes, "timeout_s": cfg.body_timeout_s}
    app.add_middleware(BodyLimit, metrics=state.metrics, **body)
    # added last, so it runs first: an unknown Host or a missing key is refused before the body is read
    guard = {"api_key": cfg.api_key, "allowed_hosts": cfg.allowed_hosts, "open": app.state.open_paths}
    app.add_middleware(Guard, metrics=state.metrics, **guard)
    add_error_handlers(app)
    for module in (info, tokenizer_routes, completions):
        app.include_router(module.router)
    limits = partial(server_limits, cfg=cfg, vocab_size=engine.spec.vocab_size)
    auth = [partial(bearer_auth, open=app.state.open_paths)] if cfg.api_key else []
    document(app, refusals_are_400, generation_bounds, limits, *auth)
    return app
