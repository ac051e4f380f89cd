"""The server's refusals in OpenAI's shape: ApiError (a status and OpenAI's error fields) and the error body of
every 4xx and 5xx."""

from __future__ import annotations

from pydantic import BaseModel


class ApiError(Exception):
    """A refusal with an HTTP status and OpenAI's error fields; a 400 without a code of its own is
    "invalid_value", so a client can always branch on `code`."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        code = code if code is not None or status != 400 else "invalid_value"
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}  # e.g. Retry-After on a 429


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error body, the body of every 4xx and 5xx."""

    error: ErrorDetail


NOT_JSON = "the body is not valid JSON in UTF-8 (or is nested too deeply to parse)"  # every parse failure's message
MAX_MESSAGE_CHARS = 1000  # an error message is cut here: whatever part of a request it quotes, the reply stays small


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}, its message at most MAX_MESSAGE_CHARS."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1] + "…"
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
