"""Issue 44 against one real server with an API key and a Host list: who may talk to it (401 / 400 in OpenAI's
shape, /health open, the counts in /metrics balanced), slow clients cut off at the header deadline, one
`invalid_json` for every body that cannot be parsed, and errors that cut what they quote. Then the commands:
`prefill loadtest --api-key` against it, and `prefill serve --host 0.0.0.0` without a key warns."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from prefill.lesson.routes import add_lesson
from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer, free_port

pytestmark = pytest.mark.slow
KEY = "sk-test-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
HEADER_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(smollm_native):
    cfg = ServeConfig(
        model_id_of(smollm_native),
        kv_cache_mb=128,
        chunk_size=64,
        max_tokens_limit=64,
        api_key=KEY,
        allowed_hosts=("localhost", "127.0.0.1"),
        header_timeout_s=HEADER_TIMEOUT_S,
    )
    # with the lesson mounted, as `prefill serve` serves it: its /api routes are behind the key too
    with BackgroundServer(add_lesson(create_app(smollm_native, cfg))) as url:
        yield url, cfg.model_id


def counter(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE))


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/api/catalog"), ("POST", "/tokenize")],
)
@pytest.mark.parametrize("auth", [None, "Bearer wrong-key", f"Bearer {KEY}x", KEY, f"Basic {KEY}"])
def test_a_request_without_the_key_gets_401_in_openais_shape(server, method, path, auth):
    url, _ = server
    headers = {"Authorization": auth} if auth else {}
    r = httpx.request(method, f"{url}{path}", headers=headers, json={"prompt": "hi"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    error = r.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"} and "Authorization: Bearer" in error["message"]


def test_the_key_opens_every_route_and_health_needs_none(server):
    url, model = server
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/").status_code == 200  # the page itself: it then sends the key to /api and /v1
    assert httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["id"] == model
    assert httpx.get(f"{url}/api/catalog", headers=AUTH).status_code == 200
    assert "prefill_received_requests" in httpx.get(f"{url}/metrics", headers=AUTH).text
    body = {"model": model, "prompt": "One, two,", "max_tokens": 2, "temperature": 0}
    assert httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=60).status_code == 200


def test_an_unknown_host_gets_400_even_with_the_key(server):
    url, _ = server
    port = url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "localhost.evil.example", "127.0.0.2"):
        r = httpx.get(f"{url}/v1/models", headers={**AUTH, "Host": host})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", host
        assert httpx.get(f"{url}/health", headers={"Host": host}).status_code == 400
    for host in (f"localhost:{port}", "LOCALHOST", "127.0.0.1"):
        assert httpx.get(f"{url}/v1/models", headers={**AUTH, "Host": host}).status_code == 200, host


def test_a_refused_generation_post_is_received_and_refused_in_metrics(server):
    url, model = server
    received, errors = counter(url, "prefill_received_requests_total"), counter(url, "prefill_errors_total")
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": model, "messages": []})
    assert r.status_code == 401
    assert counter(url, "prefill_received_requests_total") == received + 1
    assert counter(url, "prefill_errors_total") == errors + 1


def test_partial_headers_do_not_hold_a_connection_open(server):
    """Slow loris: a client that sends a header line now and then is cut off at the header deadline, while the
    server keeps answering others."""
    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        slow.settimeout(0.2)
        t0, closed = time.monotonic(), False
        while time.monotonic() - t0 < 30 * HEADER_TIMEOUT_S:  # bounded: it must end well before this
            try:
                slow.sendall(b"X-Slow: 1\r\n")
                closed = slow.recv(1024) == b""
            except TimeoutError:
                assert httpx.get(f"{url}/health").status_code == 200  # others are served meanwhile
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            if closed:
                break
    assert closed, "the server kept a connection with partial headers open"


def test_a_connection_that_completes_its_headers_is_not_cut(server):
    url, _ = server
    with httpx.Client(base_url=url) as client:  # one kept-alive connection, idle less than the keep-alive timeout
        for _ in range(3):
            assert client.get("/health").status_code == 200
            time.sleep(HEADER_TIMEOUT_S * 0.6)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,  # nested deeper than the parser's recursion limit
        b'{"model": "m", "prompt": "\xff\xfe"}',  # not UTF-8
        json.dumps({"model": "m", "prompt": "hi"}).encode("utf-16"),  # UTF-16 (with its byte-order mark)
        json.dumps({"model": "m", "prompt": "hi"}).encode("utf-16-le"),  # UTF-16 without one
        json.dumps({"model": "m", "prompt": "hi"}).encode("utf-32"),
        b'{"model": "m", "prompt": ',  # cut short
    ],
)
def test_every_body_that_cannot_be_parsed_gets_one_error(server, body):
    url, _ = server
    r = httpx.post(f"{url}/v1/completions", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "the body is not valid JSON in UTF-8 (or is nested too deeply to parse)",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_json",
    }


def test_a_utf8_body_with_a_byte_order_mark_is_read(server):
    url, model = server
    body = b"\xef\xbb\xbf" + json.dumps({"model": model, "prompt": "One,", "max_tokens": 1}).encode()
    r = httpx.post(f"{url}/v1/completions", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_a_huge_number_is_not_echoed_in_full(server):
    url, model = server
    huge = "9" * 4001
    body = f'{{"model": "{model}", "prompt": "hi", "max_tokens": {huge}}}'.encode()
    r = httpx.post(f"{url}/v1/completions", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and "4001 characters" in error["message"]
    assert len(error["message"]) < 100


@pytest.mark.parametrize(
    "fields", [{"max_tokens": 100_000_000, "max_completion_tokens": 1}, {"max_tokens": 1, "max_completion_tokens": 65}]
)
def test_an_over_limit_max_tokens_is_refused_whichever_field_wins(server, fields):
    url, model = server
    r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hi", **fields}, headers=AUTH)
    assert r.status_code == 400
    over = next(name for name, v in fields.items() if v > 64)
    assert r.json()["error"]["param"] == over and "limit 64" in r.json()["error"]["message"]


def prefill_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from prefill.cli.main import main; main()", *args]


def test_loadtest_sends_the_key(server, tmp_path):
    url, _ = server
    out = tmp_path / "load.json"
    args = ("loadtest", "--url", url, "--requests", "2", "--concurrency", "1", "--prompt-len", "8")
    cmd = prefill_command(*args, "--max-tokens", "2", "--api-key", KEY, "--out", str(out))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "MPLBACKEND": "Agg"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["error"] for r in report["requests"]] == [None, None]
    assert report["config"]["api_key"] is True and KEY not in out.read_text()  # the key is never written down


def test_serving_beyond_loopback_without_a_key_warns():
    """The warning comes before the model loads: read stderr up to it, then stop the server."""
    cmd = prefill_command("serve", "--host", "0.0.0.0", "--port", str(free_port()), "--weights", "native")
    env = {k: v for k, v in os.environ.items() if k != "PREFILL_API_KEY"}
    lines = []
    with subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env) as proc:
        watchdog = threading.Timer(180, proc.kill)  # bounded, should the warning never come
        watchdog.start()
        try:
            for line in proc.stderr:
                lines.append(line)
                if "--allowed-hosts" in line:  # the second of the two notes
                    break
        finally:
            watchdog.cancel()
            proc.terminate()
            proc.communicate(timeout=60)
    err = "".join(lines)
    assert "warning: --host 0.0.0.0 without --api-key" in err and "/v1" in err and "/metrics" in err, err[-3000:]
    assert "other" in err and "HTTP 400" in err, err[-3000:]


# ---- what schemathesis --checks all found: the document states each rule between fields, the server keeps it --


def document_validator(url: str, name: str):
    import jsonschema

    doc = httpx.get(f"{url}/openapi.json").json()
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": doc["components"]})


@pytest.mark.parametrize(
    ("name", "path", "fields", "valid"),
    [
        ("CompletionRequest", "/v1/completions", {"prompt": ["One", "Two"], "stream": True}, False),
        ("CompletionRequest", "/v1/completions", {"prompt": ["One"], "stream": True}, True),
        ("CompletionRequest", "/v1/completions", {"prompt": "One", "max_tokens": 0}, False),
        (
            "CompletionRequest",
            "/v1/completions",
            {"prompt": [5, 7], "max_tokens": 0, "echo": True, "logprobs": 0},
            True,
        ),
        ("CompletionRequest", "/v1/completions", {"prompt": [[5, 7]], "echo": True, "logprobs": 0}, True),
        ("ChatCompletionRequest", "/v1/chat/completions", {"messages": [{"role": "tool"}]}, False),
        (
            "ChatCompletionRequest",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 0},
            True,
        ),
        (
            "ChatCompletionRequest",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2},
            False,
        ),
        (
            "ChatCompletionRequest",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0},
            False,
        ),
        (
            "ChatCompletionRequest",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "tool_choice": "required"},
            False,
        ),
        (
            "ChatCompletionRequest",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "tool_choice": "none"},
            True,
        ),
        (
            "ChatCompletionRequest",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_schema"}},
            False,
        ),
    ],
)
def test_the_document_and_the_server_agree_on_the_rules_between_fields(server, name, path, fields, valid):
    url, model = server
    body = {"model": model, "max_tokens": 1, **fields}
    assert document_validator(url, name).is_valid(body) == valid
    r = httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=60)
    assert r.status_code == (200 if valid else 400), r.text


def test_the_lessons_integer_fields_take_integer_valued_numbers(server):
    url, _ = server
    r = httpx.post(f"{url}/api/sweep/measure", json={"P": 4.0}, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
