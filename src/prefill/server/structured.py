"""Structured output: a grammar that every sampled token must follow, so the answer always parses.

`Grammars(tokenizer, vocab_size)` compiles OpenAI's `response_format` (json_object, json_schema) and forced tool
calls into llguidance grammars for one tokenizer; `Grammars.constraint(grammar)` gives the per-request
`GrammarConstraint` that the request loop calls each step:

    logits_row = constraint.mask(logits_row)   # [vocab] float32, tokens the grammar forbids set to -inf
    token = sample(...)
    constraint.accept(token)
    if constraint.done(): finish with "stop"   # the grammar is complete: only EOS could follow

JSON is compact (no free whitespace between tokens, ", " and ": " as separators): flexible whitespace lets a
model pad forever; for the same reason integers the schema leaves unbounded are bounded to int64 (19 digits).
A generation cut by max_tokens still ends mid-JSON (finish_reason "length": the JSON may be incomplete), as in
OpenAI.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass

import numpy as np
import torch

from prefill.errors import BadInput
from prefill.loading.tokenizer import Tokenizer

_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class SchemaError(BadInput):
    """A response_format or tool schema that cannot be compiled; `param` names the field (HTTP 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class GrammarConstraint:
    """One request's grammar state. Not thread-safe: the worker thread is its only caller."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self._m = matcher
        self.vocab_size = vocab_size

    def _allowed(self) -> np.ndarray:
        bits = np.unpackbits(np.frombuffer(self._m.compute_bitmask(), np.uint8), bitorder="little")
        return bits[: self.vocab_size].astype(bool)  # [vocab]

    def allowed(self) -> torch.Tensor:
        """bool [vocab]: the tokens the grammar allows next."""
        return torch.from_numpy(self._allowed())

    def mask(self, logits_row: torch.Tensor) -> torch.Tensor:
        """logits_row [vocab] float32 with every token the grammar forbids set to -inf (a new tensor)."""
        if logits_row.device.type == "cpu":  # numpy: a 0.1 ms op, which torch's thread pool makes 10-50 ms when busy
            row = logits_row.detach().float().numpy()
            return torch.from_numpy(np.where(self._allowed(), row, np.float32(-np.inf)))
        return logits_row.masked_fill(~self.allowed().to(logits_row.device), float("-inf"))

    def accept(self, token_id: int) -> None:
        """Advance the grammar by the sampled token; a token the mask forbade is a bug, not user input."""
        if not self._m.consume_token(int(token_id)):
            raise RuntimeError(f"the grammar refused token {token_id}: {self._m.get_error()}")

    def done(self) -> bool:
        """The grammar is complete: nothing but EOS may follow, so the request can stop now."""
        return self._m.is_stopped()


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar (llguidance's serialized form) and what it is for."""

    text: str
    tool_names: tuple[str, ...] = ()  # a tool-call grammar: the answer is {"name": ..., "arguments": {...}}


class Grammars:
    """Compiles response formats and tool calls into grammars for one tokenizer (built once, ~0.3 s)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._ll = None
        self._lock = threading.Lock()

    def _lltokenizer(self):
        import llguidance

        with self._lock:
            if self._ll is None:
                self._ll = llguidance.LLTokenizer(
                    self.tokenizer.tok.to_str(), n_vocab=self.vocab_size, eos_token=sorted(self.tokenizer.eos_ids)
                )
            return self._ll

    def json_schema(self, schema: dict, param: str = "response_format") -> Grammar:
        """A grammar for JSON matching `schema`; SchemaError (naming `param`) when the schema cannot be compiled."""
        import llguidance

        if loop := ref_loop(schema):
            chain = " -> ".join(loop)
            raise SchemaError(f"{param}: the JSON schema's $ref loops back without describing a value: {chain}", param)
        try:
            bounded = json.dumps(int64_integers(schema))
            text = llguidance.LLMatcher.grammar_from_json_schema(bounded, overrides=_JSON_OPTIONS)
        except (ValueError, TypeError) as e:
            raise SchemaError(f"{param}: the JSON schema is not valid: {e}", param) from None
        error = llguidance.LLMatcher.validate_grammar(text, self._lltokenizer())
        if error:
            raise SchemaError(f"{param}: the JSON schema is not supported: {error}", param)
        if llguidance.LLMatcher(self._lltokenizer(), text, log_level=0).is_stopped():  # only the empty answer
            raise SchemaError(f"{param}: the JSON schema matches no JSON value", param)
        return Grammar(text)

    def json_object(self) -> Grammar:
        """Any JSON object (response_format {"type": "json_object"})."""
        return self.json_schema({"type": "object"})

    def tool_call(self, tools: list[dict]) -> Grammar:
        """One call of one of `tools` ([{"name", "parameters"}]): {"name": <one of them>, "arguments": {...}}."""
        options = call_schemas(tools)
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return Grammar(self.json_schema(schema, param="tools").text, tuple(t["name"] for t in tools))

    def generic_tools(self, tools: list[dict]) -> Grammar:
        """The generic tool format's answer (llama.cpp's): {"tool_call": <one call of `tools`>} or {"response":
        <text>}. Its tool_names stay empty: the reply reads it as generic (prefill.server.tool_parser)."""
        wrap = [
            {"type": "object", "properties": {"tool_call": c}, "required": ["tool_call"], "additionalProperties": False}
            for c in call_schemas(tools)
        ]
        response = {
            "type": "object",
            "properties": {"response": {"type": "string"}},
            "required": ["response"],
            "additionalProperties": False,
        }
        return self.json_schema({"anyOf": [*wrap, response]}, param="tools")

    def constraint(self, grammar: Grammar) -> GrammarConstraint:
        """A fresh per-request state of `grammar`."""
        import llguidance

        matcher = llguidance.LLMatcher(self._lltokenizer(), grammar.text, log_level=0)
        if matcher.is_error():
            raise BadInput(f"the grammar cannot be used: {matcher.get_error()}")
        return GrammarConstraint(matcher, self.vocab_size)


def call_schemas(tools: list[dict]) -> list[dict]:
    """The JSON schema of one call of each of `tools`: {"name": <its name>, "arguments": <its parameters>}. The
    arguments hold the parameters named and no others unless the schema says so (OpenAI's strict mode does the
    same): a small model otherwise writes made-up fields until max_tokens runs out."""
    return [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["name"]},
                "arguments": _closed(t.get("parameters") or {"type": "object"}),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]


def _closed(parameters: dict) -> dict:
    """An object schema with named properties and no word on others: the named ones only."""
    if parameters.get("type") == "object" and parameters.get("properties") and "additionalProperties" not in parameters:
        return {**parameters, "additionalProperties": False}
    return parameters


# Keywords that describe no value: a schema with a $ref and only these is another name for its target.
_ANNOTATIONS = frozenset(("$ref", "$defs", "definitions", "$schema", "$id", "$comment", "title", "description"))


def ref_loop(schema) -> list[str] | None:
    """The first chain of local $refs ("#/$defs/a") that comes back to a schema it passed through, each schema on it
    being a $ref alone (another name, no value described: {"$ref": "#"} at the root, a -> b -> a), or None. A $ref
    under a property or an item (a tree) is no loop: each turn describes one more level of the value."""

    def target(ref: str):
        if ref != "#" and not ref.startswith("#/"):
            return None  # another document, or an anchor: not followed
        node = schema
        for part in ref[2:].split("/") if ref != "#" else ():
            key = part.replace("~1", "/").replace("~0", "~")  # JSON Pointer's escapes
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                return None
        return node

    for ref in _refs(schema):
        chain, seen, node = [ref], [], target(ref)
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and set(node) <= _ANNOTATIONS:
            if any(node is s for s in seen):
                return chain
            seen.append(node)
            chain.append(node["$ref"])
            node = target(node["$ref"])
    return None


def _refs(schema):
    """Every $ref string in `schema` (not inside the values of const, enum, default or examples)."""
    if isinstance(schema, list):
        for s in schema:
            yield from _refs(s)
    elif isinstance(schema, dict):
        if isinstance(schema.get("$ref"), str):
            yield schema["$ref"]
        for k, v in schema.items():
            if k not in ("const", "enum", "default", "examples"):
                yield from _refs(v)


# How most JSON parsers read an integer: int64, at most 19 digits. The lowest 1,024 values are left out because
# llguidance reads a bound through a float64 and cannot build the range from -(2^63 - 512) down.
INT64_MIN, INT64_MAX = -(2**63) + 1024, 2**63 - 1


def int64_integers(schema):
    """`schema` with every integer that has no bound of its own bounded to the int64 range: the meaning is the
    same for any parser that reads int64, and a small model can no longer write digits until max_tokens runs out."""
    if isinstance(schema, list):
        return [int64_integers(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: int64_integers(v) if k not in ("const", "enum", "default", "examples") else v for k, v in schema.items()}
    kinds = out.get("type")
    if kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds and "number" not in kinds):
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = INT64_MIN
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = INT64_MAX
    return out


def tool_calls_of(text: str) -> list[dict] | None:
    """OpenAI's message.tool_calls from the text a tool-call grammar produced: function.arguments as a JSON string.
    None when the text is not a whole call (a stop string cut it): the caller answers with the text instead."""
    try:
        call = json.loads(text)
    except json.JSONDecodeError:
        return None
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)},
        }
    ]
