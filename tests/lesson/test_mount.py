"""The OpenAI server knows nothing of the lesson: the lesson mounts itself on the server's app, as `prefill serve`
and `prefill lab` compose them, and brings its routes and its part of the OpenAPI document along."""

from __future__ import annotations

from starlette.routing import NoMatchFound

from prefill.lesson.live import CONTEXT_BOUNDED, SHAPE_BOUNDED
from prefill.lesson.routes import add_lesson
from prefill.lesson.sweep import most_measured
from prefill.server.app import ServeConfig, create_app, model_id_of


def _paths(app) -> set[str]:
    """The documented paths, with "/" and "/static" where the page and its files are served."""
    paths = set(app.openapi()["paths"])
    for name, path in (("lesson_page", "/"), ("lesson-static", "/static")):
        try:
            app.url_path_for(name, **({"path": "x.js"} if path == "/static" else {}))
            paths.add(path)
        except NoMatchFound:
            pass
    return paths


def test_the_server_alone_serves_no_lesson(smollm):
    app = create_app(smollm, ServeConfig(model_id_of(smollm), kv_cache_mb=16))
    paths = _paths(app)
    assert {"/v1/completions", "/v1/chat/completions", "/health", "/metrics"} <= paths
    assert "/" not in paths and not [p for p in paths if p.startswith(("/api", "/static"))]
    assert not hasattr(app.state, "lesson")


def test_the_lesson_mounts_its_page_api_and_document(smollm):
    app = create_app(smollm, ServeConfig(model_id_of(smollm), kv_cache_mb=16, chunk_size=64, max_running=3))
    assert add_lesson(app) is app
    paths = _paths(app)
    assert {"/", "/static", "/api/predict", "/api/sweep/curve", "/v1/completions"} <= paths
    lesson = app.state.lesson
    assert (lesson.engine, lesson.chunk_size, lesson.max_running) == (smollm, 64, 3)  # the server's own sizes
    assert lesson.pool_tokens == app.state.server.worker.loop.pool.max_tokens()
    doc = app.openapi()  # built once: _paths built it
    for (path, name), offset in CONTEXT_BOUNDED.items():  # the lesson's edit of the document, applied once
        (param,) = [p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == name]
        assert param["schema"]["maximum"] == smollm.spec.context_length + offset
    schemas = doc["components"]["schemas"]
    for name, last in SHAPE_BOUNDED.items():  # the attention body's layer and head: the model's last
        assert schemas["AttentionBody"]["properties"][name]["maximum"] == last(smollm.spec)
    assert schemas["MeasureBody"]["properties"]["P"]["maximum"] == most_measured(smollm.spec) == 1024
    assert "422" not in str(doc["paths"]["/v1/completions"]["post"]["responses"])  # the server's edits still apply
