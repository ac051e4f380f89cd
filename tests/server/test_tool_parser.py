"""The Hermes-style tool-call parser of tool_choice "auto" (prefill.server.tool_parser), and how a finished answer
becomes content and tool_calls (prefill.server.replies.calls_in)."""

import json
from types import SimpleNamespace

from prefill.server.replies import calls_in
from prefill.server.tool_parser import hermes_calls, tool_format

NAMES = {"get_weather", "note"}


def test_calls_are_read_and_the_text_around_them_kept():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = hermes_calls(text, NAMES)
    assert content == "Let me check."
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_two_calls_and_no_text_leave_no_content():
    one = '<tool_call>{"name": "note", "arguments": {"text": "a"}}</tool_call>'
    two = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    content, calls = hermes_calls(one + "\n" + two, NAMES)
    assert content is None and [c["function"]["name"] for c in calls] == ["note", "get_weather"]


def test_a_block_that_does_not_parse_or_names_an_unknown_tool_stays_text():
    for text in (
        '<tool_call>{"name": "get_weather", "arguments": </tool_call>',
        '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',
        "plain text",
    ):
        assert hermes_calls(text, NAMES) == (text, [])


def test_calls_in_reads_calls_only_from_a_finished_answer():
    auto = SimpleNamespace(tool_call=False, auto_tools=("get_weather",), generic=False)
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    assert calls_in(auto, text, "stop")[1][0]["function"]["name"] == "get_weather"
    assert calls_in(auto, text, "length") == (text, None)  # cut by max_tokens: the text as it is
    free = SimpleNamespace(tool_call=False, auto_tools=(), generic=False)
    assert calls_in(free, text, "stop") == (text, None)


def test_the_tool_format_is_read_from_the_template():
    hermes = SimpleNamespace(chat_template="{% if tools %}<tools>{% endif %}<tool_call>")
    plain = SimpleNamespace(chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    assert tool_format(hermes) == "hermes" and tool_format(plain) == "generic" and tool_format(None) == "generic"
