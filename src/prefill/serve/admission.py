"""From a validated request body to what the scheduler needs: sampling parameters, prompt token ids and the
grammar the answer must follow (response_format or a forced tool call), or an ApiError that names the field.

`check` is cheap and runs on the event loop; `prepare` tokenizes and compiles the grammar and runs on a worker
thread (a long prompt takes a second to tokenize; the tokenizer releases the GIL meanwhile).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from prefill.engine import Engine
from prefill.sampling import SamplingParams
from prefill.serve.openai_schema import ApiError, ChatCompletionRequest, CompletionRequest
from prefill.serve.structured import Grammar, GrammarConstraint, Grammars

Body = CompletionRequest | ChatCompletionRequest


@dataclass(frozen=True)
class Prepared:
    """A request ready for the scheduler. Seconds."""

    ids: list[int]  # the (first) prompt's token ids
    constraint: GrammarConstraint | None
    grammar: Grammar | None
    tokenize_s: float
    prompts: tuple[tuple[list[int], str | None], ...] = ()  # every prompt of /v1/completions: (ids, its text)

    @property
    def tool_call(self) -> bool:
        return self.grammar is not None and bool(self.grammar.tool_names)


class Admission:
    """What one engine accepts: its vocabulary, its context, its grammars."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.context, self.vocab = engine.spec.context_length, engine.spec.vocab_size
        tok = engine.tokenizer
        self.grammars = Grammars(tok, self.vocab) if tok is not None else None
        # No token is longer than this many characters, so a text longer than context * this cannot fit: it is
        # refused before it is tokenized.
        self.max_token_chars = max((len(t) for t in tok.tok.get_vocab()), default=1) if tok is not None else 1

    def check(self, body: Body, chat: bool) -> SamplingParams:
        """The cheap checks (on the event loop): refused fields, logit_bias ids, the prompt's size in characters."""
        refused = body.refused_field()
        if refused:
            raise ApiError(400, f"{refused}: not supported by this server; remove it or send its default",
                           param=refused, code="unsupported_parameter")  # fmt: skip
        bias = body.logit_bias_pairs()
        if any(t >= self.vocab for t, _ in bias):
            raise ApiError(400, f"logit_bias: token ids must lie in [0, {self.vocab})", param="logit_bias")
        chars = sum(len(m.text()) for m in body.messages) if chat else _prompt_chars(body.prompt)
        if chars > self.context * self.max_token_chars:
            raise ApiError(400, f"the prompt has {chars} characters, more than {self.context} tokens of this "
                           "model's context can hold; shorten it", param="prompt",
                           code="context_length_exceeded")  # fmt: skip
        return SamplingParams(temperature=float(body.temperature), top_k=body.top_k, top_p=float(body.top_p),
                              seed=body.seed, logit_bias=bias)  # fmt: skip

    def prepare(self, body: Body, chat: bool) -> Prepared:
        """Tokenize and compile the grammar (on a worker thread)."""
        t0 = time.perf_counter()
        prompts = ((self.chat_ids(body), None),) if chat else self.prompts_of(body)
        tokenize_s = time.perf_counter() - t0
        grammar = self.grammar_of(body) if chat else None
        constraint = self.grammars.constraint(grammar) if grammar is not None else None
        return Prepared(prompts[0][0], constraint, grammar, tokenize_s, prompts)

    def prompts_of(self, body: CompletionRequest) -> tuple[tuple[list[int], str | None], ...]:
        """Each prompt of /v1/completions (a text, token ids, or a list of either): its ids and its text, if any."""
        p = body.prompt
        items = [p] if isinstance(p, str) or isinstance(p[0], int) else list(p)
        tok = self.engine.need_tokenizer()
        out = []
        for item in items:
            if isinstance(item, str):
                out.append((tok.encode(item, add_special_tokens=True), item))
            elif any(not 0 <= t < self.vocab for t in item):
                raise ApiError(400, f"token ids must lie in [0, {self.vocab})", param="prompt")
            else:
                out.append((list(item), None))
        return tuple(out)

    def chat_ids(self, body: ChatCompletionRequest) -> list[int]:
        """The chat template applied to the messages (with the forced tools described), tokenized."""
        tok = self.engine.need_tokenizer()
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        if _tools_forced(body):
            messages = with_tools_described(messages, body.tools)
        return tok.encode(tok.render_chat(messages, add_generation_prompt=True))

    def grammar_of(self, body: ChatCompletionRequest) -> Grammar | None:
        """The grammar the answer must follow: response_format or a forced tool call; None for free text.

        tool_choice "none" ignores the tools; "auto" (the default when tools are given) is refused: this server
        cannot let the model choose between text and a call."""
        tools, choice, fmt = body.tools, body.tool_choice, body.response_format
        if choice == "none" or (choice is None and not tools):
            tools = None
        elif not tools:
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        elif choice in (None, "auto"):
            raise ApiError(400, "tool_choice 'auto' (the default when tools are given) is not supported: this server "
                           "cannot let the model choose between text and a call; pass tool_choice 'required', "
                           "{'type': 'function', 'function': {'name': ...}} or 'none'", param="tool_choice",
                           code="unsupported_value")  # fmt: skip
        elif choice != "required":
            tools = [t for t in tools if t.function.name == choice.function.name]
            if not tools:
                raise ApiError(400, f"tool_choice names {choice.function.name!r}, which is not in tools",
                               param="tool_choice")  # fmt: skip
        if tools and fmt is not None and fmt.type != "text":
            raise ApiError(400, "response_format cannot be combined with a forced tool call", param="response_format")
        if self.grammars is None or (not tools and (fmt is None or fmt.type == "text")):
            return None
        if tools:
            specs = [{"name": t.function.name, "parameters": t.function.parameters} for t in tools]
            return self.grammars.tool_call(specs)
        if fmt.type == "json_object":
            return self.grammars.json_object()
        if fmt.json_schema is None:
            raise ApiError(400, "response_format of type json_schema needs json_schema", param="response_format")
        return self.grammars.json_schema(fmt.json_schema.schema_)


def _prompt_chars(prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) for p in prompt) if isinstance(prompt[0], str) else 0


def _tools_forced(body: ChatCompletionRequest) -> bool:
    return bool(body.tools) and body.tool_choice not in (None, "none", "auto")


def with_tools_described(messages: list[dict], tools) -> list[dict]:
    """The chat with the tools described in its system message: the chat templates we read take no `tools`, and a
    model asked for a call it was never told about calls it blindly."""
    specs = [{"name": t.function.name, "description": t.function.description, "parameters": t.function.parameters}
             for t in tools]  # fmt: skip
    note = ("You can call these functions:\n" + json.dumps(specs, ensure_ascii=False) + "\nCall one by answering "
            'with JSON: {"name": <function name>, "arguments": <its arguments>}.')  # fmt: skip
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + note}, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]
