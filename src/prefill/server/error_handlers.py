"""Every refusal as OpenAI's error body {"error": {"message", "type", "param", "code"}}, counted in /metrics by
route and HTTP status: our ApiError and BadInput, pydantic's validation errors (a 400, never FastAPI's 422), Starlette's
404 / 405, and a bug (a JSON 500; the server keeps serving)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from prefill.errors import BadInput
from prefill.server.api_errors import NOT_JSON, ApiError, error_body

FASTAPI_PARSE_ERROR = "There was an error parsing the body"  # FastAPI's detail when reading the JSON raised
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict"}  # pydantic's names of a union's members in `loc`
log = logging.getLogger("prefill.serve")


def refuse(request: Request, status: int, body: dict) -> JSONResponse:
    request.app.state.server.metrics.error(request.scope, status)
    return JSONResponse(body, status_code=status)


async def api_error(request: Request, e: ApiError) -> JSONResponse:
    response = refuse(request, e.status, error_body(e.message, e.type, e.param, e.code))
    response.headers.update(e.headers)
    return response


async def bad_input(request: Request, e: BadInput) -> JSONResponse:
    param = getattr(e, "param", None)
    return refuse(request, 400, error_body(str(e), "invalid_request_error", param, "invalid_value"))


async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
    # A union field (stop: text | [text]) fails once per member: report our own check's message if one fired (a
    # lone surrogate), else a bound the member of the right type broke (17 stop strings: "at most 16 items"), else
    # the first.
    errors = e.errors()
    err = next((x for x in errors if x.get("type") == "value_error"), None)
    err = err or next((x for x in errors if not str(x.get("type", "")).endswith("_type")), errors[0])
    if err.get("type") == "json_invalid":
        return refuse(request, 400, error_body(NOT_JSON, "invalid_request_error", None, "invalid_json"))
    param = param_of(err.get("loc", ()))
    if param is None:  # the body as a whole: not a JSON object (or sent without a JSON content type)
        msg = "the body must be a JSON object (Content-Type: application/json)"
        return refuse(request, 400, error_body(msg, "invalid_request_error", None, "invalid_json"))
    if err.get("type") == "extra_forbidden":
        msg, code = f"{param}: this server does not know this field; remove it", "unsupported_parameter"
    else:
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        msg, code = f"{param}: {msg}", "invalid_value"
    return refuse(request, 400, error_body(msg, "invalid_request_error", param, code))


def param_of(loc) -> str | None:
    """The field a validation error is about, as a client names it ("messages.0.content"), or None: the body."""
    loc = [str(x) for x in loc if x != "body"]
    if loc[:1] in (["query"], ["path"]):  # a URL's parameter (e.g. the lesson's ?N=): its name as it is
        loc = loc[1:2]
    else:  # pydantic names the member of a union it tried ("prompt.str", "messages.0.UserMessage"): keep the field
        # path only (a class name is CamelCase; the lesson's single-letter fields, "P", are names of fields)
        loc = [x for x in loc if not (_class_name(x) or x in _UNION_TAGS or any(c in x for c in "[(-'"))]
    return ".".join(loc) or None


def _class_name(x: str) -> bool:
    return x[:1].isupper() and x[1:2].islower()


async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
    if e.status_code == 400 and e.detail == FASTAPI_PARSE_ERROR:  # json.loads failed otherwise (RecursionError)
        return refuse(request, 400, error_body(NOT_JSON, "invalid_request_error", None, "invalid_json"))
    code = "not_found" if e.status_code == 404 else None
    response = refuse(request, e.status_code, error_body(str(e.detail), "invalid_request_error", None, code))
    response.headers.update(e.headers or {})  # e.g. Allow on a 405
    return response


async def bug(request: Request, e: Exception) -> JSONResponse:
    log.exception("unexpected error in a request handler")
    body = error_body(f"internal error: {type(e).__name__}", "server_error", None, "internal_error")
    return refuse(request, 500, body)


def add_error_handlers(app: FastAPI) -> None:
    for kind, handler in (
        (ApiError, api_error),
        (BadInput, bad_input),
        (RequestValidationError, invalid),
        (StarletteHTTPException, http_error),
        (Exception, bug),
    ):
        app.add_exception_handler(kind, handler)
