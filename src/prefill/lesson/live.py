"""The lesson page's live routes, on the server's own model: tokens, attention weights, predictions, roofline.

GET /api/tokens, POST /api/attention, GET /api/predict, GET /api/roofline. The prompt itself is prefilled
through the OpenAI routes (the same worker as any client); these routes only look and predict. The attention
probe's forwards and the measurement of this machine's GEMM rate and bandwidth (once per server, on the first
request that needs them, never on the calculator's slider path) run on the server's worker thread.
"""

from __future__ import annotations

import asyncio
from functools import partial

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from prefill.costmodel import costs
from prefill.costmodel.estimate import Setting, build_estimate
from prefill.engine.llm import Engine
from prefill.errors import BadInput
from prefill.lesson.api import MAX_N_OUT, MAX_S, bad_input, bounds, finite, human, in_range, kv_body, roofline_body
from prefill.lesson.probe import MAX_P, attention_map
from prefill.lesson.regime import regime_words
from prefill.lesson.state import lesson_of

MAX_TEXT = 20_000  # characters of a prompt the token route reads
# Token counts bounded by the model's context length: their `maximum` is written into the OpenAPI document
# once the model is known (document_context), as context + this offset.
CONTEXT_BOUNDED = {("/api/predict", "P"): 0, ("/api/predict", "cached"): -1, ("/api/roofline", "P"): 0}
router = APIRouter(prefix="/api", tags=["lesson: live model"])
COLD = (
    " This one was cold: a forward of a length the server's worker had not run before builds its kernels and"
    " touches its memory first, so it is no warm figure; run the prompt again."
)


class AttentionBody(BaseModel):
    """Which prompt, layer and query head to show the attention weights of."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr = Field(min_length=1, max_length=MAX_TEXT)
    chat: StrictBool = False
    layer: StrictInt = 0
    head: StrictInt = 0


def encode(engine: Engine, text: str, chat: bool) -> list[int]:
    """The prompt's token ids; BadInput when it is too long to read or to fit the context."""
    if len(text) > MAX_TEXT:
        raise BadInput(f"text has {len(text):,} characters; at most {MAX_TEXT:,}")
    ids = engine.encode_prompt(text, chat=chat)
    context = engine.spec.context_length
    if len(ids) >= context:
        raise BadInput(f"the prompt has {len(ids)} tokens; this model's context length is {context}")
    return ids


def labels(engine: Engine, ids: list[int]) -> list[str]:
    tok = engine.need_tokenizer()
    return [tok.decode([i], skip_special=False) for i in ids]


@router.get("/tokens")
def tokens(
    request: Request,
    text: str = Query(
        ..., description="the prompt", min_length=1, max_length=MAX_TEXT, json_schema_extra={"pattern": r"\S"}
    ),
    chat: int = Query(0, description="1: apply the chat template", json_schema_extra=bounds(0, 1)),
) -> dict:
    """The prompt's tokens as the model sees them: ids and one label per token (tokenizer.decode of each id)."""
    in_range("chat", chat, 0, 1)
    lesson = lesson_of(request)
    ids = encode(lesson.engine, text, bool(chat))
    return {
        "P": len(ids),
        "ids": ids,
        "labels": labels(lesson.engine, ids),
        "chat": bool(chat),
        "max_attention_P": MAX_P,
        "kv": kv_body(lesson.spec, len(ids), lesson.dtype),
    }


@router.post("/attention")
async def attention(request: Request, body: AttentionBody) -> dict:
    """A = softmax(mask(Q K^T / sqrt(d_head))) of one layer and query head, for prompts up to MAX_P tokens.

    Computed by a separate pass (prefill.lesson.probe), not by the serving path."""
    lesson = lesson_of(request)
    engine, spec = lesson.engine, lesson.spec
    ids = await asyncio.to_thread(encode, engine, body.text, body.chat)
    in_range("layer", body.layer, 0, spec.L - 1)
    in_range("head", body.head, 0, spec.H_q - 1)
    A = await lesson.run(partial(attention_map, engine.model, ids, body.layer, body.head))  # [P][P], no tensors
    return {
        "P": len(ids),
        "layer": body.layer,
        "head": body.head,
        "labels": labels(engine, ids),
        "kv_head": body.head // (spec.H_q // spec.H_kv),
        "weights": A.weights,
        "row_sums": A.row_sums,
        "upper_max": A.upper_max,
    }


@router.get("/predict")
async def predict(
    request: Request,
    P: int = Query(..., description="prompt tokens", json_schema_extra={"minimum": 1}),
    cached: int = Query(
        0,
        description="prompt tokens whose K/V came from the prefix cache (not prefilled); fewer than P",
        json_schema_extra={"minimum": 0},
    ),
    prefill_s: float | None = Query(
        None,
        description="a measured prefill, seconds: gives its MFU, the prediction's error and what set its time",
        json_schema_extra=bounds(0, MAX_S, True),
    ),
    tokenize_s: float = Query(
        0.0,
        description="measured tokenization, seconds: added to the predicted TTFT",
        json_schema_extra=bounds(0, MAX_S),
    ),
    n: int = Query(
        1,
        description="answer tokens the request wrote: gives the predicted ITL",
        json_schema_extra=bounds(1, MAX_N_OUT),
    ),
    itl_s: float | None = Query(
        None,
        description="the measured ITL (median), seconds: gives its error",
        json_schema_extra=bounds(0, MAX_S, True),
    ),
    cold: bool = Query(False, description="the server's timings said the measured prefill was cold"),
) -> dict:
    """Predicted prefill seconds of P tokens (`cached` of them already in the prefix cache) on this server, in its
    prefill chunks (the engine's time model), exact FLOPs, and beside a measured prefill its MFU against the
    measured GEMM rate, the error (predicted / measured - 1) and what set its time in words; the predicted ITL of
    n answer tokens."""
    lesson = lesson_of(request)
    in_range("P", P, 1, lesson.spec.context_length)
    in_range("cached", cached, 0, P - 1)
    in_range("tokenize_s", tokenize_s, 0, MAX_S)
    in_range("n", n, 1, MAX_N_OUT)
    gemm, _, source = await lesson.rates.get()
    profile = await lesson.profile()
    body: dict = {"P": P, "cached": cached, "computed": P - cached}
    with bad_input():
        pred = lesson.engine.predict_prefill(P - cached, cached, lesson.chunk_size, profile=profile)
        words = prefill_words(P, cached, pred.steps, lesson.chunk_size)
        count = costs.prefill_flops_exact(lesson.spec, P - cached, cached)
        itl = lesson.engine.predict_itl_seconds(P, n)
        body |= {
            "predicted_prefill_s": pred.seconds,
            "predicted_ttft_s": costs.ttft_seconds(pred.seconds, tokenize_s=tokenize_s),
            "predicted_itl_s": itl,
            "method": lesson.engine.method_of(pred),
            "prefill": words,
            "forwards": pred.steps,
            "dominant": pred.dominant,
            "flops": count.total,
            "gemm_rate": gemm,
            "gemm_source": source,
            "mfu": None,
        }
        human_body = {
            "predicted": human(pred.seconds, "s"),
            "flops": human(count.total, "FLOP"),
            "gemm_rate": human(gemm, "FLOP/s"),
        }
        if itl is not None:
            human_body["predicted_itl"] = human(itl, "s")
        if prefill_s is not None:
            measured = in_range("prefill_s", prefill_s, 0, MAX_S, lo_open=True)
            error = pred.seconds / measured - 1
            body |= {
                "mfu": costs.mfu(count.total, measured, gemm),
                "error": error,
                "note": f"{words}: {regime_words(pred, measured, lesson.dtype, profile)}." + (COLD if cold else ""),
                "cold": cold,
            }
            human_body["error"] = f"{error:+.0%}, cold" if cold else f"{error:+.0%}"
        if itl is not None and itl_s is not None:
            body["itl_error"] = itl / in_range("itl_s", itl_s, 0, MAX_S, lo_open=True) - 1
            human_body["itl_error"] = f"{body['itl_error']:+.0%}"
    return finite({**body, "human": human_body})


def prefill_words(P: int, cached: int, forwards: int, chunk_size: int | None) -> str:
    """What the server prefilled: '3 tokens, one pass', '16 tokens computed; 288 came from the prefix cache, one
    pass', '305 tokens, in 2 chunks of at most 256'."""
    what = f"{P - cached:,} tokens computed; {cached:,} came from the prefix cache" if cached else f"{P:,} tokens"
    return f"{what}, in {forwards} chunks of at most {chunk_size:,}" if forwards > 1 else f"{what}, one pass"


@router.get("/roofline")
async def roofline(
    request: Request, P: int = Query(..., description="prompt tokens", json_schema_extra={"minimum": 1})
) -> dict:
    """This prefill's and one decode step's arithmetic intensity against this machine's ridge point."""
    lesson = lesson_of(request)
    in_range("P", P, 1, lesson.spec.context_length)
    gemm, bandwidth, source = await lesson.rates.get()
    with bad_input():
        machine = {"peak_flops_per_s": gemm, "mfu": 1.0, "bandwidth_bytes_per_s": bandwidth}
        est = build_estimate(Setting(P=P, spec=lesson.spec, dtype=lesson.dtype, **machine))
        body = roofline_body(est.roofline, gemm)
    return finite({**body, "source": source, "dtype": lesson.dtype})


def document_context(doc: dict, context: int) -> None:
    """Write this model's context length into the OpenAPI document as the bound of the routes' token counts (the
    routes are defined before any model is loaded)."""
    for (path, name), offset in CONTEXT_BOUNDED.items():
        for param in doc["paths"][path]["get"]["parameters"]:
            if param["name"] == name:
                param["schema"]["maximum"] = context + offset
