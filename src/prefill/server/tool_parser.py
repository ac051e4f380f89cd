"""tool_choice "auto": the model chooses between text and calls, in its chat template's own tool format or in
the generic one.

Hermes-style (Qwen2/2.5, Hermes, many fine-tunes): the template lists the tools and the model answers a call as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as vLLM's `hermes` parser reads it.
Generic (any other template, SmolLM2's among them), as llama.cpp's server does it: a system message describes the
tools, and a grammar holds the answer to `{"tool_call": {"name": ..., "arguments": {...}}}` or `{"response":
"..."}` (prefill.server.structured.Grammars.generic_tools). Earlier calls and tool results are rendered as text
turns in that format: an assistant turn's calls as its JSON, a tool turn as a user turn `{"tool_response": ...}`.
"""

from __future__ import annotations

import json
import re
import uuid

from prefill.loading.tokenizer import Tokenizer

HERMES, GENERIC = "hermes", "generic"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tool_format(tok: Tokenizer | None) -> str:
    """The tool format of a tokenizer's chat template: "hermes" when it renders `tools` and `<tool_call>`, else
    "generic"."""
    template = (tok.chat_template or "") if tok is not None else ""
    return HERMES if "tools" in template and "<tool_call>" in template else GENERIC


def openai_call(name: str, arguments) -> dict:
    """One entry of OpenAI's message.tool_calls: function.arguments as a JSON string."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": args}}


def hermes_calls(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    """The text outside the calls (None when nothing is left) and the calls of `text`, each a `<tool_call>` whose
    JSON names one of `names`. A block that does not parse, or names an unknown tool, stays in the text."""
    calls, kept, at = [], [], 0
    for m in _CALL.finditer(text):
        try:
            call = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(call, dict) or call.get("name") not in names:
            continue
        calls.append(openai_call(call["name"], call.get("arguments", {})))
        kept.append(text[at : m.start()])
        at = m.end()
    kept.append(text[at:])
    content = "".join(kept).strip() if calls else text
    return content or None, calls


def generic_calls(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    """The answer of the generic format: `{"response": text}` -> (text, []); `{"tool_call": {"name", "arguments"}}`
    naming one of `names` -> (None, [the call]); anything else (cut short by max_tokens) -> (text as it is, [])."""
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        return text, []
    call = answer.get("tool_call") if isinstance(answer, dict) else None
    if isinstance(call, dict) and call.get("name") in names:
        return None, [openai_call(call["name"], call.get("arguments", {}))]
    if isinstance(answer, dict) and isinstance(answer.get("response"), str):
        return answer["response"], []
    return text, []


def template_messages(messages, fmt: str = HERMES) -> list[dict]:
    """Chat turns as HF chat templates take them: an assistant's tool_calls with arguments as objects, a tool
    turn's content and tool_call_id; in the generic format (`fmt`), both as text turns."""
    if fmt == GENERIC:
        return [_generic_turn(m) for m in messages]
    out = []
    for m in messages:
        turn: dict = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            turn["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": _args(c)}}
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            turn["tool_call_id"] = m.tool_call_id
        out.append(turn)
    return out


def _args(call):
    try:
        return json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return call.function.arguments  # rendered as the text it is


def _generic_turn(m) -> dict:
    """One turn for a template without a tool format: calls as the JSON the generic grammar writes, a tool's result
    as a user turn."""
    if m.role == "tool":
        result = {"tool_call_id": m.tool_call_id, "content": m.text()}
        return {"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)}
    text = m.text()
    for c in m.tool_calls or ():
        call = json.dumps({"tool_call": {"name": c.function.name, "arguments": _args(c)}}, ensure_ascii=False)
        text = f"{text}\n{call}" if text else call
    return {"role": m.role, "content": text}
