"""The interactive lesson page at `/`: static files shipped in the package, and its JSON API under /api.

The page (plain HTML, CSS and ES modules, no build step, nothing fetched from the network) gets every number
from the API, which gets it from `prefill.costmodel.costs`; a prompt typed on the page is sent to the OpenAI routes
and so runs through the same scheduler as any client's. Nothing sent over HTTP is ever executed.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from prefill.engine.llm import Engine
from prefill.lesson.api import calculator_router
from prefill.lesson.live import live_router

STATIC = Path(__file__).parent / "static"


def add_lesson_routes(app: FastAPI, engine: Engine | None, model_id: str | None = None) -> None:
    """Serve the page at `/` and /static, the calculator API, and (with an engine) the live-model API."""
    dtype = str(engine.dtype).removeprefix("torch.") if engine is not None else None
    app.include_router(calculator_router(engine.spec if engine else None, dtype, model_id))
    if engine is not None:
        app.include_router(live_router(engine))
    app.mount("/static", StaticFiles(directory=STATIC), name="lesson-static")

    @app.get("/", include_in_schema=False)
    async def lesson_page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})
