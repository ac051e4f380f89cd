"""Who may talk to the server: the Host header (a defence against DNS rebinding, where a web page the user opened
reaches a loopback server under a name it controls) and the API key (`Authorization: Bearer KEY`, the scheme in
any case).

`Guard` stands in front of every route. A request whose Host is not allowed gets a 400; with a key set, a
request to anything but the open paths (/health, the OpenAPI document and its viewers, and what an application
mounted on the server opens with `OpenPaths.add`: a page's own HTML and static files) without the key gets a
401 in OpenAI's error shape. Keys are compared in constant time
(hmac.compare_digest), so the time of a refusal says nothing about how much of a guess was right.
"""

from __future__ import annotations

import hmac
import ipaddress

from fastapi.responses import JSONResponse

from prefill.server.api_errors import error_body
from prefill.server.metrics import ServerMetrics

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
OPEN_PATHS = ("/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/favicon.ico")


class OpenPaths:
    """The paths anyone may fetch without the key: the server's own, and those an application mounted on it adds
    (a page and its files, which then ask for the key and send it)."""

    def __init__(self) -> None:
        self.paths, self.prefixes = set(OPEN_PATHS), ()

    def add(self, *paths: str, prefix: str | None = None) -> None:
        self.paths.update(paths)
        self.prefixes = (*self.prefixes, prefix) if prefix else self.prefixes

    def __contains__(self, path: str) -> bool:
        return path in self.paths or path.startswith(self.prefixes)


def is_loopback(host: str) -> bool:
    """True for a name or address that only this machine can reach (localhost, 127.0.0.0/8, ::1)."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bound: str) -> tuple[str, ...]:
    """The loopback names, and the address the server binds when it is one a client can name (not 0.0.0.0 / ::)."""
    wildcard = bound.strip("[]") in ("0.0.0.0", "::", "")
    return LOOPBACK_HOSTS if wildcard or bound in LOOPBACK_HOSTS else (*LOOPBACK_HOSTS, bound.strip("[]"))


def host_name(header: bytes) -> str:
    """The name in a Host header, without its port: "localhost:8000" -> "localhost", "[::1]:8000" -> "::1"."""
    host = header.decode("latin-1").strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def bearer_token(header: bytes) -> bytes:
    """The credentials of an `Authorization: Bearer TOKEN` header, the scheme in any case (RFC 7235: "bearer"
    and "BEARER" are the same scheme); b"" for any other scheme or none."""
    scheme, _, token = header.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


class Guard:
    """ASGI middleware: the Host check (`allowed_hosts`, None or containing "*": any host), then the API key
    (`api_key`, None: none needed)."""

    def __init__(
        self, app, api_key: str | None, allowed_hosts: tuple[str, ...] | None, metrics: ServerMetrics, open: OpenPaths
    ):
        self.app, self.metrics, self.open = app, metrics, open
        self.key = api_key.encode() if api_key else None
        any_host = allowed_hosts is None or "*" in allowed_hosts
        self.hosts = None if any_host else frozenset(h.lower().strip("[]") for h in allowed_hosts)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.hosts is not None and host_name(headers.get(b"host", b"")) not in self.hosts:
            msg = "the Host header names a host this server does not answer for; start it with --allowed-hosts NAME"
            return await self.refuse(scope, receive, send, 400, msg, "invalid_host", {})
        given = bearer_token(headers.get(b"authorization", b""))
        if self.key is not None and scope["path"] not in self.open and not hmac.compare_digest(given, self.key):
            msg = "a valid API key is needed: send the header Authorization: Bearer KEY"
            challenge = {"WWW-Authenticate": "Bearer"}
            return await self.refuse(scope, receive, send, 401, msg, "invalid_api_key", challenge)
        return await self.app(scope, receive, send)

    async def refuse(self, scope, receive, send, status: int, msg: str, code: str, headers: dict) -> None:
        self.metrics.refused_unread(scope, status)
        response = JSONResponse(error_body(msg, "invalid_request_error", None, code), status, headers=headers)
        await response(scope, receive, send)
