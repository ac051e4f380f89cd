"""The OpenAI wire format: request models (validated strictly), response and chunk bodies, error bodies.

Every field of OpenAI's two endpoints is either honoured or refused with a 400 that names it: the fields we
model are honoured; the OpenAI fields in NOT_SUPPORTED are accepted only at their no-op values; any other field
is a 400 (`extra="forbid"`), so a client never gets a silent default. Types are strict (a string where an
integer belongs is a 400, not a silent conversion) as JSON Schema has them: an integer is a number, and a
number with no fraction (1.0) is an integer. Text must be valid Unicode: a lone UTF-16 surrogate (JSON
"\\ud800") is a 400 naming the field, never replaced.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

from prefill.engine.request import Generation
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


def _valid_unicode(s: Any) -> Any:
    if not isinstance(s, str):
        return s  # StrictStr refuses it next
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"contains a lone UTF-16 surrogate at character {e.start}; send valid Unicode") from None
    return s


def _whole(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):  # before the bounds, which NaN fails with a misleading message
        raise ValueError("must be a finite number")
    return v


def text_of(min_length: int | None = None, max_length: int | None = None) -> Any:
    """Valid Unicode text of a bounded length. The surrogate check runs first (pydantic's own length check cannot
    read a lone surrogate), and the bounds sit on the string itself, so the document states them as minLength /
    maxLength and the messages speak of characters."""
    return Annotated[StrictStr, Field(min_length=min_length, max_length=max_length), BeforeValidator(_valid_unicode)]


Text = text_of()
Int = Annotated[StrictInt, BeforeValidator(_whole)]  # JSON Schema's integer: 2 and 2.0 alike


def int_in(ge: int | None = None, le: int | None = None) -> Any:
    """An integer within [ge, le]. The bounds sit on the integer itself, ahead of the validator that reads 2.0 as 2,
    so the OpenAPI document states them as JSON Schema's minimum / maximum (after a validator pydantic would write
    its own `ge` / `le` keys, which JSON Schema does not know) and validation checks exactly those."""
    return Annotated[StrictInt, Field(ge=ge, le=le), BeforeValidator(_whole)]


def float_in(ge: float | None = None, le: float | None = None, gt: float | None = None) -> Any:
    """A finite number within the bounds (minimum / maximum / exclusiveMinimum in the document); NaN and infinity
    are refused as "must be a finite number"."""
    return Annotated[StrictFloat, Field(ge=ge, le=le, gt=gt), BeforeValidator(_finite)]


MAX_STOPS, MAX_STOP_CHARS = 16, 1024  # stop strings in one request (OpenAI allows 4, vLLM any), characters in one
MAX_SALT_CHARS = 256  # a cache salt (vLLM suggests 43: 256 random bits in base64)
Stop = text_of(max_length=MAX_STOP_CHARS)


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
    max_tokens: int_in(ge=0) | None = Field(default=None, description="0 only with echo: a scoring request")
    max_completion_tokens: int_in(ge=1) | None = Field(default=None, description="wins over max_tokens")
    temperature: float_in(ge=0.0, le=2.0) = Field(default=1.0, description="below 1e-5: greedy, as in vLLM")
    top_p: float_in(gt=0.0, le=1.0) = 1.0
    top_k: int_in(ge=0) = Field(default=0, description="vLLM's extension; 0 = no cut")
    ignore_eos: StrictBool = Field(default=False, description="vLLM's extension, for benchmarks: run to max_tokens")
    cache_salt: Annotated[StrictStr, Field(min_length=1, max_length=MAX_SALT_CHARS)] | None = Field(
        default=None,
        description="vLLM's extension: cached prefixes are shared only among requests with the same salt (a new "
        "salt: no prefix-cache hit); a salted request skips the KV store",
    )
    # the item cap is on the list alone: a single string is capped by its characters (MAX_STOP_CHARS)
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOPS)] | None = None
    seed: int_in(ge=SEED_MIN, le=SEED_MAX) | None = Field(default=None, description="what torch.Generator takes")
    n: int_in(ge=1, le=1) = Field(default=1, description="only 1 (1.0 is the same number)")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logit_bias: (
        dict[
            Annotated[str, Field(pattern=r"^[0-9]{1,9}$")],
            float_in(ge=-LOGIT_BIAS_MAX, le=LOGIT_BIAS_MAX),
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
        """max_completion_tokens when sent (it wins, as in OpenAI and vLLM), else max_tokens, else None."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

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
_Prompt = text_of(min_length=1)
_Ids = Annotated[list[Int], Field(min_length=1)]


class CompletionRequest(_Sampling):
    """POST /v1/completions: a prompt as text or token ids, or a list of them (one choice each); never empty."""

    prompt: (
        _Prompt | _Ids | Annotated[list[_Prompt], Field(min_length=1)] | Annotated[list[_Ids], Field(min_length=1)]
    )  # at most ServeConfig.max_prompts of them: Intake.check says so by name (a cap here would fail every member
    # of the union and report the first, "should be a valid string"); the document states it (openapi.server_limits)
    echo: StrictBool = Field(default=False, description="the prompt before the answer (with logprobs: scored)")
    logprobs: int_in(ge=0, le=MAX_TOP_LOGPROBS) | None = Field(
        default=None,
        description="log-probabilities of the tokens and of the k most likely at each position",
    )
    best_of: Any = None
    suffix: Any = None


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class CalledFunction(_Body):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(_Body):
    """A call an assistant turn made (OpenAI's message.tool_calls[])."""

    id: StrictStr
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(_Body):
    """One turn. content may be null only on an assistant turn that made tool calls (Intake.check says so). Any
    other key is a 400 naming it, as in the request itself."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: StrictStr | None = None  # a tool turn: the call it answers
    name: StrictStr | None = None  # OpenAI's name of the turn's participant: accepted, no instruction for the model

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int_in(ge=1) | None = None  # a chat has no echo: nothing to score with 0
    logprobs: StrictBool | None = False
    top_logprobs: int_in(ge=0, le=MAX_TOP_LOGPROBS) | None = Field(default=None, description="1+ needs logprobs")
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(default=None, max_length=64)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        default=None, description="a named function must be one of tools (a 400 otherwise)"
    )
    parallel_tool_calls: StrictBool | None = None  # at most one call either way, which both values allow
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def completion_tokens(gen: Generation) -> int:
    """Tokens the model generated, as vLLM counts them: the EOS that ended the answer too (it has a logprobs entry,
    and no text). A stop string's tokens count (their text is cut); a finished grammar adds nothing."""
    return len(gen.token_ids) + (gen.eos_id is not None)


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
            message = {"role": "assistant", "content": (text or None) if tool_calls else text}
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
