"""The OpenAPI document as the server really behaves: refusals are 400 (never FastAPI's 422) with OpenAI's error
body, 404 / 413 / 429 / 500 / 503 are listed, streamed answers are `text/event-stream`, and the request schemas
state this server's own limits."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from pydantic import BaseModel

from prefill.server.api_errors import ErrorResponse
from prefill.server.config import ServeConfig
from prefill.server.openai_schema import NOT_SUPPORTED, ChatCompletionRequest, CompletionRequest
from prefill.server.security import OpenPaths


class HealthBody(BaseModel):
    status: str  # "ok" or "error"
    reason: str | None  # why the server cannot serve (worker dead or stuck, shutting down)
    model: str
    dtype: str  # the dtype the engine runs in
    weights: str  # "native" (the GGUF's blocks) or the dense dtype they are stored in
    activations: str  # what the blocks' products take: "f32", or "q8" (8-bit activations)
    kv_dtype: str  # what the KV pool stores K/V as: float32, bfloat16, float16 or q8_0
    path: str  # the path in words (Engine.path_label), as the start-up line and /v1/models name it


def _error(description: str) -> dict:
    return {"model": ErrorResponse, "description": description}


GENERATION_RESPONSES: dict = {
    200: {
        "description": "The answer: JSON, or with `stream: true` server-sent events ending in `data: [DONE]`",
        "content": {
            "text/event-stream": {
                "schema": {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}
            }
        },
    },
    400: _error("Invalid request, or an OpenAI field this server refuses (`param` names it)"),
    404: _error("Unknown model"),
    413: _error("Request body over the server's limit"),
    429: {
        **_error("The queue is full; retry after Retry-After seconds"),
        "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer", "minimum": 0}}},
    },
    500: _error("Generation failed for this request (the server keeps serving)"),
    503: _error("The server is shutting down or cannot serve (see /health)"),
}


def document(app: FastAPI, *edits: Callable[[dict], None]) -> None:
    """app.openapi() builds FastAPI's document once, applies `edits` to it in order, and keeps it."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = build()
            for edit in edits:
                edit(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi


def refusals_are_400(doc: dict) -> None:
    """Replace FastAPI's 422 (this server answers 400), list 413 wherever a body is taken, and drop FastAPI's
    validation-error schemas."""
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            responses = op.get("responses", {})
            if responses.pop("422", None) is not None:
                responses.setdefault("400", {"description": "Invalid request", "content": body})
            if "requestBody" in op:  # the body limit (middleware) stands before every route that takes a body
                responses.setdefault("413", {"description": "Request body over the server's limit", "content": body})
    schemas = doc.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)


def bearer_auth(doc: dict, open: OpenPaths) -> None:
    """With an API key: every operation outside the open paths (prefill.server.security) needs `Authorization:
    Bearer KEY` and lists its 401."""
    doc.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for path, ops in doc.get("paths", {}).items():
        if path in open:
            continue
        for op in ops.values():
            op["security"] = [{"bearer": []}]
            op.setdefault("responses", {})["401"] = {"description": "No API key, or a wrong one", "content": body}


def exact_bounds(doc: dict, models: tuple[type[BaseModel], ...]) -> None:
    """The request models' own numeric bounds, as validation checks them: FastAPI writes bounds as floats, and
    seed's 2^64 - 1 becomes 1.8446744073709552e19, a number above what the server takes."""
    schemas = doc.get("components", {}).get("schemas", {})
    for model in models:
        documented = schemas.get(model.__name__, {}).get("properties", {})
        for name, source in model.model_json_schema()["properties"].items():
            if name in documented:
                _copy_bounds(source, documented[name])


def generation_bounds(doc: dict) -> None:
    """exact_bounds of the two generation requests, and the rules between their fields that Intake checks, as JSON
    Schema's if / then (RULES)."""
    exact_bounds(doc, (CompletionRequest, ChatCompletionRequest))
    schemas = doc.get("components", {}).get("schemas", {})
    for name, rules in RULES.items():
        if name in schemas:
            schemas[name]["allOf"] = [*schemas[name].get("allOf", []), *rules]


def _when(condition: dict, then: dict | None = None, otherwise: dict | None = None) -> dict:
    """JSON Schema's if / then / else: `condition` maps each field it names (all required) to its schema."""
    rule: dict = {"if": {"required": list(condition), "properties": condition}}
    if then is not None:
        rule["then"] = then
    if otherwise is not None:
        rule["else"] = otherwise
    return rule


_SCORING = {"max_tokens": {"const": 0}}  # and max_completion_tokens, which would win, not sent (or null)
RULES = {
    "CompletionRequest": [
        # max_tokens 0 (unless max_completion_tokens wins) is a scoring request, which needs echo: true
        {
            "if": {"required": ["max_tokens"], "properties": {**_SCORING, "max_completion_tokens": {"type": "null"}}},
            "then": {"required": ["echo"], "properties": {"echo": {"const": True}}},
        },
        # a stream carries one prompt
        _when(
            {"stream": {"const": True}},
            then={
                "properties": {
                    "prompt": {
                        "anyOf": [
                            {"type": "string"},
                            {"type": "array", "items": {"type": "integer"}},
                            {"type": "array", "maxItems": 1},
                        ]
                    }
                }
            },
        ),
    ],
    "ChatCompletionRequest": [
        # top_logprobs of 1 or more needs logprobs: true
        _when(
            {"top_logprobs": {"type": "integer", "minimum": 1}},
            then={"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
        ),
        # a tool_choice other than "none" needs tools
        _when(
            {"tool_choice": {"not": {"enum": [None, "none"]}}},
            then={"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
        ),
    ],
    # a json_schema format carries its schema
    "ResponseFormat": [_when({"type": {"const": "json_schema"}}, then={"required": ["json_schema"]})],
    # content, unless the turn is an assistant's calls
    "ChatMessage": [
        _when(
            {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}},
            otherwise={"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
        )
    ],
}


def _copy_bounds(source: dict, documented: dict) -> None:
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in source:
            documented[key] = source[key]
    for a, b in zip(source.get("anyOf", []), documented.get("anyOf", []), strict=False):
        _copy_bounds(a, b)


def server_limits(doc: dict, cfg: ServeConfig, vocab_size: int) -> None:
    """State this server's own limits in the request schemas: the one model it serves, its max_tokens limit,
    token ids (in a prompt, in a list of prompts, in /detokenize), the number of prompts."""
    for param in doc["paths"].get("/v1/models/{model}", {}).get("get", {}).get("parameters", []):
        param["schema"]["enum"] = [cfg.model_id]  # any other id is a 404
    schemas = doc.get("components", {}).get("schemas", {})
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = schemas.get(name, {}).get("properties", {})
        for field, noops in NOT_SUPPORTED.items():
            if field in props:  # refused unless at a no-op value
                props[field] = {"enum": list(noops), "description": "not supported: only its no-op values"}
        if "model" in props:
            props["model"]["enum"] = [cfg.model_id]  # any other name is a 404
        for option in props.get("prompt", {}).get("anyOf", []):
            _prompt_limits(option, cfg.max_prompts, vocab_size)
        for field in ("max_tokens", "max_completion_tokens"):
            for option in props.get(field, {}).get("anyOf", []):
                if option.get("type") == "integer":
                    option["maximum"] = cfg.max_tokens_limit
    tokens = schemas.get("DetokenizeRequest", {}).get("properties", {}).get("tokens", {})
    if tokens.get("items", {}).get("type") == "integer":
        tokens["items"].update(minimum=0, maximum=vocab_size - 1)


def _prompt_limits(option: dict, max_prompts: int, vocab_size: int) -> None:
    """One member of `prompt`'s union: token ids lie in [0, vocab); a list of prompts holds at most max_prompts."""
    items = option.get("items", {})
    if items.get("type") == "integer":
        items.update(minimum=0, maximum=vocab_size - 1)
    if items.get("type") == "array" and items.get("items", {}).get("type") == "integer":
        items["items"].update(minimum=0, maximum=vocab_size - 1)
    if items.get("type") in ("string", "array"):  # a list of prompts: Intake.check refuses more than max_prompts
        option["maxItems"] = max_prompts
