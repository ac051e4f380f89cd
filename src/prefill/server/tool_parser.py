"""tool_choice "auto": the model chooses between text and calls in its chat template's own tool format.

The one format read here is Hermes-style (Qwen2/2.5, Hermes, many fine-tunes): the template lists the tools and
the model answers a call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as vLLM's `hermes`
parser reads it. A template with no tool format (SmolLM2's) cannot offer the choice: Intake answers 400.
"""

from __future__ import annotations

import json
import re
import uuid

from prefill.loading.tokenizer import Tokenizer

HERMES = "hermes"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tool_format(tok: Tokenizer | None) -> str | None:
    """The tool format of a tokenizer's chat template: "hermes" when it renders `tools` and `<tool_call>`, else
    None."""
    template = (tok.chat_template or "") if tok is not None else ""
    return HERMES if "tools" in template and "<tool_call>" in template else None


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


def template_messages(messages) -> list[dict]:
    """Chat turns as HF chat templates take them: an assistant's tool_calls with arguments as objects, a tool
    turn's content and tool_call_id."""
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
