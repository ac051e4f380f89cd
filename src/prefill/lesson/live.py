"""The lesson page's live routes, on the server's own model: tokens, attention weights, predictions, roofline.

GET /api/tokens, POST /api/attention, GET /api/predict, GET /api/roofline. The prompt itself is prefilled
through the OpenAI routes (the same scheduler as any client); these routes only look and predict. This
machine's GEMM rate and bandwidth are measured once per server, on the first request that needs them, never
on the calculator's slider path.
"""

from __future__ import annotations

import threading

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from prefill.costmodel import costs
from prefill.engine.llm import Engine
from prefill.errors import BadInput
from prefill.lesson.api import MAX_S, bad_input, bounds, finite, human, in_range, kv_body, roofline_body

MAX_TEXT = 20_000  # characters of a prompt the token route reads


class MachineRates:
    """This device's measured GEMM rate (engine dtype) and memory bandwidth, measured once, lazily."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._rates: tuple[float, float, str] | None = None

    def get(self) -> tuple[float, float, str]:
        """(peak FLOP/s, bandwidth bytes/s, where they come from)."""
        with self._lock:
            if self._rates is None:
                self._rates = self._measure()
            return self._rates

    def _measure(self) -> tuple[float, float, str]:
        from prefill.costmodel.hardware import HARDWARE, measure_copy_bandwidth

        gemm = self.engine.gemm_rate()
        if self.engine.device.type == "cuda":
            import torch

            name = torch.cuda.get_device_name(self.engine.device).lower()
            for key, hw in HARDWARE.items():
                if key.split("-")[0] in name:
                    return gemm, hw.bandwidth_bytes_per_s, f"GEMM measured on {name}; bandwidth: {hw.source}"
        return gemm, measure_copy_bandwidth(), "measured on this machine: square GEMM and array copy"


class AttentionBody(BaseModel):
    """Which prompt, layer and query head to show the attention weights of."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr = Field(min_length=1, max_length=MAX_TEXT)
    chat: StrictBool = False
    layer: StrictInt = 0
    head: StrictInt = 0


def live_router(engine: Engine) -> APIRouter:
    """The routes that need the loaded model."""
    from prefill.lesson.probe import MAX_P, attention_weights

    router = APIRouter(prefix="/api", tags=["lesson: live model"])
    rates = MachineRates(engine)
    spec = engine.spec
    context = spec.context_length
    dtype = str(engine.dtype).removeprefix("torch.")

    def encode(text: str, chat: bool) -> list[int]:
        if len(text) > MAX_TEXT:
            raise BadInput(f"text has {len(text):,} characters; at most {MAX_TEXT:,}")
        ids = engine.encode_prompt(text, chat=chat)
        if len(ids) >= spec.context_length:
            raise BadInput(f"the prompt has {len(ids)} tokens; this model's context length is {spec.context_length}")
        return ids

    def labels(ids: list[int]) -> list[str]:
        tok = engine.need_tokenizer()
        return [tok.decode([i], skip_special=False) for i in ids]

    @router.get("/tokens")
    def tokens(
        text: str = Query(
            ..., description="the prompt", min_length=1, max_length=MAX_TEXT, json_schema_extra={"pattern": r"\S"}
        ),
        chat: int = Query(0, description="1: apply the chat template", json_schema_extra=bounds(0, 1)),
    ) -> dict:
        """The prompt's tokens as the model sees them: ids and one label per token (tokenizer.decode of each id)."""
        in_range("chat", chat, 0, 1)
        ids = encode(text, bool(chat))
        return {"P": len(ids), "ids": ids, "labels": labels(ids), "chat": bool(chat), "max_attention_P": MAX_P,
                "kv": kv_body(spec, len(ids), dtype)}  # fmt: skip

    @router.post("/attention")
    def attention(body: AttentionBody) -> dict:
        """A = softmax(mask(Q K^T / sqrt(d_head))) of one layer and query head, for prompts up to MAX_P tokens.

        Computed by a separate pass (prefill.lesson.probe), not by the serving path."""
        ids = encode(body.text, body.chat)
        in_range("layer", body.layer, 0, spec.L - 1)
        in_range("head", body.head, 0, spec.H_q - 1)
        A = attention_weights(engine.model, ids, body.layer, body.head)  # [P, P]
        upper = A.triu(1)  # [P, P]: the masked future, exactly 0
        return {"P": len(ids), "layer": body.layer, "head": body.head, "labels": labels(ids),
                "kv_head": body.head // (spec.H_q // spec.H_kv), "weights": A.tolist(),
                "row_sums": A.sum(-1).tolist(), "upper_max": float(upper.abs().max())}  # fmt: skip

    @router.get("/predict")
    def predict(
        P: int = Query(..., description="prompt tokens", json_schema_extra=bounds(1, context)),
        cached: int = Query(
            0,
            description="prompt tokens whose K/V came from the prefix cache (not prefilled); fewer than P",
            json_schema_extra=bounds(0, context - 1),
        ),
        prefill_s: float | None = Query(
            None, description="a measured prefill, seconds: gives its MFU", json_schema_extra=bounds(0, MAX_S, True)
        ),
        tokenize_s: float = Query(
            0.0,
            description="measured tokenization, seconds: added to the predicted TTFT",
            json_schema_extra=bounds(0, MAX_S),
        ),
    ) -> dict:
        """Predicted prefill seconds of P tokens (`cached` of them already in the prefix cache) on this server (the
        engine's predict_prefill_seconds), exact FLOPs, and the MFU of a measured prefill against the measured
        GEMM rate."""
        in_range("P", P, 1, spec.context_length)
        in_range("cached", cached, 0, P - 1)
        in_range("tokenize_s", tokenize_s, 0, MAX_S)
        gemm, _, source = rates.get()
        with bad_input():
            seconds, how = engine.predict_prefill_seconds(P - cached, cached)
            ttft = costs.ttft_seconds(seconds, tokenize_s=tokenize_s)
            count = costs.prefill_flops_exact(spec, P - cached, cached)
            mfu = None
            if prefill_s is not None:
                mfu = costs.mfu(count.total, in_range("prefill_s", prefill_s, 0, MAX_S, lo_open=True), gemm)
        return finite({"P": P, "predicted_prefill_s": seconds, "predicted_ttft_s": ttft, "method": how,
                       "flops": count.total, "gemm_rate": gemm, "gemm_source": source, "mfu": mfu,
                       "human": {"predicted": human(seconds, "s"), "flops": human(count.total, "FLOP"),
                                 "gemm_rate": human(gemm, "FLOP/s")}})  # fmt: skip

    @router.get("/roofline")
    def roofline(P: int = Query(..., description="prompt tokens", json_schema_extra=bounds(1, context))) -> dict:
        """This prefill's and one decode step's arithmetic intensity against this machine's ridge point."""
        in_range("P", P, 1, spec.context_length)
        gemm, bandwidth, source = rates.get()
        with bad_input():
            body = roofline_body(spec, P, costs.dtype_bytes(dtype), gemm, bandwidth)
        return finite({**body, "source": source, "dtype": dtype})

    return router
