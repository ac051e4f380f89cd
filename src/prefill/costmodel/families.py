"""Model families: the one table of what each supported architecture needs. No torch.

A family is read by the spec reader (config.json keys, GGUF metadata, the attention pattern), by the decoder
(block layout flags), by the GGUF loader (tensor names, the rotary row permutation) and by the tokenizer loader
(the GGUF tokenizer model). Adding a Llama-like family is one `Family(...)` entry in FAMILIES plus its tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefill.errors import ModelFileError

# GGUF tensor names inside block i ("blk.{i}." + key) -> Hugging Face names ("model.layers.{i}." + value),
# the part every family shares: the projections of attention and of the gated MLP.
_GGUF_PROJECTIONS = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Norm slots of a block (prefill.model.Block) -> their Hugging Face names, two-norm (Llama) and four-norm (Gemma).
_LLAMA_NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
_GEMMA_NORMS = {
    "attn_norm": "input_layernorm",
    "attn_post_norm": "post_attention_layernorm",  # same HF name as Llama's pre-MLP norm: a different role
    "mlp_norm": "pre_feedforward_layernorm",
    "mlp_post_norm": "post_feedforward_layernorm",
}
# GGUF norm tensors of a block -> Hugging Face names (llama.cpp calls the pre-MLP norm ffn_norm in both).
_LLAMA_GGUF_NORMS = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight"}
_GEMMA_GGUF_NORMS = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}

# Tokenizer models a GGUF file may name in tokenizer.ggml.model, and what they are.
TOKENIZER_KINDS = {"gpt2": "byte-level BPE", "llama": "SentencePiece (scores, byte fallback)"}


@dataclass(frozen=True)
class Family:
    """One model family: how to read its files and what its blocks do.

    name: the canonical architecture name (ModelSpec.arch); hf_types: config.json `model_type` values;
    gguf_arch: GGUF `general.architecture` values. Block layout: post_norms (Gemma 2/3: norms after attention
    and after the MLP too, four per block), norm_plus_one (RMSNorm scales by 1 + w; llama.cpp stores 1 + w),
    activation of the gated MLP ("silu" or "gelu_tanh"), qk_norm (RMSNorm of each head's q and k), qkv_bias,
    embed_scale (embeddings times sqrt(d_model)), tied_by_default (config.json may omit tie_word_embeddings).
    Attention pattern: windows = "none" (full attention everywhere), "all" (every layer has the config's
    sliding_window, Mistral), "alternate" (even layers windowed, Gemma 2) or "pattern" (every
    sliding_window_pattern-th layer full, the rest windowed, Gemma 3); a config's `layer_types` list wins over
    the rule. local_rope: windowed layers have their own rotary base (rope_local_base_freq, no scaling).
    softcaps: which of the config's attn_logit_softcapping / final_logit_softcapping the family applies
    (Gemma 3 configs carry both keys but only the final one is used, by transformers and llama.cpp alike).
    Files: gguf_permuted_qk (llama.cpp permuted Q/K rows for interleaved rotary), gguf_norms (GGUF norm tensors
    -> HF names), hf_norms (Block norm slot -> HF name), gguf_defaults (metadata llama.cpp hard-codes for the
    family instead of storing it), sentencepiece: how a SentencePiece vocabulary (GGUF tokenizer model 'llama')
    of the family is read: "llama" (a "▁" prepended to the text, merges ranked by score) or "gemma" (no prefix,
    merges ranked by vocabulary order, runs of spaces are pieces); byte-level BPE ('gpt2') files need nothing.
    supported: the decoder runs it (False: shapes and costs only).
    """

    name: str
    hf_types: tuple[str, ...]
    gguf_arch: tuple[str, ...] = ()
    post_norms: bool = False
    norm_plus_one: bool = False
    activation: str = "silu"
    qk_norm: bool = False
    qkv_bias: bool = False
    embed_scale: bool = False
    tied_by_default: bool = False
    windows: str = "none"
    local_rope: bool = False
    softcaps: tuple[str, ...] = ()
    gguf_permuted_qk: bool = False
    gguf_norms: dict[str, str] = field(default_factory=lambda: dict(_LLAMA_GGUF_NORMS))
    hf_norms: dict[str, str] = field(default_factory=lambda: dict(_LLAMA_NORMS))
    gguf_defaults: dict[str, float] = field(default_factory=dict)
    sentencepiece: str = "llama"
    supported: bool = True

    @property
    def gguf_layer_names(self) -> dict[str, str]:
        """GGUF tensor names inside a block -> Hugging Face names inside a layer."""
        return {**_GGUF_PROJECTIONS, **self.gguf_norms}

    def embedding_scale(self, d_model: int) -> float:
        """The factor the token embeddings are multiplied by (sqrt(d_model) for Gemma, else 1)."""
        return math.sqrt(d_model) if self.embed_scale else 1.0


_GEMMA = dict(
    post_norms=True,
    norm_plus_one=True,
    activation="gelu_tanh",
    embed_scale=True,
    tied_by_default=True,
    gguf_norms=_GEMMA_GGUF_NORMS,
    hf_norms=_GEMMA_NORMS,
    sentencepiece="gemma",
)

# The formatter is off for this table alone: it reads better aligned.
# fmt: off
FAMILIES: tuple[Family, ...] = (
    # SmolLM / SmolLM2 are Llama checkpoints; their names are accepted for hand-written specs.
    Family("llama", ("llama", "smollm", "smollm2"), ("llama",), gguf_permuted_qk=True),
    Family("mistral", ("mistral",), (), windows="all", gguf_permuted_qk=True),  # llama.cpp writes Mistral as llama
    Family("qwen2", ("qwen2",), ("qwen2",), qkv_bias=True),  # use_sliding_window is off in released Qwen2 configs
    Family("qwen3", ("qwen3",), ("qwen3",), qk_norm=True),
    Family(
        "gemma2", ("gemma2",), ("gemma2",), windows="alternate", supported=False,
        softcaps=("attn_logit_softcapping", "final_logit_softcapping"),
        gguf_defaults={"query_scale_d_model_at_L": 46}, **_GEMMA,
    ),
    Family(
        "gemma3", ("gemma3_text", "gemma3"), ("gemma3",), qk_norm=True, windows="pattern", local_rope=True,
        softcaps=("final_logit_softcapping",),
        # What llama.cpp fixes for gemma3 instead of writing it to the file: five local layers then a global
        # one, a local rotary base of 10,000, and queries scaled by (d_model / H_q)^-1/2 instead of
        # d_head^-1/2 in the 27B (the only size with L = 62; query_pre_attn_scalar 168 in its config).
        gguf_defaults={"sliding_window_pattern": 6, "rope_local_base_freq": 10000.0, "query_scale_d_model_at_L": 62},
        **_GEMMA,
    ),
)
# fmt: on


def supported_names() -> list[str]:
    """The architecture names the decoder runs, for error messages."""
    return [t for f in FAMILIES if f.supported for t in f.hf_types]


def family_of(arch: str) -> Family:
    """The family of a config.json model_type, a GGUF architecture or a ModelSpec.arch.

    An unknown architecture gets a plain Llama-shaped family the decoder refuses (supported=False), so the
    calculator still reads its shapes.
    """
    for f in FAMILIES:
        if arch == f.name or arch in f.hf_types or arch in f.gguf_arch:
            return f
    return Family(arch, (arch,), (arch,), supported=False)


def check_runnable(arch: str) -> Family:
    """The family, if the decoder implements it; otherwise a clear ModelFileError naming what is supported."""
    f = family_of(arch)
    if not f.supported:
        raise ModelFileError(f"architecture {arch!r} is not supported (supported: {', '.join(supported_names())})")
    return f


def layer_windows(family: Family, L: int, window: int | None, layer_types=None, pattern: int | None = None):
    """Per-layer attention windows (tokens; None = full attention) from a config's pattern.

    `layer_types`: the config's list ("sliding_attention" / "full_attention"), which wins when present;
    else the family's rule with `pattern` (Gemma 3's sliding_window_pattern: layer i is full when
    (i + 1) % pattern == 0).
    """
    if not window:
        return (None,) * L
    if layer_types:
        if len(layer_types) != L:
            raise ModelFileError(f"layer_types lists {len(layer_types)} layers; the model has {L}")
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    if family.windows == "all":
        return (window,) * L
    if family.windows == "alternate":
        return tuple(window if i % 2 == 0 else None for i in range(L))
    if family.windows == "pattern":
        p = int(pattern or 6)
        return tuple(None if (i + 1) % p == 0 else window for i in range(L))
    return (None,) * L
