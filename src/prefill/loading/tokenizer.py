"""Tokenizers: from a Hugging Face tokenizer.json, or built from a GGUF's own vocabulary and merges.

Either way the result is a `tokenizers.Tokenizer` (byte-level BPE) plus the chat template, rendered with Jinja2
the way transformers renders it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from prefill.errors import BadInput, ModelFileError

# Pre-tokenizer split patterns by GGUF `tokenizer.ggml.pre` (the regexes of the original tokenizers).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    "gpt2": (_GPT2_SPLIT, False),
    "smollm": (_GPT2_SPLIT, True),  # SmolLM splits every digit apart, then GPT-2's pattern
    "llama-bpe": (_LLAMA3_SPLIT, False),
    "llama3": (_LLAMA3_SPLIT, False),
    "qwen2": (_QWEN2_SPLIT, False),
}
_CONTROL = 3  # llama.cpp token type of control tokens such as <|im_start|>
_USER_DEFINED = 4


@dataclass
class Tokenizer:
    """Text <-> token ids, and the chat template. `eos_ids` end a generation."""

    tok: object  # tokenizers.Tokenizer
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    eos_ids: set[int] = field(default_factory=set)
    add_bos_id: int | None = None
    _template: object = field(default=None, repr=False)  # the compiled chat template, built on first use

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in the text (<|im_start|>) become their ids.

        `add_special_tokens` adds what the model puts around a raw prompt (a BOS token, for some); a rendered
        chat template already carries its own.
        """
        # encode_batch releases the GIL (encode does not): a long prompt tokenized on a worker thread leaves the
        # server's event loop free.
        ids = self.tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if add_special_tokens and self.add_bos_id is not None and (not ids or ids[0] != self.add_bos_id):
            ids = [self.add_bos_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def pieces(self, text: str) -> list[str]:
        """The prompt as the model sees it: one printable string per token."""
        return [self.tok.decode([i], skip_special_tokens=False) for i in self.encode(text)]

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat template applied to messages [{"role", "content"}], as transformers renders it."""
        if not self.chat_template:
            raise BadInput("this model has no chat template: pass the prompt raw (--raw)")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        if self._template is None:  # compiling a template takes ~0.1 s: once per tokenizer, not per request
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as e:
            raise BadInput(f"chat template refused the messages: {e}") from None


def _gguf_field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    import gguf

    if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
    return f.parts[f.data[0]].tolist()[0]


def tokenizer_from_gguf(reader) -> Tokenizer:
    """Build a byte-level BPE tokenizer from tokenizer.ggml.{tokens, merges, token_type, pre}."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    kind = _gguf_field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelFileError(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
            "use a Hugging Face folder with tokenizer.json instead"
        )
    tokens = _gguf_field(reader, "tokenizer.ggml.tokens")
    merges = _gguf_field(reader, "tokenizer.ggml.merges") or []
    types = _gguf_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    pre = _gguf_field(reader, "tokenizer.ggml.pre") or "gpt2"
    split, digits = _PRE_SPLITS.get(pre, _PRE_SPLITS["gpt2"])

    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False)
    tok = HFTokenizer(bpe)
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps += [
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    specials = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types, strict=False)
        if ty in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens(specials)

    bos = _gguf_field(reader, "tokenizer.ggml.bos_token_id")
    eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id")
    eot = _gguf_field(reader, "tokenizer.ggml.eot_token_id")
    add_bos = bool(_gguf_field(reader, "tokenizer.ggml.add_bos_token"))
    return Tokenizer(
        tok=tok,
        chat_template=_gguf_field(reader, "tokenizer.chat_template"),
        bos_token=tokens[bos] if bos is not None else "",
        eos_token=tokens[eos] if eos is not None else "",
        eos_ids={i for i in (eos, eot) if i is not None},
        add_bos_id=bos if add_bos else None,
    )


def tokenizer_from_folder(folder: Path, eos_ids_from_config: set[int]) -> Tokenizer | None:
    """tokenizer.json + tokenizer_config.json of a Hugging Face folder; None when the folder has none."""
    from tokenizers import Tokenizer as HFTokenizer

    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    tok = HFTokenizer.from_file(str(path))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}

    def token_text(v) -> str:
        return (v.get("content", "") if isinstance(v, dict) else v) or ""

    template = cfg.get("chat_template")
    jinja = folder / "chat_template.jinja"
    if template is None and jinja.exists():
        template = jinja.read_text()
    eos_token = token_text(cfg.get("eos_token"))
    eos_ids = set(eos_ids_from_config)
    if eos_token and tok.token_to_id(eos_token) is not None:
        eos_ids.add(tok.token_to_id(eos_token))
    return Tokenizer(
        tok=tok,
        chat_template=template if isinstance(template, str) else None,
        bos_token=token_text(cfg.get("bos_token")),
        eos_token=eos_token,
        eos_ids=eos_ids,
    )


def default_tokenize(text: str) -> list[str]:
    """The prompt split as the embedded model (SmolLM2) tokenizes it: one printable piece per token."""
    from prefill.loading.resolve import default_model_path
    from prefill.specs import open_gguf

    return tokenizer_from_gguf(open_gguf(default_model_path())).pieces(text)
