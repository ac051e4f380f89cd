"""From a pending request's events to its HTTP answer: one JSON body, or server-sent events ending in
`data: [DONE]`.

`outcome_of` is the one switch over what the engine sends (TokenEvent, Generation, Failed) and what the app
sends itself (Aborted): a token, the finished generation, or the ApiError the answer ends with. `full_reply`
and `stream_reply` both read their events through it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from prefill.costmodel import costs
from prefill.engine.request import Event, Failed, Generation, TokenEvent
from prefill.errors import BadInput
from prefill.server.api_errors import ApiError, error_body
from prefill.server.intake import Prepared
from prefill.server.logprobs import CompletionLogprobs, chat_content, generated_entries, prompt_entries
from prefill.server.openai_schema import ResponseShape, StreamOptions, completion_tokens, usage_body
from prefill.server.state import Aborted, Pending, ServerState
from prefill.server.structured import tool_calls_of
from prefill.server.tool_parser import generic_calls, hermes_calls

Outcome = TokenEvent | Generation | ApiError


def outcome_of(ev: Event | Aborted) -> Outcome:
    """A token and the finished generation pass as they are; a failure becomes the ApiError the answer ends with
    (400 for the client's fault, 500 for a generation that failed, the app's own status when it aborts)."""
    if isinstance(ev, Failed):
        if isinstance(ev.error, BadInput):
            return ApiError(400, ev.message, param=getattr(ev.error, "param", None))
        return ApiError(500, ev.message, "server_error", code="generation_failed")
    if isinstance(ev, Aborted):
        return ApiError(ev.status, ev.message, "server_error", code="unavailable")
    return ev


@dataclass
class Reply:
    """What one answer is built from: the pending request, what intake prepared, the response's shape."""

    state: ServerState
    pending: Pending
    prepared: Prepared
    shape: ResponseShape

    @property
    def endpoint(self) -> str:
        return "chat" if self.shape.chat else "completions"

    @property
    def route(self) -> str:
        return "/v1/chat/completions" if self.shape.chat else "/v1/completions"

    def decode_one(self, token_id: int) -> str:
        return self.state.engine.tokenizer.decode([token_id], skip_special=False)

    def logprobs_writer(self) -> Callable[[list], dict | None]:
        """Writes `choices[].logprobs` of entries (prefill.server.logprobs), or None when none were asked for. A
        completions writer carries its text offset from call to call: one writer per choice, or per stream."""
        k = self.prepared.logprobs
        if k is None:
            return lambda entries: None
        if self.shape.chat:
            return lambda entries: {"content": chat_content(entries, self.decode_one, k)}
        return CompletionLogprobs(self.decode_one, k).block

    def kv_formula(self, tokens: int) -> int:
        return costs.kv_cache_bytes_for(self.state.engine.spec, tokens, self.state.engine.kv_bytes)

    def final_timings(self, gen: Generation) -> dict:
        """The server's measured timings, with the time model's predictions beside them: the prefill (the suffix
        after a prefix-cache hit), TTFT (tokenization + that prefill, no queue) and one decode step of this
        request alone at its middle context (the ITL of an unloaded server)."""
        engine = self.state.engine
        past, P = gen.cached_tokens, gen.P - gen.cached_tokens
        predicted, how = engine.predict_prefill_seconds(P, past, self.state.cfg.chunk_size)
        itl = engine.predict_itl_seconds(gen.P, len(gen.token_ids))
        out = {
            **gen.timings(),
            "predicted_prefill_s": predicted,
            "predicted_ttft_s": costs.ttft_seconds(predicted, tokenize_s=gen.tokenize_s),
            "predicted_itl_s": itl,
            "predicted_by": how,
            "kv_bytes": gen.kv_bytes,
            "kv_bytes_formula": self.kv_formula(gen.P),
        }
        if gen.prompt_scores is not None:  # a scoring prefill: every position unembedded
            count = costs.scoring_flops_exact(engine.spec, gen.P)
            out.update(scoring_flops=count.total, scoring_unembed_share=count.unembed_share)
        return out


def calls_in(prepared: Prepared, text: str, finish: str) -> tuple[str | None, list[dict] | None]:
    """The message content and tool_calls of a finished answer: a forced call's JSON (the grammar's), the
    `<tool_call>` blocks a model chose to write or the generic format's call or response (tool_choice "auto"), or
    the text alone (no call, or one cut short
    by max_tokens or a stop string)."""
    if finish == "stop" and prepared.tool_call and (calls := tool_calls_of(text)):
        return None, calls
    if finish == "stop" and prepared.auto_tools:
        read = generic_calls if prepared.generic else hermes_calls
        content, calls = read(text, set(prepared.auto_tools))
        if prepared.generic and not calls:  # {"response": text}: the text it holds
            return content, None
        if calls:
            return content, calls
    return text, None


# ---- one JSON body ----
async def disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body was read already, so only http.disconnect comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def full_reply(request: Request, reply: Reply) -> dict | Response:
    """Every job's text and Generation, then one body; a 499 when the client went away first."""
    state, pending = reply.state, reply.pending
    results: list[tuple[str, Generation]] = []
    gone = asyncio.ensure_future(disconnected(request))  # nobody waits for this answer any more
    try:
        for events in pending.queues:
            parts = []
            while True:
                get = asyncio.ensure_future(events.get())
                await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    state.settle(pending, "cancelled", reason="disconnect")
                    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
                out = outcome_of(get.result())
                if isinstance(out, ApiError):
                    state.settle(pending, "raised")
                    raise out
                if isinstance(out, Generation):
                    results.append(("".join(parts), out))
                    break
                parts.append(out.text)
    finally:
        gone.cancel()
        if pending.settled is None and len(results) < len(pending.jobs):  # this handler was cancelled
            state.settle(pending, "cancelled", reason="disconnect")
    return full_body(reply, results)


def full_body(reply: Reply, results: list[tuple[str, Generation]]) -> dict:
    """The body of a finished request: one choice per prompt, the usage summed over them, the timings."""
    prepared, shape = reply.prepared, reply.shape
    choices, totals = [], [0, 0, 0]
    for i, ((text, gen), echoed) in enumerate(zip(results, prepared.echoes, strict=True)):
        content, calls = calls_in(prepared, text, gen.finish_reason)
        finish = "tool_calls" if calls else gen.finish_reason
        scored = prompt_entries(gen.prompt_scores) if prepared.scored and gen.prompt_scores is not None else []
        lp = reply.logprobs_writer()(scored + generated_entries(gen.logprobs))
        choices.append(shape.choice(echoed + (content or ""), finish, lp, index=i, tool_calls=calls))
        for j, n in enumerate((gen.P, completion_tokens(gen), gen.cached_tokens)):
            totals[j] += n
    reply.state.settle(reply.pending, "ok", endpoint=reply.endpoint, finish_reason=choices[0]["finish_reason"])
    timings = [reply.final_timings(gen) for _, gen in results]
    return shape.full_choices(choices, usage_body(*totals), timings[0] if len(timings) == 1 else timings)


# ---- server-sent events ----
def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


class StreamWriter:
    """The chunks of one streamed answer, event by event. A tool call is held back and sent whole once it
    parses; the prompt's text (echo) goes first, with its scores once they are known."""

    def __init__(self, reply: Reply, opts: StreamOptions | None) -> None:
        self.reply, self.shape, self.req = reply, reply.shape, reply.pending.jobs[0]
        self.include_usage = bool(opts and opts.include_usage)
        self.continuous = self.include_usage and bool(opts.continuous_usage_stats)
        self.extra: dict = {"usage": None} if self.include_usage else {}
        self.echoed = reply.prepared.echoes[0]
        self.tools = reply.prepared.tool_call or bool(reply.prepared.auto_tools)  # held back until the end
        self.parts: list[str] = []  # a tool call's text, held back
        self.held: list = []  # a tool call's log-probability entries, held back
        self.sent = 0  # generated tokens whose log-probabilities were taken
        self.write_logprobs = reply.logprobs_writer()

    def logprobs_of(self, entries: list) -> dict | None:
        return self.write_logprobs(entries) if entries else None

    def opening(self) -> list[str]:
        out = [sse(self.shape.chunk("", role=True, **self.extra))] if self.shape.chat else []
        if self.echoed and not self.reply.prepared.scored:  # echo without logprobs: the prompt text first
            out.append(sse(self.shape.chunk(self.echoed, **self.extra)))
            self.echoed = ""
        return out

    def echo(self) -> list[str]:
        """The prompt's text with its scores, known once it is prefilled (echo with logprobs)."""
        if not self.echoed:
            return []
        scores = self.req.gen.prompt_scores
        prompt = prompt_entries(scores) if scores is not None else []
        text, self.echoed = self.echoed, ""
        return [sse(self.shape.chunk(text, logprobs=self.logprobs_of(prompt), **self.extra))]

    def token(self, ev: TokenEvent) -> list[str]:
        entries = generated_entries([ev])
        self.sent += len(entries)
        if self.tools:  # a tool call is sent whole, once it parses
            self.parts.append(ev.text)
            self.held += entries
            return []
        if not ev.text and not self.continuous and not entries:
            return []
        if self.continuous:  # vLLM's continuous_usage_stats, plus what the cache holds right now
            gen = self.req.gen
            self.extra = {
                "usage": usage_body(self.req.P, len(gen.token_ids), gen.cached_tokens),
                "timings": {
                    "t_s": ev.t,
                    "kv_bytes": ev.kv_bytes,
                    "kv_tokens": ev.kv_tokens,
                    "kv_bytes_formula": self.reply.kv_formula(ev.kv_tokens),
                },
            }
        return [sse(self.shape.chunk(ev.text, logprobs=self.logprobs_of(entries), **self.extra))]

    def finish(self, gen: Generation) -> tuple[str, list[str]]:
        """The finish reason, and the last chunks: the held-back tool call or text, the finish, the usage."""
        out, shape, finish = [], self.shape, gen.finish_reason
        rest = self.held + generated_entries(gen.logprobs[self.sent :])  # held back, and a final EOS's
        if self.tools:
            content, calls = calls_in(self.reply.prepared, "".join(self.parts), finish)
            finish = "tool_calls" if calls else finish
            out.append(sse(shape.chunk(content, tool_calls=calls, logprobs=self.logprobs_of(rest), **self.extra)))
            rest = []
        usage, timings = usage_body(gen.P, completion_tokens(gen), gen.cached_tokens), self.reply.final_timings(gen)
        if self.include_usage:
            last = shape.chunk(None, finish, logprobs=self.logprobs_of(rest), usage=usage if self.continuous else None)
            out += [sse(last), sse(shape.usage_chunk(usage, timings))]
        else:  # OpenAI clients ignore the extra fields; other clients can read them
            out.append(sse(shape.chunk(None, finish, logprobs=self.logprobs_of(rest), usage=usage, timings=timings)))
        return finish, out


async def stream_reply(reply: Reply, opts: StreamOptions | None) -> AsyncIterator[str]:
    """The events of the one job of a streamed request as server-sent events; a failure is a final error event."""
    state, pending, writer = reply.state, reply.pending, StreamWriter(reply, opts)
    try:
        for chunk in writer.opening():
            yield chunk
        while True:
            out = outcome_of(await pending.queues[0].get())
            if pending.settled == "cancelled":
                break  # not read for too long: the request was dropped
            if isinstance(out, ApiError):
                state.settle(pending, "error", route=reply.route, status=str(out.status))
                yield sse(error_body(out.message, "server_error", None, f"http_{out.status}"))
                break
            for chunk in writer.echo():
                yield chunk
            if isinstance(out, TokenEvent):
                for chunk in writer.token(out):
                    yield chunk
                continue
            finish, last = writer.finish(out)
            state.settle(pending, "ok", endpoint=reply.endpoint, finish_reason=finish)
            for chunk in last:
                yield chunk
            break
        yield sse("[DONE]")
    finally:
        state.settle(pending, "cancelled", reason="disconnect")  # no-op once settled; else the client went away
