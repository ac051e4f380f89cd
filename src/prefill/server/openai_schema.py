"""The OpenAI wire format: request models (validated strictly), response and chunk bodies, error bodies.

Every field of OpenAI's two endpoints is either honoured or refused with a 400 that names it: the fields we
model are honoured; the OpenAI fields in NOT_SUPPORTED are accepted only at their no-op values; any other field
is a 400 (`extra="forbid"`), so a client never gets a silent default. Types are strict (a string where an
integer belongs is a 400, not a silent conversion) as JSON Schema has them: an integer is a number, and a
number with no fraction (1.0) is an integer. Text must be valid Unicode: a lone UTF-16 surrogate (JSON
"\\ud800") is a 400 naming the field, never replaced.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

from prefill.engine.sampling import LOGIT_BIAS_MAX, SEED_MAX, SEED_MIN
from prefill.server.logprobs import MAX_TOP_LOGPROBS

# OpenAI fields this server does not implement, each with its no-op test: a request that sets one to anything
# else is refused with a 400 naming it. Implementing a field = modelling it above and deleting it here.
NOT_SUPPORTED: dict[str, tuple] = {
    "best_of": (None, 1),
    "suffix": (None, ""),
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "functions": (None,),
    "function_call": (None,),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "reasoning_effort": (None,),
}
# OpenAI fields that carry no instruction for the model (identifiers, storage, billing): accepted, not used.
IGNORED = ("user", "store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier", "verbosity")


def _valid_unicode(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"contains a lone UTF-16 surrogate at character {e.start}; send valid Unicode") from None
    return s


def _whole(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


Text = Annotated[StrictStr, AfterValidator(_valid_unicode)]
Int = Annotated[StrictInt, BeforeValidator(_whole)]  # JSON Schema's integer: 2 and 2.0 alike


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class JsonSchemaFormat(_Body):
    name: StrictStr = Field(max_length=64)
    description: StrictStr | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Body):
    """{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDef(_Body):
    name: StrictStr = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: StrictStr


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class _Sampling(_Body):
    model: StrictStr
    max_tokens: Int | None = Field(default=None, ge=0, description="0 only with echo: a scoring request")
    max_completion_tokens: Int | None = Field(default=None, ge=1)
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0, description="below 1e-5: greedy, as in vLLM")
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0)
    top_k: Int = Field(default=0, ge=0, description="vLLM's extension; 0 = no cut")
    ignore_eos: StrictBool = Field(default=False, description="vLLM's extension, for benchmarks: run to max_tokens")
    stop: Text | list[Text] | None = Field(default=None, max_length=16)
    seed: Int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX, description="what torch.Generator takes")
    n: Int = Field(default=1, ge=1, le=1, description="only 1 (1.0 is the same number)")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logit_bias: (
        dict[
            Annotated[str, Field(pattern=r"^[0-9]{1,9}$")],
            Annotated[StrictFloat, Field(ge=-LOGIT_BIAS_MAX, le=LOGIT_BIAS_MAX)],
        ]
        | None
    ) = Field(default=None, max_length=300)
    # Accepted and not used (see IGNORED); typed loosely so any value passes.
    user: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    verbosity: Any = None
    # Refused unless at their no-op value (see NOT_SUPPORTED).
    frequency_penalty: Any = None
    presence_penalty: Any = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in stops if s)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    def refused_field(self) -> str | None:
        """The first OpenAI field set to something this server does not implement, or None."""
        for name, noops in NOT_SUPPORTED.items():
            value = getattr(self, name, None)
            # False == 0 in Python; a bool is a no-op only where a bool is listed
            if name in self.model_fields_set and not any(
                value == v and isinstance(value, bool) == isinstance(v, bool) for v in noops
            ):
                return name
        return None

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items())


MAX_PROMPTS = 64  # prompts in one /v1/completions request (one choice each); ServeConfig.max_prompts may lower it
_Prompt = Annotated[Text, Field(min_length=1)]
_Ids = Annotated[list[Int], Field(min_length=1)]


class CompletionRequest(_Sampling):
    """POST /v1/completions: a prompt as text or token ids, or a list of them (one choice each); never empty."""

    prompt: (
        _Prompt
        | _Ids
        | Annotated[list[_Prompt], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[list[_Ids], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    echo: StrictBool = Field(default=False, description="the prompt before the answer (with logprobs: scored)")
    logprobs: Int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="log-probabilities of the tokens and of the k most likely at each position",
    )
    best_of: Any = None
    suffix: Any = None


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. "name": no instruction for the model
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: StrictBool | None = False
    top_logprobs: Int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, description="needs logprobs: true")
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(default=None, max_length=64)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None  # at most one call either way, which both values allow
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None


class ApiError(Exception):
    """A refusal with an HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error body, the body of every 4xx and 5xx."""

    error: ErrorDetail


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage_body(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class ResponseShape:
    """Builds the bodies of one response, completions or chat, full or streamed."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict], **extra: Any) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices, **extra}

    def choice(
        self,
        text: str,
        finish_reason: str,
        logprobs: dict | None = None,
        index: int = 0,
        tool_calls: list | None = None,
    ) -> dict:
        """One choice of a full response; `logprobs` as prefill.server.logprobs builds it, or None."""
        if self.chat:
            message = {"role": "assistant", "content": None if tool_calls else text}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def full_choices(self, choices: list[dict], usage: dict, timings: dict | list[dict]) -> dict:
        obj = "chat.completion" if self.chat else "text_completion"
        return self._envelope(obj, choices, usage=usage, timings=timings)

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        *,
        role: bool = False,
        tool_calls: list | None = None,
        logprobs: dict | None = None,
        **extra,
    ) -> dict:
        if self.chat:
            delta: dict = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(tool_calls)]
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice], **extra)
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice], **extra)

    def usage_chunk(self, usage: dict, timings: dict) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._envelope(obj, [], usage=usage, timings=timings)
