"""Run an ASGI app with uvicorn: in the foreground (the CLI) or on a background thread (tests, benchmarks).

Shutdown is bounded: on SIGTERM / SIGINT (or a fatal supervisor report) the app's `begin_shutdown`
(prefill.server.state.ServerState) ends every pending request at once (503; a stream gets a final error event),
then uvicorn waits at most `GRACEFUL_SHUTDOWN_S` for connections to close before it cancels them. Any other
ASGI app runs too (without those hooks).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from prefill.machine import openmp

GRACEFUL_SHUTDOWN_S = 5.0
HEADER_TIMEOUT_S = 10.0  # ServeConfig.header_timeout_s's default
BODY_TIMEOUT_S = 30.0  # ServeConfig.body_timeout_s's default


class SlowClientTimeout(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with deadlines on what a slow client sends: a client that opens a connection (or
    finishes a response) and then sends partial headers, a byte now and then (slow loris), is cut off
    `header_timeout_s` later (uvicorn's own keep-alive timer stops at the first byte received). While the app
    answers a request, its body's deadline is the app's (prefill.server.middleware.BodyLimit: a 408); a body still
    coming after the response (a refusal sent before the body was read) is cut off `body_timeout_s` later."""

    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self.conn.their_state is not h11.IDLE and not self._answered():
            self._deadline.cancel()  # the headers are in and the app is answering: the body's deadline is its own
            self._deadline = None

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _answered(self) -> bool:
        return self.cycle is not None and self.cycle.response_complete

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        wait = self.header_timeout_s if self.conn.their_state is h11.IDLE else self.body_timeout_s
        self._deadline = self.loop.call_later(wait, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        state = self.conn.their_state
        unread_body = state is h11.SEND_BODY and self._answered()
        if (state is h11.IDLE or unread_body) and not self.transport.is_closing():
            self.transport.close()


def _protocol(header_timeout_s: float, body_timeout_s: float) -> type[SlowClientTimeout]:
    timeouts = {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s}
    return type("SlowClientTimeoutH11", (SlowClientTimeout,), timeouts)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _server_state(app):
    """The app's prefill.server.state.ServerState, or None for another ASGI app."""
    return getattr(getattr(app, "state", None), "server", None)


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app that shutdown began before it waits for the open connections."""

    async def shutdown(self, sockets=None) -> None:
        state = _server_state(self.config.app)
        if state is not None:
            state.begin_shutdown()
        await super().shutdown(sockets)


def _server(app, host: str, port: int, log_level: str) -> _Server:
    state = _server_state(app)
    cfg = state.cfg if state is not None else None
    header_timeout_s = cfg.header_timeout_s if cfg is not None else HEADER_TIMEOUT_S
    body_timeout_s = cfg.body_timeout_s if cfg is not None else BODY_TIMEOUT_S
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http=_protocol(header_timeout_s, body_timeout_s),
    )
    server = _Server(config)
    if state is not None:  # the supervisor's way to stop the process when the worker cannot serve
        state.on_fatal = lambda: setattr(server, "should_exit", True)
    return server


class BackgroundServer:
    """`with BackgroundServer(app) as url:` serves `app` on a free loopback port until the block ends."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None, start_timeout_s: float = 60.0):
        self.host, self.port = host, port or free_port(host)
        self._server = _server(app, self.host, self.port, "warning")
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)
        self._start_timeout_s = start_timeout_s

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> str:
        # The calling thread hands its model to the server's worker, as `prefill serve`'s main thread does when
        # the worker starts (there the same thread): its OpenMP helpers beside the worker's would make libgomp
        # stop spinning both (prefill.machine.openmp; in-process, a 3-token prefill 1.5x slower, 2 cores).
        openmp.release_thread_pool()
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


def run_server(app, host: str, port: int) -> int:
    """Serve in the foreground until SIGTERM / SIGINT; the exit status: 0, or the app's `exit_code` (1 when the
    supervisor found the worker dead or stuck)."""
    _server(app, host, port, "info").run()
    state = _server_state(app)
    return state.exit_code if state is not None else 0
