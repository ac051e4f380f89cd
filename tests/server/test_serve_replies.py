"""The one switch from an event to an answer's outcome (prefill.server.replies.outcome_of), without a model."""

from __future__ import annotations

from prefill.engine.request import Failed, Generation, TokenEvent
from prefill.server.api_errors import ApiError
from prefill.server.replies import outcome_of
from prefill.server.state import Aborted
from prefill.server.structured import SchemaError


def test_tokens_and_the_generation_pass_and_each_failure_is_its_own_error():
    token, gen = TokenEvent(7, " Paris", 0.25), Generation([1, 2, 3])
    assert outcome_of(token) is token and outcome_of(gen) is gen
    schema = Failed("response_format: the JSON schema is not valid", SchemaError("bad", "response_format"))
    bug = Failed("RuntimeError: the grammar refused token 5", RuntimeError("x"))
    shutdown = Aborted(503, "the server is shutting down; retry on another instance")
    cases = {
        schema: (400, "invalid_request_error", "response_format", "invalid_value"),  # a 400 always has a code
        bug: (500, "server_error", None, "generation_failed"),
        shutdown: (503, "server_error", None, "unavailable"),
    }
    for ev, (status, type_, param, code) in cases.items():
        err = outcome_of(ev)
        assert isinstance(err, ApiError) and err.message == ev.message
        assert (err.status, err.type, err.param, err.code) == (status, type_, param, code)
