"""GET /health, GET /metrics, GET /v1/models and GET /v1/models/{model}: what a load balancer, Prometheus and an
OpenAI client ask before they send work."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from prefill.server.api_errors import ErrorResponse
from prefill.server.openapi import HealthBody
from prefill.server.state import ServerState, state_of

router = APIRouter()


@router.get("/health", responses={503: {"model": HealthBody}})
async def health(request: Request) -> JSONResponse:
    """200 while the worker serves; 503 with the reason when it is dead, stuck or shutting down. With the model,
    the dtype it runs in, its weights ("native": the GGUF's blocks), their activations and K/V dtype, and the KV
    pool's state."""
    state = state_of(request)
    reason = state.supervisor.problem()
    body = {
        "status": "error" if reason else "ok",
        "reason": reason,
        "model": state.cfg.model_id,
        "dtype": state.engine.dtype_name,  # what the time model needs to predict this server (loadtest --predict)
        "weights": "native" if state.engine.weight_types() else state.engine.dtype_name,
        "activations": state.engine.activations,
        "kv_dtype": state.engine.kv_dtype_name,
        "path": state.engine.path_label,
        **state.worker.pool_state(),
    }
    return JSONResponse(body, 503 if reason else 200)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics_route(request: Request) -> Response:
    state = state_of(request)
    state.worker.update_gauges()
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def card_of(state: ServerState) -> dict:
    """The one model this server serves, as OpenAI lists it (with vLLM's max_model_len), and the path it runs on
    (Engine.path_label)."""
    return {
        "id": state.cfg.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "prefill",
        "max_model_len": state.engine.spec.context_length,
        "path": state.engine.path_label,
    }


@router.get("/v1/models")
async def models(request: Request) -> dict:
    return {"object": "list", "data": [card_of(state_of(request))]}


@router.get("/v1/models/{model}", responses={404: {"model": ErrorResponse}})
async def model_card(request: Request, model: str) -> dict:
    state = state_of(request)
    state.check_model(model)
    return card_of(state)
