"""The OpenAPI document as the server really behaves: refusals are 400 (never FastAPI's 422) with OpenAI's error
body, 404 / 413 / 429 / 500 / 503 are listed, and streamed answers are `text/event-stream`."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from prefill.server.openai_schema import MAX_PROMPTS, NOT_SUPPORTED, ErrorResponse


class HealthBody(BaseModel):
    status: str  # "ok" or "error"
    reason: str | None  # why the server cannot serve (worker dead or stuck, shutting down)
    model: str


def _error(description: str) -> dict:
    return {"model": ErrorResponse, "description": description}


GENERATION_RESPONSES: dict = {
    200: {
        "description": "The answer: JSON, or with `stream: true` server-sent events ending in `data: [DONE]`",
        "content": {
            "text/event-stream": {
                "schema": {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}
            }
        },  # fmt: skip
    },
    400: _error("Invalid request, or an OpenAI field this server refuses (`param` names it)"),
    404: _error("Unknown model"),
    413: _error("Request body over the server's limit"),
    429: _error("The queue is full; retry later"),
    500: _error("Generation failed for this request (the server keeps serving)"),
    503: _error("The server is shutting down or cannot serve (see /health)"),
}


def document_errors(app: FastAPI, model_id: str, max_tokens_limit: int, vocab_size: int,
                    max_prompts: int = MAX_PROMPTS) -> None:  # fmt: skip
    """Replace FastAPI's 422 (this server answers 400) and its validation-error schemas in app.openapi(); state
    this server's own limits in the request schemas: the one model it serves, its max_tokens limit, token ids
    (in a prompt, in a list of prompts, in /detokenize), the number of prompts."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()
        for ops in doc.get("paths", {}).values():
            for op in ops.values():
                responses = op.get("responses", {})
                if responses.pop("422", None) is not None:
                    responses.setdefault("400", {"description": "Invalid request", "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})  # fmt: skip
        for param in doc["paths"].get("/v1/models/{model}", {}).get("get", {}).get("parameters", []):
            param["schema"]["enum"] = [model_id]  # any other id is a 404
        schemas = doc.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        for name in ("CompletionRequest", "ChatCompletionRequest"):
            props = schemas.get(name, {}).get("properties", {})
            for field, noops in NOT_SUPPORTED.items():
                if field in props:  # refused unless at a no-op value
                    props[field] = {"enum": list(noops), "description": "not supported: only its no-op values"}
            if "model" in props:
                props["model"]["enum"] = [model_id]  # any other name is a 404
            for option in props.get("prompt", {}).get("anyOf", []):
                items = option.get("items", {})
                if items.get("type") == "integer":
                    items.update(minimum=0, maximum=vocab_size - 1)
                if items.get("type") == "array" and items.get("items", {}).get("type") == "integer":
                    items["items"].update(minimum=0, maximum=vocab_size - 1)
                if "maxItems" in option and items.get("type") != "integer":  # a list of prompts
                    option["maxItems"] = max_prompts
            for field in ("max_tokens", "max_completion_tokens"):
                for option in props.get(field, {}).get("anyOf", []):
                    if option.get("type") == "integer":
                        option["maximum"] = max_tokens_limit
        tokens = schemas.get("DetokenizeRequest", {}).get("properties", {}).get("tokens", {})
        if tokens.get("items", {}).get("type") == "integer":
            tokens["items"].update(minimum=0, maximum=vocab_size - 1)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
