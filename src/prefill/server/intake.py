"""From a validated request body to what the worker needs: sampling parameters, each prompt's token ids and
max_tokens, the log-probabilities asked for (logprobs, echo), and the grammar the answer must follow
(response_format or a forced tool call), or an ApiError that names the field.

`check` is cheap and runs on the event loop; `prepare` tokenizes and compiles the grammar and runs on a worker
thread (a long prompt takes a second to tokenize; the tokenizer releases the GIL meanwhile).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from prefill.engine.llm import Engine
from prefill.engine.prompt import check_prompt
from prefill.engine.sampling import SamplingParams
from prefill.errors import BadInput
from prefill.server.api_errors import ApiError
from prefill.server.config import ServeConfig
from prefill.server.openai_schema import ChatCompletionRequest, ChatMessage, CompletionRequest
from prefill.server.structured import Grammar, GrammarConstraint, Grammars
from prefill.server.tool_parser import GENERIC, template_messages, tool_format

Body = CompletionRequest | ChatCompletionRequest


@dataclass(frozen=True)
class Prepared:
    """A request ready for the worker: one job per prompt. Seconds."""

    prompts: list[list[int]]  # token ids of each prompt
    max_tokens: list[int]  # of each prompt
    echoes: list[str]  # what each choice starts with: its prompt's text with echo, else ""
    logprobs: int | None  # k alternatives per token, or None: no log-probabilities asked for
    scored: bool  # echo with logprobs: every prompt position's log-probability (prefill.engine.scoring)
    constraint: GrammarConstraint | None
    grammar: Grammar | None
    tokenize_s: float
    auto_tools: tuple[str, ...] = ()  # tool_choice "auto": the tools the model may call in its template's format
    generic: bool = False  # ... in the generic format ({"tool_call": ...} or {"response": ...}), not its template's

    @property
    def tool_call(self) -> bool:
        return self.grammar is not None and bool(self.grammar.tool_names)


class Intake:
    """What one engine accepts, within one server's limits (ServeConfig): its vocabulary, its context, its
    grammars."""

    def __init__(self, engine: Engine, cfg: ServeConfig) -> None:
        self.engine, self.cfg = engine, cfg
        self.context, self.vocab = engine.spec.context_length, engine.spec.vocab_size
        tok = engine.tokenizer
        self.grammars = Grammars(tok, self.vocab) if tok is not None else None
        self.tool_format = tool_format(tok)  # "hermes", or "generic": the template cannot render tools and calls
        # No token is longer than this many characters, so a text longer than context * this cannot fit: it is
        # refused before it is tokenized.
        self.max_token_chars = max((len(t) for t in tok.tok.get_vocab()), default=1) if tok is not None else 1

    def check(self, body: Body, chat: bool) -> SamplingParams:
        """The cheap checks (on the event loop): refused fields, logit_bias ids, logprobs, echo and the number of
        prompts, each prompt's size in characters."""
        refused = body.refused_field()
        if refused:
            raise ApiError(
                400,
                f"{refused}: not supported by this server; remove it or send its default",
                param=refused,
                code="unsupported_parameter",
            )
        bias = body.logit_bias_pairs()
        if any(t >= self.vocab for t, _ in bias):
            raise ApiError(400, f"logit_bias: token ids must lie in [0, {self.vocab})", param="logit_bias")
        self.logprobs_k(body, chat)
        self.check_max_tokens(body)
        if chat:
            check_messages(body.messages)
        if body.requested_max_tokens() == 0 and not echo_of(body, chat):
            raise ApiError(
                400, "max_tokens 0 returns nothing without echo: true (a scoring request)", param="max_tokens"
            )
        n = 1 if chat else len(_prompt_items(body.prompt))
        if n > self.cfg.max_prompts:
            raise ApiError(400, f"{n} prompts in one request; at most {self.cfg.max_prompts}", param="prompt")
        if body.stream and n > 1:
            raise ApiError(400, "stream one prompt at a time", param="prompt")
        self.check_chars(sum(len(m.text()) for m in body.messages) if chat else _prompt_chars(body.prompt))
        return SamplingParams(
            temperature=float(body.temperature),
            top_k=body.top_k,
            top_p=float(body.top_p),
            seed=body.seed,
            logit_bias=bias,
        )

    def check_chars(self, chars: int, param: str = "prompt") -> None:
        """A 400 for a text of `chars` characters that cannot fit the context, before anything tokenizes it."""
        if chars > self.context * self.max_token_chars:
            raise ApiError(
                400,
                f"the prompt has {chars} characters, more than {self.context} tokens of this "
                "model's context can hold; shorten it",
                param=param,
                code="context_length_exceeded",
            )

    def prepare(self, body: Body, chat: bool) -> Prepared:
        """Tokenize, check each prompt's length, and compile the grammar (on a worker thread)."""
        t0 = time.perf_counter()
        prompts = self.prompt_ids(body, chat)
        tokenize_s = time.perf_counter() - t0
        echo, k = echo_of(body, chat), self.logprobs_k(body, chat)
        max_tokens = [self.max_tokens_for(ids, body, echo) for ids in prompts]
        scored = echo and k is not None
        n_scored = sum(len(ids) for ids in prompts)
        if scored and n_scored > self.cfg.max_echo_tokens:
            raise ApiError(
                400,
                f"echo with logprobs of {n_scored} prompt tokens; at most {self.cfg.max_echo_tokens}"
                " per request: send fewer or shorter prompts",
                param="echo",
                code="echo_too_long",
            )
        echoes = [""] * len(prompts)
        if echo:
            texts = _prompt_items(body.prompt)
            tok = self.engine.need_tokenizer()
            echoes = [
                t if isinstance(t, str) else tok.decode(ids, skip_special=False)
                for t, ids in zip(texts, prompts, strict=True)
            ]
        grammar = self.grammar_of(body) if chat else None
        constraint = self.grammars.constraint(grammar) if grammar is not None else None
        auto = tuple(t.function.name for t in body.tools) if chat and _tools_auto(body) else ()
        generic = bool(auto) and self.tool_format == GENERIC
        return Prepared(prompts, max_tokens, echoes, k, scored, constraint, grammar, tokenize_s, auto, generic)

    def prompt_ids(self, body: Body, chat: bool) -> list[list[int]]:
        """Token ids of each prompt (one for chat)."""
        tok = self.engine.need_tokenizer()
        if chat:
            messages = template_messages(body.messages, self.tool_format)
            generic = self.tool_format == GENERIC and _tools_auto(body)
            if _tools_forced(body) or generic:
                messages = with_tools_described(messages, body.tools, GENERIC_NOTE if generic else FORCED_NOTE)
            auto = _tools_auto(body) and not generic
            tools = [t.model_dump(exclude_none=True) for t in body.tools] if auto else None
            return [tok.encode(tok.render_chat(messages, add_generation_prompt=True, tools=tools))]
        out = []
        for item in _prompt_items(body.prompt):
            out.append(tok.encode(item, add_special_tokens=True) if isinstance(item, str) else list(item))
        return out

    def max_tokens_for(self, ids: list[int], body: Body, echo: bool) -> int:
        """max_tokens for a prompt: the request's, or the default that fits; a 400 when it cannot run (the one
        prompt rule, prefill.engine.prompt: P + max_tokens <= context length)."""
        lim, requested, P = self.cfg, body.requested_max_tokens(), len(ids)
        room = self.context - P
        max_tokens = (
            requested if requested is not None else max(0, min(lim.default_max_tokens, lim.max_tokens_limit, room))
        )
        if requested is None and room < 1 and not echo:  # nothing left to generate, and nothing to echo
            raise ApiError(
                400,
                f"the prompt has {P} tokens and fills this model's context length {self.context}: shorten it",
                param="prompt",
                code="context_length_exceeded",
            )
        try:
            check_prompt(ids, self.engine.spec, max_tokens=max_tokens)
        except BadInput as e:
            over = "context length" in str(e)
            raise ApiError(
                400,
                str(e),
                param="max_tokens" if over and requested and room > 0 else "prompt",
                code="context_length_exceeded" if over else None,
            ) from None
        return max_tokens

    def check_max_tokens(self, body: Body) -> None:
        """Each of max_tokens and max_completion_tokens that is sent lies within the server's limit, whichever wins."""
        limit = self.cfg.max_tokens_limit
        for name in ("max_tokens", "max_completion_tokens"):
            value = getattr(body, name)
            if value is not None and value > limit:
                raise ApiError(
                    400,
                    f"{name} {clip(value)} is over this server's limit {limit}",
                    param=name,
                    code="context_length_exceeded",
                )

    @staticmethod
    def logprobs_k(body: Body, chat: bool) -> int | None:
        """k alternatives per token, or None when the request asks for no log-probabilities."""
        if not chat:
            return body.logprobs
        if body.top_logprobs and not body.logprobs:  # 0 alternatives ask for nothing: no refusal
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (body.top_logprobs or 0) if body.logprobs else None

    def grammar_of(self, body: ChatCompletionRequest) -> Grammar | None:
        """The grammar the answer must follow: response_format or a forced tool call; None for free text.

        tool_choice "none" ignores the tools; "auto" (the default when tools are given) is free text in which the
        model may write calls in its template's tool format, or where the template has none, the generic format's
        grammar: a call or a response (prefill.server.tool_parser)."""
        tools, choice, fmt = body.tools, body.tool_choice, body.response_format
        if choice == "none" or (choice is None and not tools):
            tools = None
        elif not tools:
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        elif choice in (None, "auto"):
            if fmt is not None and fmt.type != "text":
                raise ApiError(400, "response_format cannot be combined with tool_choice 'auto'", param="tool_choice")
            if self.tool_format != GENERIC or self.grammars is None:
                return None  # free text, in which the template's format marks a call
            return self.grammars.generic_tools(_specs(tools))
        elif choice != "required":
            tools = [t for t in tools if t.function.name == choice.function.name]
            if not tools:
                raise ApiError(
                    400, f"tool_choice names {choice.function.name!r}, which is not in tools", param="tool_choice"
                )
        if tools and fmt is not None and fmt.type != "text":
            raise ApiError(400, "response_format cannot be combined with a forced tool call", param="response_format")
        if self.grammars is None or (not tools and (fmt is None or fmt.type == "text")):
            return None
        if tools:
            return self.grammars.tool_call(_specs(tools))
        if fmt.type == "json_object":
            return self.grammars.json_object()
        if fmt.json_schema is None:
            raise ApiError(400, "response_format of type json_schema needs json_schema", param="response_format")
        return self.grammars.json_schema(fmt.json_schema.schema_)


def check_messages(messages: list[ChatMessage]) -> None:
    """Each turn carries what its role needs: content, unless it is an assistant's turn of tool calls."""
    for i, m in enumerate(messages):
        if m.content is None and not m.tool_calls:
            raise ApiError(400, f"messages.{i}.content: a {m.role} turn needs content", param=f"messages.{i}.content")


def echo_of(body: Body, chat: bool) -> bool:
    return not chat and body.echo


def _prompt_items(prompt) -> list:
    """The prompts of a completions request: one text, one list of ids, or a list of either."""
    return [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else list(prompt)


def _prompt_chars(prompt) -> int:
    """Characters of the longest text prompt (each must fit the context on its own)."""
    return max((len(p) for p in _prompt_items(prompt) if isinstance(p, str)), default=0)


def _specs(tools) -> list[dict]:
    return [{"name": t.function.name, "parameters": t.function.parameters} for t in tools]


def _tools_forced(body: ChatCompletionRequest) -> bool:
    return bool(body.tools) and body.tool_choice not in (None, "none", "auto")


def _tools_auto(body: ChatCompletionRequest) -> bool:
    return bool(body.tools) and body.tool_choice in (None, "auto")


FORCED_NOTE = 'Call one by answering with JSON: {"name": <function name>, "arguments": <its arguments>}.'
GENERIC_NOTE = (  # llama.cpp's generic format
    'Answer with JSON: {"tool_call": {"name": <function name>, "arguments": <its arguments>}} to call one of them '
    'when the request needs it, or {"response": <your answer>} to answer the user directly.'
)


def with_tools_described(messages: list[dict], tools, how: str) -> list[dict]:
    """The chat with the tools described in its system message, and `how` to answer: the chat templates we read
    take no `tools`, and a model asked for a call it was never told about calls it blindly."""
    specs = [
        {"name": t.function.name, "description": t.function.description, "parameters": t.function.parameters}
        for t in tools
    ]
    note = "You can call these functions:\n" + json.dumps(specs, ensure_ascii=False) + "\n" + how
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + note}, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


def clip(value: object, max_chars: int = 24) -> str:
    """`value` as text for an error message, at most about `max_chars` of it: a 4,001-digit number reads
    "123456789012… (4001 characters)"."""
    text = str(value)
    return text if len(text) <= max_chars else f"{text[: max_chars // 2]}… ({len(text)} characters)"
