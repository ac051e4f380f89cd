"""Tokenizers: from a Hugging Face tokenizer.json, or built from a GGUF's own vocabulary and merges.

Either way the result is a `tokenizers.Tokenizer` (byte-level BPE, or SentencePiece BPE with byte fallback) plus
the chat template, rendered with Jinja2 the way transformers renders it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from prefill.costmodel.families import TOKENIZER_KINDS, family_of
from prefill.costmodel.gguf_reader import array_values
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

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None) -> str:
        """The chat template applied to messages [{"role", "content"}] (and `tools`, OpenAI's list, for a template
        that renders them), as transformers renders it."""
        if not self.chat_template:
            raise BadInput("this model has no chat template: pass the prompt raw (--raw)")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        if self._template is None:  # compiling a template takes ~0.1 s: once per tokenizer, not per request
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = _tojson  # transformers' own: keys in order, no HTML escaping (tools, calls)
            self._template = env.from_string(self.chat_template)
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as e:
            raise BadInput(f"chat template refused the messages: {e}") from None


def _tojson(x, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    """The `tojson` filter as transformers defines it for chat templates (jinja2's sorts keys and escapes <>&')."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _gguf_field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    import gguf

    if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
        return array_values(f, errors="replace")
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
    return f.parts[f.data[0]].tolist()[0]


def tokenizer_from_gguf(reader) -> Tokenizer:
    """Build the tokenizer a GGUF describes from its own vocabulary: byte-level BPE (tokenizer model 'gpt2':
    tokens, merges, pre-tokenizer regex) or SentencePiece (model 'llama': tokens, scores, byte fallback)."""
    kind = _gguf_field(reader, "tokenizer.ggml.model")
    if kind not in TOKENIZER_KINDS:
        raise ModelFileError(
            f"GGUF tokenizer model {kind!r} is not supported (supported: {', '.join(TOKENIZER_KINDS)}); "
            "use a Hugging Face folder with tokenizer.json instead"
        )
    tokens = _gguf_field(reader, "tokenizer.ggml.tokens")
    types = _gguf_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if kind == "gpt2":
        tok = _byte_level_bpe(reader, tokens, types)
    else:
        family = family_of(str(_gguf_field(reader, "general.architecture")))
        tok = _sentencepiece_bpe(reader, tokens, types, gemma=family.sentencepiece == "gemma")

    bos = _gguf_field(reader, "tokenizer.ggml.bos_token_id")
    eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id")
    eot = _gguf_field(reader, "tokenizer.ggml.eot_token_id")
    add_bos = _gguf_field(reader, "tokenizer.ggml.add_bos_token")
    if add_bos is None:
        add_bos = kind == "llama"  # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
    return Tokenizer(
        tok=tok,
        chat_template=_gguf_field(reader, "tokenizer.chat_template"),
        bos_token=tokens[bos] if bos is not None else "",
        eos_token=tokens[eos] if eos is not None else "",
        eos_ids={i for i in (eos, eot) if i is not None},
        add_bos_id=bos if add_bos else None,
    )


def _byte_level_bpe(reader, tokens: list[str], types: list[int]):
    """A byte-level BPE tokenizer from tokenizer.ggml.{tokens, merges, pre}."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    merges = _gguf_field(reader, "tokenizer.ggml.merges") or []
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
    return tok


def _sentencepiece_bpe(reader, tokens: list[str], types: list[int], gemma: bool):
    """A SentencePiece BPE tokenizer from tokenizer.ggml.{tokens, scores, token_type}, as transformers builds it.

    Spaces are the piece "▁"; a character missing from the vocabulary falls back to its UTF-8 bytes
    (<0x00>..<0xFF>). Files usually list no merges: then they are every split of a piece into two pieces of the
    vocabulary, best first by the merged piece's score (Llama), or by its position in the vocabulary (Gemma, whose
    scores do not follow its merge order). Llama prepends "▁" to the text; Gemma does not, and its GGUF spells pieces of
    several spaces with real spaces, which we respell as "▁"s.
    """
    from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    if gemma:
        tokens = ["▁" * len(t) if t and not t.strip(" ") else t for t in tokens]
        scores = [-float(i) for i in range(len(tokens))]
    else:
        scores = _gguf_field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in _gguf_field(reader, "tokenizer.ggml.merges") or []]
    bpe = models.BPE(
        vocab=vocab,
        merges=merges or _merges_from_scores(vocab, tokens, scores),
        fuse_unk=True,
        byte_fallback=True,
        unk_token="<unk>" if gemma else None,
    )
    tok = HFTokenizer(bpe)
    decode = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tok.normalizer = normalizers.Replace(" ", "▁")
    else:
        prefix = _gguf_field(reader, "tokenizer.ggml.add_space_prefix")
        prefix = True if prefix is None else bool(prefix)
        scheme = "first" if prefix else "never"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
        decode += [decoders.Strip(content=" ", left=1)] if prefix else []
    tok.decoder = decoders.Sequence(decode)
    kinds = dict(zip(tokens, types, strict=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in kinds.items() if k == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in kinds.items() if k == _USER_DEFINED])
    return tok


def _merges_from_scores(vocab: dict[str, int], tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: (left, right) for every piece left + right of the
    vocabulary, ordered by the piece's score (best first), then the longer left half, then the longer right."""
    merges = []
    for piece, score in zip(tokens, scores, strict=True):
        local = [(piece[:i], piece[i:]) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges += [(-score, -len(left), -len(right), left, right) for left, right in local]
    merges.sort(key=lambda m: m[:3])  # stable: ties keep the vocabulary order
    return [(m[3], m[4]) for m in merges]


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
