"""The lesson's API tests share one shape of server: the embedded model behind the real app, one per module."""

from __future__ import annotations

import pytest

from prefill.lesson.routes import add_lesson
from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer


@pytest.fixture(scope="module")
def url(smollm):
    """The root URL of a server over the embedded model (a 64 MiB KV pool), for the module's tests."""
    with BackgroundServer(add_lesson(create_app(smollm, ServeConfig(model_id_of(smollm), kv_cache_mb=64)))) as root:
        yield root
