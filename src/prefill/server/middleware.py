"""ASGI middleware in front of every route: the arrival time, the count of generation POSTs received, the
request-body limit (413), and UTF-8 (JSON in UTF-16 or UTF-32, which Python's json reads, or bytes that are not
UTF-8, get the 400 `invalid_json` that every body the server cannot parse gets)."""

from __future__ import annotations

import json
import time

from fastapi.responses import JSONResponse

from prefill.server.metrics import ServerMetrics, is_generation
from prefill.server.openai_schema import NOT_JSON, error_body


class BodyLimit:
    """Stamps the arrival time and refuses bodies over `max_bytes` with 413.

    The body is read here (bounded), so a chunked upload without Content-Length is limited too.
    """

    def __init__(self, app, max_bytes: int, metrics: ServerMetrics) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})["arrival"] = time.perf_counter()
        generation = is_generation(scope)
        if generation:
            self.metrics.received.inc()
        declared = dict(scope["headers"]).get(b"content-length")
        too_large = declared is not None and declared.isdigit() and int(declared) > self.max_bytes
        chunks, size, more = [], 0, scope["method"] in ("POST", "PUT", "PATCH") and not too_large
        while more and not too_large:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                if generation:  # received, and gone before its body arrived
                    self.metrics.cancelled.labels(reason="disconnect").inc()
                return None
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more, too_large = msg.get("more_body", False), size > self.max_bytes
        if too_large:
            self.metrics.error(scope, 413)
            msg = f"request body is over the limit of {self.max_bytes} bytes; send a shorter prompt"
            response = JSONResponse(error_body(msg, "invalid_request_error", None, "request_too_large"), 413)
            return await response(scope, receive, send)
        body = b"".join(chunks)
        if body and not is_utf8(body):
            self.metrics.error(scope, 400)
            response = JSONResponse(error_body(NOT_JSON, "invalid_request_error", None, "invalid_json"), 400)
            return await response(scope, receive, send)
        return await self.app(scope, _Replay(body, receive), send)


def is_utf8(body: bytes) -> bool:
    """The body is UTF-8 text (with or without a byte-order mark), as JSON on the wire must be (RFC 8259)."""
    if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):
        return False
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _Replay:
    """The ASGI `receive` of a body already read: the body once, then the connection's own messages."""

    def __init__(self, body: bytes, receive) -> None:
        self.body, self.receive, self.sent = body, receive, False

    async def __call__(self) -> dict:
        if not self.sent:
            self.sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        return await self.receive()
