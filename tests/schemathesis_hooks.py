"""schemathesis hooks for the suite's runs (loaded through SCHEMATHESIS_HOOKS by schemathesis_run.py).

One rule of the chat route lies beyond JSON Schema: a named `tool_choice` must name one of `tools` (a value of one
field among the values of another; the document says so in words). A schema-valid body almost never meets it by
chance, and the server's 400 for it would read as a valid request refused. So a positive case is sent with its
tool_choice naming its first tool; the 400 itself is tests/server/test_serve_edges.py's to check."""

from __future__ import annotations

import schemathesis


@schemathesis.hook
def before_call(ctx, case, **kwargs) -> None:
    body, meta = case.body, case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(body, dict):
        return
    choice, tools = body.get("tool_choice"), body.get("tools")
    if not (isinstance(choice, dict) and isinstance(choice.get("function"), dict) and tools):
        return
    first = tools[0].get("function", {}).get("name") if isinstance(tools[0], dict) else None
    if isinstance(first, str):
        choice["function"]["name"] = first
