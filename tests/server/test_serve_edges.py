"""Issue 53's server edges against one real server: Host names added beside the loopback ones (and one removed
explicitly), slow request bodies cut with a 408, a burst admitted up to max_running + max_queue, and the
validation of tool_choice, message keys, a $ref loop, the Bearer scheme's case and /tokenize's length. Every
slow client is bounded in time and count, on loopback only."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from prefill.cli.serve import access_of
from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = pytest.mark.slow
KEY = "sk-edges-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_TIMEOUT_S = 1.0
MAX_RUNNING, MAX_QUEUE = 4, 8


@pytest.fixture(scope="module")
def server(smollm_native):
    # as `prefill serve --allowed-hosts a.example,-localhost` builds it: one name added, one loopback name removed
    access = access_of("127.0.0.1", KEY, None, "a.example,-localhost")
    cfg = ServeConfig(
        model_id_of(smollm_native),
        kv_cache_mb=128,
        chunk_size=64,
        max_tokens_limit=512,
        max_running=MAX_RUNNING,
        max_queue=MAX_QUEUE,
        header_timeout_s=2.0,
        body_timeout_s=BODY_TIMEOUT_S,
        **access,
    )
    app = create_app(smollm_native, cfg)
    with BackgroundServer(app) as url:
        yield url, cfg.model_id, app


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# ---- 1. --allowed-hosts adds names; the loopback names stay unless removed by name -------------------------------


def test_added_hosts_keep_the_loopback_names_unless_one_is_removed(server):
    url, *_ = server
    port = port_of(url)
    for host in ("127.0.0.1", f"127.0.0.1:{port}", "[::1]", f"[::1]:{port}", "a.example", f"A.EXAMPLE:{port}"):
        assert httpx.get(f"{url}/health", headers={"Host": host}).status_code == 200, host
        assert httpx.get(f"{url}/v1/models", headers={**AUTH, "Host": host}).status_code == 200, host
    for host in ("localhost", f"localhost:{port}", "b.example"):  # removed with -localhost; never added
        r = httpx.get(f"{url}/health", headers={"Host": host})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", host


# ---- 2. a body sent a byte now and then is cut with a 408 ---------------------------------------------------------


def slow_bodies(port: int, head: bytes, n: int, every_s: float, limit_s: float) -> list[bytes]:
    """Open `n` connections that send `head` and then one body byte every `every_s` seconds; what each received
    before the server closed it (all within `limit_s`, or the test fails)."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    got, open_ = [b""] * n, set(range(n))
    for s in socks:
        s.sendall(head)
        s.setblocking(False)
    t0 = time.monotonic()
    try:
        while open_ and time.monotonic() - t0 < limit_s:
            for i in list(open_):
                try:
                    socks[i].send(b" ")
                    while chunk := socks[i].recv(65536):
                        got[i] += chunk
                    open_.discard(i)  # b"": the server closed it
                except BlockingIOError:
                    continue  # nothing to read yet
                except (BrokenPipeError, ConnectionResetError):
                    open_.discard(i)
            time.sleep(every_s)
    finally:
        for s in socks:
            s.close()
    assert not open_, f"{len(open_)} of {n} slow bodies were still open after {limit_s} s"
    return got


def test_slow_bodies_get_a_408_and_their_connections_close(server):
    """20 connections sending a body byte every 0.3 s: each gets its 408 (OpenAI's error shape) and is closed at the
    body deadline (1 s here), while /health answers meanwhile."""
    url, model, _ = server
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    done: list[list[bytes]] = []
    clients = threading.Thread(target=lambda: done.append(slow_bodies(port_of(url), head, 20, 0.3, 20.0)))
    clients.start()
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    clients.join(timeout=30)
    for reply in done[0]:
        assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
        assert b'"code":"request_timeout"' in reply and b"connection: close" in reply.lower()


def test_a_body_still_coming_after_a_refusal_is_cut_too(server):
    """A request refused before its body is read (no API key: 401) keeps no connection open by sending its body
    slowly afterwards."""
    url, *_ = server
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n"
    (reply,) = slow_bodies(port_of(url), head, 1, 0.3, 20.0)
    assert reply.startswith(b"HTTP/1.1 401 "), reply[:200]


def test_a_body_sent_at_once_is_not_cut(server):
    url, model, _ = server
    with httpx.Client(base_url=url, headers=AUTH, timeout=60) as client:
        for _ in range(2):  # one kept-alive connection, idle less than the deadlines between requests
            body = {"model": model, "prompt": "One, two,", "max_tokens": 2}
            assert client.post("/v1/completions", json=body).status_code == 200
            time.sleep(BODY_TIMEOUT_S * 0.6)


# ---- 3. a burst fills the running slots and the queue -------------------------------------------------------------


def burst(url: str, body: dict, n: int, then=None) -> list[int]:
    """`n` streams sent at once (a barrier); the status of each. An admitted stream holds its place until every
    status is in; then `then()` runs (if given) and each admitted stream is read to its end ([DONE]) or, with
    `then` None, closed unread (its client disconnects)."""
    statuses, lock, start, counted = [], threading.Lock(), threading.Barrier(n), threading.Event()
    ends: list[str] = []

    def one() -> None:
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as client:
            start.wait()
            with client.stream("POST", "/v1/completions", json=body) as r:
                with lock:
                    statuses.append(r.status_code)
                    if len(statuses) == n:
                        if then is not None:
                            then()
                        counted.set()
                counted.wait(timeout=120)
                if r.status_code == 200 and then is not None:
                    last = [line for line in r.iter_lines() if line.startswith("data: ")][-1]
                    with lock:
                        ends.append(last)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client of the burst did not finish"
    if then is not None:  # every admitted stream was served to its end
        assert ends == ["data: [DONE]"] * statuses.count(200)
    return sorted(statuses)


def wait_idle(url: str) -> None:
    """Until the step loop holds no request (the gauges of /metrics), 10 s at most."""
    for _ in range(200):
        gauges = httpx.get(f"{url}/metrics", headers=AUTH).text
        if "prefill_running_requests 0.0" in gauges and "prefill_queued_requests 0.0" in gauges:
            return
        time.sleep(0.05)
    raise AssertionError("the step loop did not become idle")


def held_burst(url: str, worker, body: dict, n: int) -> list[int]:
    """A burst while the worker is held between two steps (Worker.call), so that none of it has started when
    the statuses are in; then the worker goes on and serves the admitted streams to their end."""
    gate = threading.Event()
    held = worker.call(gate.wait)
    statuses = burst(url, body, n, then=gate.set)
    assert held.result(60)
    return statuses


def test_a_burst_is_admitted_up_to_max_running_plus_max_queue(server):
    """64 streams at once against --max-running 4 --max-queue 8: exactly 12 are admitted, the other 52 get a 429
    at once. First while none of the burst has started: requests handed over but not started count against the
    free running slots, not against the queue (main admitted 8); the 12 are served to the end. Then on a free
    worker, with streams long enough to hold their places until every status is in; their clients close them
    unread (a disconnect). After each burst every place comes back: the next one gets 12 again."""
    url, model, app = server
    n, admitted = 64, [200] * (MAX_RUNNING + MAX_QUEUE) + [429] * (64 - MAX_RUNNING - MAX_QUEUE)
    short = {"model": model, "prompt": "Count:", "max_tokens": 4, "ignore_eos": True, "stream": True}
    worker = app.state.server.worker
    assert held_burst(url, worker, short, n) == admitted
    wait_idle(url)
    assert burst(url, {**short, "max_tokens": 400}, n) == admitted  # none ends before every status is in
    wait_idle(url)
    assert held_burst(url, worker, short, n) == admitted


# ---- 6. validation ------------------------------------------------------------------------------------------------


def chat(url: str, model: str, headers: dict = AUTH, **fields) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **fields}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)


TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def test_a_tool_choice_outside_tools_is_a_400_with_a_code(server):
    url, model, _ = server
    r = chat(url, model, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_date"}})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "invalid_value" and error["param"] == "tool_choice" and "get_date" in error["message"]


def test_an_unknown_key_in_a_message_is_refused_by_name(server):
    url, model, _ = server
    r = chat(url, model, messages=[{"role": "user", "content": "Hi", "colour": "red"}])
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages.0.colour" and error["code"] == "unsupported_parameter"
    named = chat(url, model, messages=[{"role": "user", "content": "Hi", "name": "ada"}])  # OpenAI's own key
    assert named.status_code == 200, named.text


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
        {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"],
         "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
    ],
)  # fmt: skip
def test_a_ref_loop_in_a_json_schema_is_a_400(server, schema):
    url, model, _ = server
    fmt = {"type": "json_schema", "json_schema": {"name": "loop", "schema": schema}}
    r = chat(url, model, response_format=fmt)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format"


def test_a_recursive_schema_that_matches_json_is_served(server):
    """A tree (a $ref that can end) is no loop: it is served, and the answer parses."""
    url, model, _ = server
    tree = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 0}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "tree", "schema": tree}}
    r = chat(url, model, response_format=fmt, max_tokens=8)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_the_bearer_scheme_is_read_in_any_case(server, scheme):
    url, *_ = server
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"{scheme} {KEY}"}).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"{scheme} {KEY}x"}).status_code == 401


def test_tokenize_refuses_a_text_longer_than_the_context_can_hold(server, smollm_native):
    url, *_ = server
    intake_limit = smollm_native.spec.context_length * max(len(t) for t in smollm_native.tokenizer.tok.get_vocab())
    r = httpx.post(f"{url}/tokenize", json={"prompt": "a" * (intake_limit + 1)}, headers=AUTH, timeout=60)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["code"] == "context_length_exceeded"
    ok = httpx.post(f"{url}/tokenize", json={"prompt": "AI is fast"}, headers=AUTH)
    assert ok.json()["count"] == 3
