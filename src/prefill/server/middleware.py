"""ASGI middleware in front of every route: the arrival time, the count of generation POSTs received, the
request-body limit (413), the body's deadline (408: a body sent a byte now and then holds no connection), and
UTF-8 (JSON in UTF-16 or UTF-32, which Python's json reads, or bytes that are not UTF-8, get the 400
`invalid_json` that every body the server cannot parse gets)."""

from __future__ import annotations

import asyncio
import json
import time

from fastapi.responses import JSONResponse

from prefill.server.api_errors import NOT_JSON, error_body
from prefill.server.metrics import ServerMetrics, is_generation

CLOSE = {"Connection": "close"}  # a 408 is sent before the body is whole: the rest of it is never read


class BodyLimit:
    """Stamps the arrival time, refuses bodies over `max_bytes` with 413 and bodies not complete `timeout_s` after
    the headers with 408 (the connection is closed: what the client still sends is never read).

    The body is read here (bounded in size and time), so a chunked upload without Content-Length is limited too.
    """

    def __init__(self, app, max_bytes: int, timeout_s: float, metrics: ServerMetrics) -> None:
        self.app, self.max_bytes, self.timeout_s, self.metrics = app, max_bytes, timeout_s, metrics

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
        deadline = scope["state"]["arrival"] + self.timeout_s
        while more and not too_large:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - time.perf_counter()))
            except TimeoutError:
                return await self.too_slow(scope, receive, send, size)
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
            body = error_body(msg, "invalid_request_error", None, "request_too_large")
            # the connection stays open: uvicorn reads the rest of the body away (a slow rest is cut off by
            # prefill.server.server.SlowClientTimeout); closing now would reset a client still sending
            return await JSONResponse(body, 413)(scope, receive, send)
        body = b"".join(chunks)
        if body and not is_utf8(body):
            self.metrics.error(scope, 400)
            response = JSONResponse(error_body(NOT_JSON, "invalid_request_error", None, "invalid_json"), 400)
            return await response(scope, receive, send)
        return await self.app(scope, _Replay(body, receive), send)

    async def too_slow(self, scope, receive, send, size: int) -> None:
        """The 408 of a body still incomplete at its deadline; the connection closes after it."""
        self.metrics.error(scope, 408)  # a generation POST's is received (counted above) and refused
        msg = f"the request body was not complete {self.timeout_s:g} s after its headers ({size} bytes came)"
        body = error_body(msg, "invalid_request_error", None, "request_timeout")
        await JSONResponse(body, 408, headers=CLOSE)(scope, receive, send)


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
