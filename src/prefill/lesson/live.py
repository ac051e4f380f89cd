"""The lesson page's live routes, on the server's own model: tokens, attention weights, predictions and verdicts.

GET /api/tokens, POST /api/attention, GET /api/predict. The prompt itself is prefilled
through the OpenAI routes (the same worker as any client); these routes only look and predict. The attention
probe's forwards and the measurement of this machine's GEMM rate and bandwidth (once per server, on the first
request that needs them, never on the calculator's slider path) run on the server's worker thread.
"""

from __future__ import annotations

import asyncio
import statistics
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from prefill.costmodel import costs
from prefill.costmodel.specs import ModelSpec
from prefill.costmodel.timemodel import prefill_steps
from prefill.engine.llm import Engine
from prefill.errors import BadInput
from prefill.lesson.api import bad_input, finite, kv_body
from prefill.lesson.limits import RANGES, bounds, check_all, in_range, limits
from prefill.lesson.probe import MAX_P, attention_map
from prefill.lesson.regime import regime_words, slow_words
from prefill.lesson.state import LessonState, lesson_of
from prefill.lesson.verdict import compute_bound_from_P, verdict_body, weights_words
from prefill.lesson.words import human, plural
from prefill.server.openai_schema import int_in

MAX_TEXT = 20_000  # characters of a prompt the token route reads
# Token counts bounded by the model's context length: their `maximum` is written into the OpenAPI document
# once the model is known (document_model), as context + this offset.
CONTEXT_BOUNDED = {
    ("/api/predict", "P"): 0,
    ("/api/predict", "cached"): -1,
    ("/api/compute-or-load/at", "P"): 0,
    ("/api/gemm", "P"): 0,
}
# The attention body's fields bounded by the model's shape (the last layer, the last query head), written there too.
# /api/predict's measured and guessed numbers, each with its entry of RANGES (the document's and the check's).
PREDICT_RANGES = {
    "prefill_s": "prefill_s",
    "tokenize_s": "seconds",
    "n": "n",
    "ttft_s": "ttft",
    "guess_ttft_s": "guess_s",
    "guess_kv": "guess_bytes",
}
SHAPE_BOUNDED = {"layer": lambda spec: spec.L - 1, "head": lambda spec: spec.H_q - 1}
router = APIRouter(prefix="/api", tags=["lesson: live model"])
COLD = (
    " This one was cold: a forward of a length the server's worker had not run before builds its kernels and"
    " touches its memory first, so it is no warm figure. Run the prompt again with the prefix cache unchecked: the"
    " same tokens are then computed again, warm (with the cache on, only the uncached rest is computed, a new"
    " length, which is cold again)."
)


class AttentionBody(BaseModel):
    """Which prompt, layer and query head to show the attention weights of (of the prompt's first MAX_P tokens)."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr = Field(min_length=1, max_length=MAX_TEXT)
    chat: StrictBool = False
    layer: int_in(ge=0) = Field(0, description="0 to L - 1 (an integer-valued number, 3.0, is one)")
    head: int_in(ge=0) = Field(0, description="a query head, 0 to H_q - 1")
    answer: StrictStr = Field("", max_length=MAX_TEXT, description="the text generated after the prompt")
    answer_tokens: int_in(ge=0, le=MAX_P) = Field(
        0, description="how many of the answer's tokens to append: the inputs of that many decode steps"
    )


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
    chunk = lesson.chunk_size
    return {
        "P": len(ids),
        "ids": ids,
        "labels": labels(lesson.engine, ids),
        "chat": bool(chat),
        "max_attention_P": MAX_P,
        "kv": kv_body(lesson.spec, len(ids), lesson.kv_dtype),
        "prefill": prefill_words(len(ids), 0, len(list(prefill_steps(len(ids), chunk_size=chunk))), chunk),
        "chunk_size": lesson.chunk_size,
        "template": template_body(lesson.engine, text, len(ids)) if chat else None,
    }


def template_body(engine: Engine, text: str, P: int) -> dict | None:
    """What the chat template wraps around the prompt's text: its own text before and after it, its tokens
    (P less the text's own), and whether it adds a system turn the student did not write (SmolLM2's does);
    None where the tokenizer has no template (the prompt is sent raw)."""
    tok = engine.need_tokenizer()
    if not tok.chat_template:
        return None
    rendered = tok.render_chat([{"role": "user", "content": text}])
    at = rendered.find(text)
    before, after = rendered[: max(at, 0)], rendered[at + len(text) :] if at >= 0 else ""
    return {"before": before, "after": after, "tokens": P - len(tok.encode(text)), "system": "system" in before}


@router.post("/attention")
async def attention(request: Request, body: AttentionBody) -> dict:
    """A = softmax(mask(Q K^T / sqrt(d_head))) of one layer and query head, over the prompt's first MAX_P tokens
    (`P` of its `prompt_P`: a longer prompt's map is cut there, as a prefix of the prompt is its own prompt).
    With `answer_tokens`, that many tokens of `answer` (tokenized on their own) follow the prompt: their rows are
    what the decode steps feeding them compute, one row a step (causal: a row reads nothing after it).

    Computed by a separate pass (prefill.lesson.probe), not by the serving path."""
    lesson = lesson_of(request)
    engine, spec = lesson.engine, lesson.spec
    for name, last in SHAPE_BOUNDED.items():
        in_range(name, getattr(body, name), 0, last(spec))
    every = await asyncio.to_thread(engine.encode_prompt, body.text, chat=body.chat)
    fed = await asyncio.to_thread(engine.need_tokenizer().encode, body.answer) if body.answer_tokens else []
    ids = (every + fed[: body.answer_tokens])[: min(MAX_P, spec.context_length)]
    A = await lesson.run(partial(attention_map, engine.model, ids, body.layer, body.head))  # [P][P], no tensors
    return {
        "P": len(ids),
        "prompt_P": len(every),
        "prefill_rows": min(len(every), len(ids)),  # rows of prompt tokens; the rest are decode steps' rows
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
        description="prompt tokens whose K/V came from the prefix cache (not prefilled); at most P - 1 are counted "
        "(the last prompt token is always computed: more is read as P - 1, and `cached` says the count used)",
        json_schema_extra={"minimum": 0},
    ),
    prefill_s: float | None = Query(
        None,
        description="a measured prefill, seconds: gives its MFU, the prediction's error and what set its time",
        json_schema_extra=limits("prefill_s"),
    ),
    tokenize_s: float = Query(
        0.0,
        description="measured tokenization, seconds: added to the predicted TTFT",
        json_schema_extra=limits("seconds"),
    ),
    n: int = Query(
        1, description="answer tokens the request wrote: gives the predicted ITL", json_schema_extra=limits("n")
    ),
    itl: list[Annotated[float, Field(json_schema_extra=limits("seconds"))]] | None = Query(
        None, description="the measured inter-token gaps, seconds: their median and mean, and the ITL's error"
    ),
    ttft_s: float | None = Query(
        None, description="measured TTFT, seconds: gives TTFT + (n - 1) · mean ITL", json_schema_extra=limits("ttft")
    ),
    cold: bool = Query(False, description="the server's timings said the measured prefill was cold"),
    guess_ttft_s: float | None = Query(
        None, description="the student's guess of the TTFT, seconds", json_schema_extra=limits("guess_s")
    ),
    guess_kv: float | None = Query(
        None, description="the student's guess of the KV bytes after prefill", json_schema_extra=limits("guess_bytes")
    ),
) -> dict:
    """Predicted prefill seconds of P tokens (`cached` of them already in the prefix cache) on this server, in its
    prefill chunks (the engine's time model), exact FLOPs, the page's one verdict on it (prefill.lesson.verdict:
    bound, FLOP/B against the ridge, weights) and on one decode step; beside a measured prefill its MFU against
    the measured GEMM rate, the error (predicted / measured - 1: negative, it ran slower than predicted) and what
    set its time in words; the predicted ITL of n answer tokens beside the measured gaps' median."""
    lesson = lesson_of(request)
    values = dict(tokenize_s=tokenize_s, n=n, prefill_s=prefill_s, ttft_s=ttft_s, guess_ttft_s=guess_ttft_s)
    cached = checked_cached(lesson, P, cached, values | {"guess_kv": guess_kv})
    gemm, _, source = await lesson.rates.get()
    profile = await lesson.profile()
    body: dict = {"P": P, "cached": cached, "computed": P - cached}
    with bad_input():
        pred, words = lesson.engine.predict_prefill(P - cached, cached, lesson.chunk_size, profile=profile), {}
        body |= prediction_body(lesson, pred, profile, P, cached, tokenize_s, n, prefill_s, words)
        body |= {"gemm_rate": gemm, "gemm_source": source}
        words["gemm_rate"] = human(gemm, "FLOP/s")
        if prefill_s is not None:
            body |= measured_body(lesson, pred, profile, prefill_s, body["flops"], gemm, cold, body["prefill"], words)
        body |= itl_body(itl, body["predicted_itl_s"], ttft_s, n, words)
        if prefill_s is not None:  # a slow prefill says why, with the ITL's error beside it
            body["note"] += slow_words(body["error"], cold, P - cached, body.get("itl_error"))
        body["guesses"] = guesses_of(lesson, P, guess_ttft_s, ttft_s, guess_kv)
    return finite({**body, "human": words})


def guesses_of(lesson: LessonState, P: int, guess_ttft_s, ttft_s, guess_kv) -> list:
    """The student's guesses beside what was measured (the TTFT) and computed (the KV bytes after prefill)."""
    kv_after = kv_body(lesson.spec, P, lesson.kv_dtype)["bytes"]
    return guesses_body({"TTFT": (guess_ttft_s, ttft_s, "s"), "KV after prefill": (guess_kv, kv_after, "B")})


def checked_cached(lesson: LessonState, P: int, cached: int, values: dict[str, float | None]) -> int:
    """/api/predict's P and cached against the context, its other numbers against RANGES (BadInput if out); the
    cached count used: at most P - 1, as the last prompt token is always computed."""
    in_range("P", P, 1, lesson.spec.context_length)
    in_range("cached", cached, 0, lesson.spec.context_length - 1)
    check_all(values, PREDICT_RANGES)
    return min(cached, P - 1)


def prediction_body(
    lesson: LessonState, pred, profile, P: int, cached: int, tokenize_s: float, n: int, measured, words: dict
) -> dict:
    """The prediction of the prefill the server runs (`pred`: P - cached tokens after `cached`, in its chunks):
    seconds, TTFT, ITL, FLOPs, each chunk's seconds, and the page's one verdict on it and on a decode step; its
    words added to `words`."""
    engine = lesson.engine
    count = costs.prefill_flops_exact(lesson.spec, P - cached, cached)
    predicted_itl = engine.predict_itl_seconds(P, n)
    turn = compute_bound_from_P(engine, profile, lesson.chunk_size)
    words |= {"predicted": human(pred.seconds, "s"), "flops": human(count.total, "FLOP")}
    if predicted_itl is not None:
        words["predicted_itl"] = human(predicted_itl, "s")
    return {
        "predicted_prefill_s": pred.seconds,
        "predicted_ttft_s": costs.ttft_seconds(pred.seconds, tokenize_s=tokenize_s),
        "predicted_itl_s": predicted_itl,
        "method": engine.method_of(pred),
        "prefill": prefill_words(P, cached, pred.steps, lesson.chunk_size),
        "forwards": pred.steps,
        "chunk_size": lesson.chunk_size,
        "dominant": pred.dominant,
        "flops": count.total,
        "mfu": None,
        "chunks": chunk_predictions(engine, P, cached, lesson.chunk_size, profile),
        "verdict": verdict_body(engine, pred, profile, turn, measured),
        "decode": verdict_body(engine, engine.predict_decode([P], profile=profile), profile, turn),
    }


def measured_body(
    lesson: LessonState, pred, profile, measured: float, flops: float, gemm: float, cold: bool, what: str, words: dict
) -> dict:
    """Beside a measured prefill (seconds): its MFU against the GEMM rate, the prediction's error (predicted /
    measured - 1: negative, it ran slower than predicted) and what set its time, in words (added to `words`)."""
    error = pred.seconds / measured - 1
    weights = weights_words(lesson.engine, pred)
    words["error"] = f"{error:+.0%}, cold" if cold else f"{error:+.0%}"
    return {
        "mfu": costs.mfu(flops, measured, gemm),
        "error": error,
        "note": f"{what}: {regime_words(pred, measured, weights, profile)}." + (COLD if cold else ""),
        "cold": cold,
    }


def guesses_body(pairs: dict[str, tuple[float | None, float | None, str]]) -> list[dict]:
    """Each guess beside what was measured (or, for KV bytes, counted): its error, guess / actual - 1 (negative:
    the guess was too low), in words."""
    out = []
    for what, (guess, actual, unit) in pairs.items():
        if guess is None or not actual:
            continue
        error = guess / actual - 1
        words = f"your guess {human(guess, unit)} beside {human(actual, unit)}: {error:+.0%}"
        out.append({"what": what, "guess": guess, "actual": actual, "error": error, "words": words})
    return out


def chunk_predictions(engine, P: int, cached: int, chunk_size: int | None, profile) -> list[dict]:
    """The prefill's forwards one by one, as the server runs them (timemodel.prefill_steps): each chunk's first and
    last token and its predicted seconds (the chunk against the cache the chunks before it wrote)."""
    out = []
    for rows in prefill_steps(P - cached, cached, chunk_size=chunk_size):
        n, past = rows[0].new, rows[0].past
        seconds = engine.predict_prefill(n, past, profile=profile).seconds
        out.append({"first": past, "last": past + n - 1, "predicted_s": seconds})
    return out


def itl_body(gaps: list[float] | None, predicted: float | None, ttft_s: float | None, n: int, words: dict) -> dict:
    """The measured gaps' median and mean (seconds), the predicted ITL's error against the median, and the request
    time TTFT + (n - 1) · mean ITL; their words added to `words`."""
    if not gaps:
        return {"itl_p50_s": None, "itl_mean_s": None}
    for g in gaps:
        RANGES["seconds"].check("itl", g)
    p50, mean = statistics.median(gaps), statistics.fmean(gaps)
    out: dict = {"itl_p50_s": p50, "itl_mean_s": mean}
    words |= {"itl_p50": human(p50, "s"), "itl_mean": human(mean, "s")}
    if predicted is not None and p50 >= RANGES["itl"].lo:  # a gap under a microsecond is no ITL to compare
        out["itl_error"] = predicted / p50 - 1
        words["itl_error"] = f"{out['itl_error']:+.0%}"
    if ttft_s is not None:
        out["request_model_s"] = costs.request_seconds(ttft_s, n, mean)  # gaps of 0 s have no decode rate
        words["request_model"] = human(out["request_model_s"], "s")
    return out


def prefill_words(P: int, cached: int, forwards: int, chunk_size: int | None) -> str:
    """What the server prefilled: '3 tokens, one pass', '16 tokens computed; 288 came from the prefix cache, one
    pass', '305 tokens, in 2 chunks of at most 256'."""
    what = plural(P, "token")
    if cached:
        what = f"{plural(P - cached, 'token')} computed; {cached:,} came from the prefix cache"
    return f"{what}, in {forwards} chunks of at most {chunk_size:,}" if forwards > 1 else f"{what}, one pass"


def document_model(doc: dict, spec: ModelSpec) -> None:
    """Write this model's bounds into the OpenAPI document (the routes are defined before any model is loaded):
    its context length as the bound of the routes' token counts, its layers and query heads as the attention
    body's."""
    for (path, name), offset in CONTEXT_BOUNDED.items():
        for param in doc["paths"][path]["get"]["parameters"]:
            if param["name"] == name:
                param["schema"]["maximum"] = spec.context_length + offset
    fields = doc["components"]["schemas"][AttentionBody.__name__]["properties"]
    for name, last in SHAPE_BOUNDED.items():
        fields[name]["maximum"] = last(spec)
