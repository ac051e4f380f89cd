"""The interactive lesson page at `/`: static files shipped in the package, and its JSON API under /api.

The page (plain HTML, CSS and ES modules, no build step, nothing fetched from the network) gets every number
from the API, which gets it from `prefill.costmodel.costs`; a prompt typed on the page is sent to the OpenAI routes
and so runs through the same worker as any client's. Nothing sent over HTTP is ever executed.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from prefill.lesson import api, live, load, sweep, tiers
from prefill.lesson.state import LessonState

STATIC = Path(__file__).parent / "static"
router = APIRouter()


@router.get("/", include_in_schema=False)
async def lesson_page() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


def add_lesson_routes(app: FastAPI, state: LessonState) -> None:
    """Serve the page at `/` and /static, the calculator API, the live-model API, the P sweep, the simulated
    load and compute-or-load, all reading `state`."""
    app.state.lesson = state
    for module in (api, live, sweep, load, tiers):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="lesson-static")
    app.include_router(router)
