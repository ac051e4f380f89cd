"""ModelSpec: the shapes of a decoder-only transformer, from a Hugging Face config.json, a GGUF file's
metadata or a built-in preset, and the parameter count N those shapes imply. No torch."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefill.costmodel.families import Family, check_runnable, family_of, layer_windows
from prefill.costmodel.gguf_file import open_gguf
from prefill.errors import BadInput, ModelFileError

_SOFTCAPS = ("attn_logit_softcapping", "final_logit_softcapping")  # config.json and GGUF ({arch}.) keys
# The encoding that ends a GGUF file's name (llama.cpp's convention: Name-Size-FineTune-Encoding.gguf).
_GGUF_ENCODING = re.compile(r"[.-](?:[IT]?Q\d\w*|MXFP4|BF16|F16|F32|F64)$", re.IGNORECASE)


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a decoder-only transformer with grouped-query attention and a gated MLP.

    L layers; d_model hidden width; H_q query heads and H_kv key/value heads of width d_head; d_ff MLP width;
    vocab_size tokens; context_length the longest trained context (tokens); tied_embeddings when the
    unembedding reuses the embedding matrix; rope_theta the rotary base; norm_eps the RMSNorm epsilon;
    qkv_bias when the Q/K/V projections have biases (Qwen2); qk_norm when Q and K are RMS-normalised per head
    (Qwen3, Gemma 3). windows: per layer, the attention window W in tokens (a position sees itself and the
    W - 1 before it) or None for full attention; rope_local_theta: the rotary base of windowed layers when it
    differs (Gemma 3; they get no rope scaling); query_pre_attn_scalar: scores are scaled by its -1/2 power
    instead of d_head's (Gemma); attn_softcap / final_softcap: cap * tanh(x / cap) on the attention scores /
    the logits (Gemma 2). Everything else a family does differently is in `family` (prefill.costmodel.families).
    """

    name: str
    arch: str
    L: int
    d_model: int
    H_q: int
    H_kv: int
    d_head: int
    d_ff: int
    vocab_size: int
    context_length: int
    tied_embeddings: bool
    rope_theta: float
    norm_eps: float
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_scaling: dict | None = field(default=None, compare=False)
    windows: tuple[int | None, ...] = ()  # () = full attention in every layer; else one entry per layer
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None

    def __post_init__(self) -> None:
        for key in ("L", "d_model", "H_q", "H_kv", "d_head", "d_ff", "vocab_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInput(f"model {self.name!r}: {key} must be a positive integer, got {value!r}")
        if self.H_q % self.H_kv:
            raise BadInput(f"model {self.name!r}: H_q={self.H_q} is not a multiple of H_kv={self.H_kv}")
        windows = tuple(self.windows) or (None,) * self.L
        if len(windows) != self.L or any(w is not None and (not isinstance(w, int) or w < 1) for w in windows):
            raise BadInput(f"model {self.name!r}: windows must list L={self.L} positive integers or None")
        object.__setattr__(self, "windows", windows)  # normalized: always L entries

    @property
    def family(self) -> Family:
        """The family's table entry: block layout, file names, tokenizer kind (prefill.costmodel.families)."""
        return family_of(self.arch)

    @property
    def windowed(self) -> bool:
        """True when some layer attends to a sliding window instead of the whole context."""
        return any(w is not None for w in self.windows)

    @property
    def attention_scale(self) -> float:
        """The factor on q.k scores: query_pre_attn_scalar^-1/2 (Gemma), else d_head^-1/2."""
        return (self.query_pre_attn_scalar or self.d_head) ** -0.5

    @property
    def params_per_layer(self) -> int:
        """Parameters of one block: Q/K/V/O projections (+ biases), gated MLP, norms."""
        q, kv = self.H_q * self.d_head, self.H_kv * self.d_head
        attention = self.d_model * (q + 2 * kv) + q * self.d_model
        if self.qkv_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.d_head
        mlp = 3 * self.d_model * self.d_ff  # gate, up, down
        norms = (4 if self.family.post_norms else 2) * self.d_model
        return attention + mlp + norms

    @property
    def embedding_params(self) -> int:
        """Parameters of the embedding and, when untied, the unembedding."""
        return self.vocab_size * self.d_model * (1 if self.tied_embeddings else 2)

    @property
    def N_non_embedding(self) -> int:
        """Parameters outside the (un)embedding: all blocks and the final norm."""
        return self.L * self.params_per_layer + self.d_model

    @property
    def N(self) -> int:
        """Total parameters, a tied unembedding counted once."""
        return self.N_non_embedding + self.embedding_params

    # ---- constructors --------------------------------------------------------------------------------

    @classmethod
    def from_hf_config(cls, config: dict[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
        """A spec from a Hugging Face config (a dict, a config.json path, or a model folder holding one).

        Reads head_dim when present instead of assuming d_model / H_q. Missing keys raise BadInput.
        """
        if not isinstance(config, dict):
            config, name = _read_hf_config(Path(config), name)
        if not isinstance(config, dict):
            raise BadInput("a Hugging Face config must be a JSON object")
        c = {**config, **config.get("text_config", {})}  # multimodal wrappers keep the decoder in text_config

        def need(key: str) -> Any:
            if c.get(key) is None:
                if c.get("model_type") is not None:  # another kind of model (GPT-2, Mamba): say that, not the key
                    check_runnable(str(c["model_type"]))
                raise BadInput(f"config.json has no {key!r}; is this a decoder-only Llama-family config?")
            return c[key]

        arch = str(need("model_type"))
        fam = family_of(arch)
        H_q = int(need("num_attention_heads"))
        d_model = int(need("hidden_size"))
        L = int(need("num_hidden_layers"))
        rope = c.get("rope_parameters") or {}  # transformers 5 moves rope_theta there
        local_rope = {}
        if "full_attention" in rope:  # transformers 5 Gemma 3: one set of rotary parameters per layer kind
            rope, local_rope = rope["full_attention"] or {}, rope.get("sliding_attention") or {}
        rope_scaling = c.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        window = c.get("sliding_window") if fam.windows != "none" else None
        pattern = c.get("sliding_window_pattern") or c.get("_sliding_window_pattern")
        local_theta = c.get("rope_local_base_freq") or local_rope.get("rope_theta") if fam.local_rope else None
        softcaps = [c.get(key) if key in fam.softcaps else None for key in _SOFTCAPS]
        return cls(
            name=name or str(c.get("_name_or_path") or arch),
            arch=arch,
            L=L,
            d_model=d_model,
            H_q=H_q,
            H_kv=int(c.get("num_key_value_heads") or H_q),  # absent in pre-GQA configs: one KV head per Q head
            d_head=int(c.get("head_dim") or d_model // H_q),
            d_ff=int(need("intermediate_size")),
            vocab_size=int(need("vocab_size")),
            context_length=int(need("max_position_embeddings")),
            tied_embeddings=bool(c.get("tie_word_embeddings", fam.tied_by_default)),
            rope_theta=float(c.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            norm_eps=float(c.get("rms_norm_eps") or 1e-6),
            qkv_bias=fam.qkv_bias,
            qk_norm=fam.qk_norm,
            rope_scaling=rope_scaling,
            windows=layer_windows(fam, L, window, c.get("layer_types"), pattern),
            rope_local_theta=float(local_theta) if local_theta else None,
            query_pre_attn_scalar=c.get("query_pre_attn_scalar"),
            attn_softcap=softcaps[0],
            final_softcap=softcaps[1],
        )

    @classmethod
    def from_gguf(cls, path: str | Path, reader=None) -> ModelSpec:
        """A spec from a GGUF file's metadata and tensor names (no tensor data is read). `reader`: the file already
        opened by open_gguf (parsing a vocabulary takes seconds; do it once)."""
        path = Path(path)
        if reader is None:
            reader = open_gguf(path)

        def value(key: str, default: Any = None) -> Any:
            f = reader.fields.get(key)
            if f is None:
                if default is None:
                    if key != "general.architecture":  # another kind of model (Mamba): say that, not the key
                        check_runnable(arch)
                    raise ModelFileError(f"{path.name}: GGUF metadata has no {key!r}")
                return default
            return f.contents()

        arch = value("general.architecture")
        fam = family_of(arch)
        d_model = int(value(f"{arch}.embedding_length"))
        H_q = int(value(f"{arch}.attention.head_count"))
        L = int(value(f"{arch}.block_count"))
        d_head = int(value(f"{arch}.attention.key_length", d_model // H_q))
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = value(f"{arch}.vocab_size", len(tokens.data) if tokens is not None else None)
        tensors = {t.name for t in reader.tensors}
        defaults = fam.gguf_defaults
        window = value(f"{arch}.attention.sliding_window", 0) if fam.windows != "none" else None
        pattern = value(f"{arch}.attention.sliding_window_pattern", defaults.get("sliding_window_pattern", 0))
        rope_scaling = None
        if value(f"{arch}.rope.scaling.type", "none") == "linear":
            rope_scaling = {"rope_type": "linear", "factor": float(value(f"{arch}.rope.scaling.factor"))}
        local_theta = (
            value(f"{arch}.rope.freq_base_swa", defaults.get("rope_local_base_freq", 0)) if fam.local_rope else 0
        )
        wide_query = defaults.get("query_scale_d_model_at_L") == L
        softcaps = [value(f"{arch}.{key}", 0.0) if key in fam.softcaps else 0.0 for key in _SOFTCAPS]
        return cls(
            name=gguf_model_name(path),
            arch=fam.name if fam.supported else arch,
            L=L,
            d_model=d_model,
            H_q=H_q,
            H_kv=int(value(f"{arch}.attention.head_count_kv", H_q)),
            d_head=d_head,
            d_ff=int(value(f"{arch}.feed_forward_length")),
            vocab_size=int(vocab),
            context_length=int(value(f"{arch}.context_length")),
            tied_embeddings="output.weight" not in tensors,
            rope_theta=float(value(f"{arch}.rope.freq_base", 10000.0)),
            norm_eps=float(value(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
            qkv_bias="blk.0.attn_q.bias" in tensors,
            qk_norm="blk.0.attn_q_norm.weight" in tensors,
            rope_scaling=rope_scaling,
            windows=_gguf_windows(fam, L, window, pattern),
            rope_local_theta=float(local_theta) or None,
            query_pre_attn_scalar=(d_model // H_q if wide_query else d_head) if fam.embed_scale else None,
            attn_softcap=softcaps[0] or None,
            final_softcap=softcaps[1] or None,
        )

    @classmethod
    def from_preset(cls, name: str) -> ModelSpec:
        """A built-in spec by name (see PRESETS); BadInput listing the names if unknown."""
        key = ALIASES.get(name.lower(), name.lower())
        if key not in PRESETS:
            raise BadInput(f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return PRESETS[key]


def _read_hf_config(path: Path, name: str | None) -> tuple[Any, str]:
    """The JSON of a config.json (or of a model folder's), and the model's name (the folder's unless given)."""
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelFileError(f"no config.json at {path}; pass a model folder or its config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"cannot read {path} as JSON ({e}); is it a Hugging Face config.json?") from None
    return config, name or path.parent.name


def gguf_model_name(path: Path) -> str:
    """A GGUF model's name for people: its file's, less the encoding (SmolLM2-135M-Instruct.Q4_1.gguf ->
    SmolLM2-135M-Instruct). Not general.name, which converters make from a folder's name: here the training run's,
    'Smollm2 135M 8k Lc100K Mix1 Ep2'."""
    return _GGUF_ENCODING.sub("", path.stem) or path.stem


def _gguf_windows(fam: Family, L: int, window, pattern) -> tuple[int | None, ...]:
    """Each layer's window from llama.cpp's keys: the pattern is a period or one bool per layer (True: windowed)."""
    kinds = None
    if isinstance(pattern, list):
        kinds, pattern = ["sliding_attention" if p else "full_attention" for p in pattern], 0
    return layer_windows(fam, L, int(window or 0) or None, kinds, int(pattern or 0) or None)


def load_spec(model: str | Path) -> ModelSpec:
    """A spec from a preset name, a .gguf file, a config.json, or a model folder holding a config.json."""
    if str(model).lower() in PRESETS.keys() | ALIASES.keys():
        return ModelSpec.from_preset(str(model))
    path = Path(model)
    if path.suffix == ".gguf":
        return ModelSpec.from_gguf(path)
    if path.exists():
        return ModelSpec.from_hf_config(path)
    raise BadInput(f"{model!r} is neither a preset ({', '.join(PRESETS)}) nor a .gguf / config.json path")


def _preset(hf_id: str, arch: str, L: int, d_model: int, H_q: int, H_kv: int, d_ff: int, vocab: int, **kw: Any):
    return ModelSpec(
        name=hf_id,
        arch=arch,
        L=L,
        d_model=d_model,
        H_q=H_q,
        H_kv=H_kv,
        d_head=kw.pop("d_head", d_model // H_q),
        d_ff=d_ff,
        vocab_size=vocab,
        **kw,
    )


def _gemma3(
    hf_id: str,
    L: int,
    d_model: int,
    H_q: int,
    H_kv: int,
    d_ff: int,
    vocab: int,
    window: int,
    context: int,
    scaled: bool = False,
    d_head: int = 256,
    query_pre_attn_scalar: int = 256,
) -> ModelSpec:
    """A Gemma 3 text decoder: every sixth layer global (sliding_window_pattern 6), the rest windowed; the
    4B and larger scale the global layers' rotary positions linearly by 8."""
    return _preset(
        hf_id,
        "gemma3_text",
        L,
        d_model,
        H_q,
        H_kv,
        d_ff,
        vocab,
        d_head=d_head,
        context_length=context,
        tied_embeddings=True,
        rope_theta=1_000_000.0,
        norm_eps=1e-6,
        qk_norm=True,
        rope_scaling={"rope_type": "linear", "factor": 8.0} if scaled else None,
        windows=layer_windows(family_of("gemma3"), L, window, pattern=6),
        rope_local_theta=10_000.0,
        query_pre_attn_scalar=query_pre_attn_scalar,
    )


# Copied from each model's published config.json on the Hugging Face Hub (name = repository id): one entry per model.
# The formatter is off for this table alone: it reads better aligned.
# fmt: off
PRESETS: dict[str, ModelSpec] = {
    "llama-2-7b": _preset(
        "meta-llama/Llama-2-7b-hf", "llama", 32, 4096, 32, 32, 11008, 32000,
        context_length=4096, tied_embeddings=False, rope_theta=10000.0, norm_eps=1e-5,
    ),
    "llama-3-8b": _preset(
        "meta-llama/Meta-Llama-3-8B", "llama", 32, 4096, 32, 8, 14336, 128256,
        context_length=8192, tied_embeddings=False, rope_theta=500000.0, norm_eps=1e-5,
    ),
    "llama-3.1-8b": _preset(
        "meta-llama/Llama-3.1-8B", "llama", 32, 4096, 32, 8, 14336, 128256,
        context_length=131072, tied_embeddings=False, rope_theta=500000.0, norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
    ),
    "llama-3-70b": _preset(
        "meta-llama/Meta-Llama-3-70B", "llama", 80, 8192, 64, 8, 28672, 128256,
        context_length=8192, tied_embeddings=False, rope_theta=500000.0, norm_eps=1e-5,
    ),
    "mistral-7b-v0.1": _preset(
        "mistralai/Mistral-7B-v0.1", "mistral", 32, 4096, 32, 8, 14336, 32000,
        context_length=32768, tied_embeddings=False, rope_theta=10000.0, norm_eps=1e-5, windows=(4096,) * 32,
    ),
    "qwen2.5-7b": _preset(
        "Qwen/Qwen2.5-7B", "qwen2", 28, 3584, 28, 4, 18944, 152064,
        context_length=131072, tied_embeddings=False, rope_theta=1000000.0, norm_eps=1e-6, qkv_bias=True,
    ),
    "qwen3-8b": _preset(
        "Qwen/Qwen3-8B", "qwen3", 36, 4096, 32, 8, 12288, 151936, d_head=128,
        context_length=40960, tied_embeddings=False, rope_theta=1000000.0, norm_eps=1e-6, qk_norm=True,
    ),
    "gemma-2-9b": _preset(
        "google/gemma-2-9b", "gemma2", 42, 3584, 16, 8, 14336, 256000, d_head=256,
        context_length=8192, tied_embeddings=True, rope_theta=10000.0, norm_eps=1e-6,
        windows=(4096, None) * 21, query_pre_attn_scalar=256, attn_softcap=50.0, final_softcap=30.0,
    ),
    "gemma-3-270m": _gemma3("google/gemma-3-270m", 18, 640, 4, 1, 2048, 262144, 512, 32768),
    "gemma-3-1b": _gemma3("google/gemma-3-1b-pt", 26, 1152, 4, 1, 6912, 262144, 512, 32768),
    "gemma-3-4b": _gemma3("google/gemma-3-4b-pt", 34, 2560, 8, 4, 10240, 262208, 1024, 131072, scaled=True),
    "gemma-3-12b": _gemma3("google/gemma-3-12b-pt", 48, 3840, 16, 8, 15360, 262208, 1024, 131072, scaled=True),
    "gemma-3-27b": _gemma3("google/gemma-3-27b-pt", 62, 5376, 32, 16, 21504, 262208, 1024, 131072, scaled=True,
                           d_head=128, query_pre_attn_scalar=168),
    "smollm2-135m": _preset(
        "HuggingFaceTB/SmolLM2-135M", "llama", 30, 576, 9, 3, 1536, 49152,
        context_length=8192, tied_embeddings=True, rope_theta=100000.0, norm_eps=1e-5,
    ),
}
# fmt: on
# Other names a preset answers to, kept out of PRESETS so that every list of models (the page's, an error's) names
# each model once.
ALIASES = {"mistral-7b": "mistral-7b-v0.1"}  # the name it had before windows were modelled
