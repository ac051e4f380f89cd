"""The cost model's formulas: FLOPs, seconds, KV-cache bytes, TTFT (intensity and the roofline: roofline.py;
tensor parallelism: parallel.py).

Pure arithmetic on numbers and a `ModelSpec`; no torch. Everything else in the package (engine, bench,
server, command line) reports what these functions predict instead of re-deriving a count inline.

Names: N parameters, P prompt tokens (new tokens of this prefill), B sequences, L layers, H_q query heads,
H_kv key/value heads, d_head head width, d_model hidden width, T tensor-parallel GPUs, b bytes per element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefill.costmodel.causal import causal_pairs
from prefill.errors import BadInput

if TYPE_CHECKING:
    from prefill.costmodel.specs import ModelSpec

MIB = 2**20  # bytes in a mebibyte
MB = 10**6  # bytes in a megabyte

_DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "fp8": "fp8",
    "float8": "fp8",
    "int8": "int8",
}
# FP4 weights: E2M1 values with their block scales. NVFP4: an FP8 E4M3 scale per 16 values, 4.5 bits (NVIDIA blog
# "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025-06; a per-tensor FP32 scale besides);
# MXFP4: an E8M0 scale per 32 values, 4.25 bits (OCP Microscaling Formats (MX) Specification v1.0, 2023-09).
FP4_WEIGHTS = {"nvfp4": (16, 9), "mxfp4": (32, 17)}  # format: (values per block, bytes per block, scale included)
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}
_DTYPE_BYTES.update({name: nbytes / n for name, (n, nbytes) in FP4_WEIGHTS.items()})
_DTYPE_ALIASES.update({name: name for name in FP4_WEIGHTS})


# ---- checks ------------------------------------------------------------------------------------------


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def _positive(name: str, value: float) -> float:
    if _finite(name, value) <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _non_negative(name: str, value: float) -> float:
    if _finite(name, value) < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def _utilization(value: float) -> float:
    _finite("utilization", value)
    if not 0 < value <= 1:
        raise ValueError(f"utilization (MFU) must be in (0, 1], got {value!r}; 50% is 0.5")
    return value


# ---- dtypes ------------------------------------------------------------------------------------------


def canonical_dtype(dtype: str) -> str:
    """The canonical name of a dtype alias: "bf16" -> "bfloat16", "fp32" -> "float32"; BadInput if unknown."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_ALIASES:
        raise BadInput(f"unknown dtype {dtype!r}; use one of float32, bfloat16, float16, fp8, int8, nvfp4, mxfp4")
    return _DTYPE_ALIASES[key]


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of `dtype`: float32 4, bfloat16/float16 2, fp8/int8 1, nvfp4 0.5625, mxfp4 0.53125."""
    return _DTYPE_BYTES[canonical_dtype(dtype)]


# What the engine's KV pool stores K/V as. q8_0 is llama.cpp's block_q8_0 (its --cache-type-k/-v q8_0): per
# Q8_0_BLOCK values along d_head, one float16 scale and Q8_0_BLOCK int8s.
KV_DTYPES = ("float32", "bfloat16", "float16", "q8_0")
Q8_0_BLOCK = 32


def cache_dtype(dtype: str) -> str:
    """The canonical name of a KV-cache dtype: canonical_dtype's, or q8_0; BadInput if unknown."""
    key = str(dtype).lower().removeprefix("torch.")
    return "q8_0" if key in ("q8_0", "q8") else canonical_dtype(key)


def kv_dtype_name(kv_dtype: str) -> str:
    """The canonical name of a dtype the engine's KV pool stores K/V as ("bf16" -> "bfloat16", "q8_0");
    BadInput for any other."""
    try:
        name = cache_dtype(kv_dtype)
    except BadInput:
        name = None
    if name not in KV_DTYPES:
        raise BadInput(f"unknown K/V dtype {kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")
    return name


def kv_bytes_per_element(kv_dtype: str) -> float:
    """b of the KV formulas, bytes per stored K or V value: float32 4, bfloat16/float16 2, fp8/int8 1 (a GPU
    engine's cache), q8_0 34 / 32 (a float16 scale and 32 int8s per 32 values)."""
    name = cache_dtype(kv_dtype)
    return (2 + Q8_0_BLOCK) / Q8_0_BLOCK if name == "q8_0" else float(_DTYPE_BYTES[name])


# ---- FLOPs and seconds -------------------------------------------------------------------------------


def prefill_flops(N: float, P: float) -> float:
    """The rule of thumb: 2 * N * P FLOPs (one multiply-add per parameter per prompt token)."""
    return 2 * N * P


def achieved_flops_per_s(flops_per_sec: float, utilization: float = 1.0) -> float:
    """FLOP/s actually reached: the peak `flops_per_sec` times the fraction `utilization` (MFU) achieved."""
    return _positive("flops_per_sec", flops_per_sec) * _utilization(utilization)


def compute_seconds(flops: float, flops_per_sec: float, utilization: float = 1.0) -> float:
    """Seconds to do `flops` FLOPs at `flops_per_sec` peak FLOP/s achieved at fraction `utilization` (MFU)."""
    _non_negative("flops", flops)
    return flops / achieved_flops_per_s(flops_per_sec, utilization)


def prefill_seconds(N: float, P: float, flops_per_sec: float, utilization: float = 1.0) -> float:
    """Seconds of prefill compute: prefill_flops(N, P) / (flops_per_sec * utilization).

    ValueError unless 0 < utilization <= 1, N > 0, P >= 0, flops_per_sec > 0, all finite.
    """
    _positive("N", N)
    _non_negative("P", P)
    return compute_seconds(prefill_flops(N, P), flops_per_sec, utilization)


def mfu(flops: float, seconds: float, peak_flops_per_sec: float) -> float:
    """Model FLOPs utilization: achieved FLOP/s (flops / seconds) as a fraction of the peak."""
    _non_negative("flops", flops)
    _positive("seconds", seconds)
    _positive("peak_flops_per_sec", peak_flops_per_sec)
    return flops / seconds / peak_flops_per_sec


@dataclass(frozen=True)
class FlopCount:
    """Exact matmul FLOPs of one prefill, split by where they are spent.

    linear: Q/K/V/O projections and the gated MLP (every non-embedding parameter, one multiply-add per token);
    attention: QK^T scores and the weighted sum of V over the causal pairs; unembed: the logits of the last
    position only.
    """

    linear: float
    attention: float
    unembed: float

    @property
    def total(self) -> float:
        """All FLOPs of the prefill."""
        return self.linear + self.attention + self.unembed

    @property
    def unembed_share(self) -> float:
        """The unembedding's fraction of all FLOPs (0 for an empty count)."""
        return self.unembed / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, float]:
        """The three parts and their total, as JSON prints them."""
        return {"linear": self.linear, "attention": self.attention, "unembed": self.unembed, "total": self.total}


def _window_prefix_pairs(n: int, window: int | None) -> int:
    """Pairs attended by positions 0..n-1 when each position t sees min(t + 1, W) keys (W None: t + 1)."""
    if window is None or n <= window:
        return causal_pairs(n)
    return causal_pairs(window) + (n - window) * window  # the triangle, then a band W wide


def attended_pairs(P: int, past: int = 0, window: int | None = None) -> int:
    """(query, key) pairs a prefill of P new tokens after `past` cached ones attends in one layer.

    Full attention (window None): P*past + P(P+1)/2. With a sliding window of W tokens the new position t
    (past <= t < past + P) sees min(t + 1, W) keys: the causal triangle until W, then a band W wide.
    """
    _non_negative("P", P)
    _non_negative("past", past)
    return _window_prefix_pairs(past + P, window) - _window_prefix_pairs(past, window)


def prefill_flops_exact(spec: ModelSpec, P: int, past: int = 0, B: int = 1) -> FlopCount:
    """Exact matmul FLOPs of a prefill of P new tokens after `past` cached tokens, for B sequences.

    linear = 2 * N_non_embedding * P * B; attention = sum over layers of 4 * H_q * d_head * B * pairs_l
    (2 FLOPs per multiply-add, twice: QK^T and AV) where pairs_l = attended_pairs(P, past, W_l): the causal
    triangle P*past + P(P+1)/2 in a full-attention layer, not P^2, and the band in a windowed one;
    unembed = 2 * d_model * vocab * B (logits of the last position only, not all P).
    """
    _positive("B", B)
    pairs = sum(attended_pairs(P, past, w) for w in spec.windows)
    return FlopCount(
        linear=2 * spec.N_non_embedding * P * B,
        attention=4 * spec.H_q * spec.d_head * B * pairs,
        unembed=2 * spec.d_model * spec.vocab_size * B if P > 0 else 0,
    )


def scoring_flops_exact(spec: ModelSpec, P: int, past: int = 0, B: int = 1, unembedded: int | None = None) -> FlopCount:
    """Exact matmul FLOPs of a scoring prefill: prefill_flops_exact, but the unembedding runs over `unembedded`
    positions (default all P: each position's logits give the log-probability of the next token) instead of the
    last one: unembed = 2 * d_model * vocab * B * unembedded. The log-softmax (a few FLOPs per logit, not a
    matmul) is not counted, like the norms and activations elsewhere."""
    n = P if unembedded is None else unembedded
    if not 0 <= n <= P:
        raise ValueError(f"unembedded positions must lie in [0, P={P}], got {n!r}")
    count = prefill_flops_exact(spec, P, past, B)
    return FlopCount(count.linear, count.attention, 2 * spec.d_model * spec.vocab_size * B * n)


# ---- KV cache ----------------------------------------------------------------------------------------


def prefill_chunks(P: int, chunk_size: int | None, start: int = 0) -> list[tuple[int, int]]:
    """The spans [start, end) in which a prefill of positions start..P-1 runs: chunks of `chunk_size` tokens (the
    last one shorter), or one span when chunk_size is None. Each chunk attends to every position before it."""
    step = chunk_size or max(1, P - start)
    return [(s, min(P, s + step)) for s in range(start, P, step)]


def kv_cache_bytes(L: int, H_kv: int, d_head: int, P: int, bytes_per_element: float, B: int = 1) -> int:
    """Bytes of the K and V caches after P tokens: 2 * L * B * H_kv * P * d_head * bytes_per_element."""
    for name, value in (
        ("L", L),
        ("H_kv", H_kv),
        ("d_head", d_head),
        ("bytes_per_element", bytes_per_element),
    ):
        _positive(name, value)
    _non_negative("P", P)
    _positive("B", B)
    return int(2 * L * B * H_kv * P * d_head * bytes_per_element)


def cached_positions(spec: ModelSpec, P: int) -> int:
    """Positions held over all layers after P tokens: sum of min(P, W_l); a windowed layer keeps only its
    last W_l, a full-attention layer all P (L * P for a model without windows)."""
    _non_negative("P", P)
    return sum(P if w is None else min(P, w) for w in spec.windows)


def kv_cache_bytes_for(spec: ModelSpec, P: int, bytes_per_element: float, B: int = 1, H_kv: int | None = None) -> int:
    """Bytes of the K and V caches of `spec` after P tokens: sum over layers of
    2 * B * H_kv * min(P, W_l) * d_head * b (2 * L * B * H_kv * P * d_head * b without windows).
    `H_kv`: the KV heads held (fewer on one tensor-parallel GPU); default all of them."""
    return kv_cache_bytes(1, H_kv or spec.H_kv, spec.d_head, cached_positions(spec, P), bytes_per_element, B)


def kv_window_start(P: int, window: int, block_size: int = 16) -> int:
    """The first position a layer with a window of W holds after P tokens in a block pool: the start of the
    block holding position q - W + 1, q = min(P - 1, P // block_size * block_size). The next query, at P,
    reads P - W + 1 .. P; a continuation of a stored copy of the cache restarts at q (it loads whole blocks,
    and a repeated prompt recomputes its last token), so the blocks q reads are kept too: at most one more.
    The blocks wholly before it are given back."""
    q = min(P - 1, P // block_size * block_size)
    return max(0, q - window + 1) // block_size * block_size


def kv_positions_held(spec: ModelSpec, P: int, block_size: int = 16) -> int:
    """Positions an engine with a block pool holds over all layers after P tokens: all P in a full-attention
    layer; in a windowed layer, from kv_window_start on (whole blocks at the low end)."""
    _non_negative("P", P)
    return sum(P if w is None else P - kv_window_start(P, w, block_size) for w in spec.windows)


def kv_cache_bytes_held(spec: ModelSpec, P: int, bytes_per_element: float, block_size: int = 16, B: int = 1) -> int:
    """Bytes of K and V an engine with a block pool holds for P tokens (kv_positions_held): the window-aware
    formula of what is physically kept, which equals kv_cache_bytes_for without windows."""
    return kv_cache_bytes(1, spec.H_kv, spec.d_head, kv_positions_held(spec, P, block_size), bytes_per_element, B)


def max_context_tokens_for(spec: ModelSpec, memory_bytes: float, bytes_per_element: int, B: int = 1) -> int | None:
    """The longest context (tokens per sequence) whose KV cache of `spec` fits `memory_bytes`; None when every
    layer is windowed and the largest window fits (the cache stops growing: any length fits).
    Without windows: memory_bytes // kv_cache_bytes_for(spec, 1, ...), as max_context_tokens."""
    _non_negative("memory_bytes", memory_bytes)

    def fits(P: int) -> bool:
        return kv_cache_bytes_for(spec, P, bytes_per_element, B) <= memory_bytes

    if None not in spec.windows and fits(max(spec.windows)):
        return None
    hi = 1
    while fits(hi):
        hi *= 2
    lo = hi // 2  # fits(lo), or lo == 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def max_context_tokens(memory_bytes: float, bytes_per_token: int) -> int:
    """The longest context (tokens per sequence) whose KV cache fits `memory_bytes`, at `bytes_per_token`.

    bytes_per_token is kv_cache_bytes(..., P=1, ...) for the batch in question.
    """
    _non_negative("memory_bytes", memory_bytes)
    _positive("bytes_per_token", bytes_per_token)
    return int(memory_bytes // bytes_per_token)


def bytes_to_mib(n_bytes: float) -> float:
    """Bytes in mebibytes (2^20 bytes)."""
    return n_bytes / MIB


def bytes_to_mb(n_bytes: float) -> float:
    """Bytes in megabytes (10^6 bytes)."""
    return n_bytes / MB


def format_bytes(n_bytes: int) -> str:
    """Bytes three ways, as the lesson writes them: '268,435,456 B = 256.0 MiB = 268.4 MB'."""
    return f"{n_bytes:,} B = {bytes_to_mib(n_bytes):,.1f} MiB = {bytes_to_mb(n_bytes):,.1f} MB"


# ---- request timing ----------------------------------------------------------------------------------


def ttft_seconds(prefill_s: float, network_s: float = 0.0, tokenize_s: float = 0.0) -> float:
    """Time to first token (seconds): network latency + tokenization + prefill compute."""
    for name, value in (("prefill_s", prefill_s), ("network_s", network_s), ("tokenize_s", tokenize_s)):
        _non_negative(name, value)
    return network_s + tokenize_s + prefill_s


def request_seconds(ttft_s: float, n_out: int, itl_s: float) -> float:
    """Seconds of a whole request of n_out output tokens: TTFT + (n_out - 1) * ITL."""
    _non_negative("ttft_s", ttft_s)
    _non_negative("itl_s", itl_s)
    if _finite("n_out", n_out) < 1:
        raise ValueError(f"n_out must be >= 1, got {n_out!r}")
    return ttft_s + (n_out - 1) * itl_s


def decode_rate(itl_s: float) -> float:
    """Steady decode rate (tokens/s): 1 / ITL."""
    return 1 / _positive("itl_s", itl_s)


def request_output_rate(n_out: int, total_s: float) -> float:
    """Output rate of a whole request (tokens/s): n_out / total seconds, TTFT included."""
    _non_negative("n_out", n_out)
    return n_out / _positive("total_s", total_s)


# ---- calibration -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """Measured rates of this machine for one dtype and thread count (from the benchmark).

    overhead_s: fixed seconds per prefill; linear_flops_per_s: rate of the projection and MLP matmuls
    (also used for the unembedding); attention_flops_per_s: rate of the attention matmuls.
    """

    overhead_s: float
    linear_flops_per_s: float
    attention_flops_per_s: float
    dtype: str
    threads: int
    source: str


def calibrated_prefill_seconds(count: FlopCount, cal: Calibration) -> float:
    """Predicted prefill seconds from measured rates:
    overhead + (linear + unembed) / linear rate + attention / attention rate."""
    _non_negative("overhead_s", cal.overhead_s)
    linear_s = (count.linear + count.unembed) / _positive("linear_flops_per_s", cal.linear_flops_per_s)
    return cal.overhead_s + linear_s + count.attention / _positive("attention_flops_per_s", cal.attention_flops_per_s)
