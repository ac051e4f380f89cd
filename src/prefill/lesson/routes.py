"""The interactive lesson page at `/`: static files shipped in the package, and its JSON API under /api.

The page (plain HTML, CSS and ES modules, no build step, nothing fetched from the network) gets every number
from the API, which gets it from `prefill.costmodel.costs`; a prompt typed on the page is sent to the OpenAI routes
and so runs through the same worker as any client's. Nothing sent over HTTP is ever executed.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from prefill.lesson import api, gemm, kv_choice, live, load, nexttoken, progress, sweep, tiers
from prefill.lesson.live import document_model
from prefill.lesson.state import LessonState
from prefill.server.openapi import document
from prefill.server.state import ServerState

STATIC = Path(__file__).parent / "static"
router = APIRouter()


@router.get("/", include_in_schema=False)
async def lesson_page() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


def add_lesson(app: FastAPI) -> FastAPI:
    """Mount the lesson on an OpenAI server's app (prefill.server.app.create_app): the page and its API read the
    server's engine, its worker (every forward runs there) and its scheduler's sizes. The server knows nothing of
    the lesson; `prefill serve` and `prefill lab` compose the two: add_lesson(create_app(engine, cfg)). Returns app."""
    server: ServerState = app.state.server
    cfg, engine = server.cfg, server.engine
    loop = server.worker.loop
    requests = lambda: [*loop.waiting, *loop.running]  # noqa: E731 - read on the worker thread
    lesson = LessonState(
        engine, cfg.model_id, server.worker.call, cfg.chunk_size, cfg.max_running, loop.pool.max_tokens(), requests
    )
    add_lesson_routes(app, lesson)
    app.state.open_paths.add("/", prefix="/static/")  # the page and its files: it asks for the key, then sends it
    documents = (partial(document_model, spec=engine.spec), partial(sweep.document_measure, spec=engine.spec))
    document(app, *documents, nexttoken.document_next_text)
    return app


def add_lesson_routes(app: FastAPI, state: LessonState) -> None:
    """Serve the page at `/` and /static, the calculator API, the live-model API, the P sweep, the simulated
    load and compute-or-load, all reading `state`."""
    app.state.lesson = state
    for module in (api, live, nexttoken, gemm, progress, sweep, load, tiers, kv_choice):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="lesson-static")
    app.include_router(router)
