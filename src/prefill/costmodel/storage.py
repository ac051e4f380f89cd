"""Bytes per weight of every storage a model's weights can have: dense dtypes and GGUF's block formats.

A GGUF block holds `block` weights in `bytes` bytes (scales included): Q4_1 keeps 32 weights in 20 bytes (an
f16 scale d, an f16 offset m, 32 nibbles), 5.0 bits a weight, 0.625 bytes. A decode step reads every projection
weight and the unembedding once, so these bytes (not the FLOPs) set its floor: bytes / memory bandwidth.
No torch here: the calculator, the page and the time model read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefill.costmodel.costs import canonical_dtype, dtype_bytes, kv_cache_bytes_for
from prefill.errors import BadInput

if TYPE_CHECKING:
    from prefill.costmodel.specs import ModelSpec

# type: (weights per block, bytes per block), as ggml lays them out (ggml-common.h).
GGUF_BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q8_0": (32, 34),  # f16 d, 32 int8
    "Q5_0": (32, 22),  # f16 d, 4 bytes of fifth bits, 16 bytes of nibbles
    "Q5_1": (32, 24),  # f16 d, f16 m, 4 + 16 bytes
    "Q4_0": (32, 18),  # f16 d, 16 bytes of nibbles
    "Q4_1": (32, 20),  # f16 d, f16 m, 16 bytes of nibbles
    "Q2_K": (256, 84),  # 16 bytes of 4-bit scales and mins, 64 bytes of 2-bit weights, f16 d and dmin
    "Q3_K": (256, 110),  # 32 bytes of high bits, 64 of 2-bit weights, 12 of scales, f16 d
    "Q4_K": (256, 144),  # f16 d and dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
    "Q5_K": (256, 176),  # as Q4_K plus 32 bytes of fifth bits
    "Q6_K": (256, 210),  # 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, f16 d
    "Q8_K": (256, 292),  # f32 d, 256 int8, 16 int16 block sums
}
# ggml's type numbers (the GGUF file's tensor type field).
# The formatter is off for this table alone: it reads better aligned.
# fmt: off
GGUF_TYPE_IDS: dict[str, int] = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
                                 "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15,
                                 "BF16": 30}
# fmt: on
GGUF_BYTES_PER_WEIGHT: dict[str, float] = {t: nbytes / n for t, (n, nbytes) in GGUF_BLOCKS.items()}


def bytes_per_weight(storage: str) -> float:
    """Bytes one weight takes stored as `storage`: a GGUF type ("Q4_1": 0.625) or a dtype ("bfloat16": 2)."""
    if storage.upper() in GGUF_BYTES_PER_WEIGHT:
        return GGUF_BYTES_PER_WEIGHT[storage.upper()]
    try:
        return float(dtype_bytes(canonical_dtype(storage)))
    except BadInput:
        known = ", ".join(GGUF_BLOCKS)
        raise BadInput(
            f"unknown weight storage {storage!r}: a dtype (float32, bfloat16, ...) or one of {known}"
        ) from None


def projection_params(spec: ModelSpec) -> int:
    """Weights of every layer's Q/K/V/O projections and MLP matrices: the ones a quantized file stores in blocks."""
    q, kv = spec.H_q * spec.d_head, spec.H_kv * spec.d_head
    return spec.L * (spec.d_model * (q + 2 * kv) + q * spec.d_model + 3 * spec.d_model * spec.d_ff)


def weight_bytes(spec: ModelSpec, storage: str, embedding: str | None = None) -> int:
    """Bytes of all of `spec`'s weights with the projections in `storage` and the embedding (and an untied
    unembedding) in `embedding` (default: `storage`). Norms and biases stay float32 in a GGUF file; with a dense
    dtype everything is in that dtype. SmolLM2-135M at Q4_1 with a Q8_0 embedding: 96.6 MB (538 MB in float32)."""
    proj = projection_params(spec)
    rest = spec.N - proj - spec.embedding_params
    rest_bpw = 4.0 if storage.upper() in GGUF_BLOCKS else bytes_per_weight(storage)
    emb_bpw = bytes_per_weight(embedding or storage)
    return round(proj * bytes_per_weight(storage) + spec.embedding_params * emb_bpw + rest * rest_bpw)


def decode_weight_bytes(spec: ModelSpec, storage: str, embedding: str | None = None) -> int:
    """Weight bytes one decode step reads: every projection, the final and per-layer norms, and the unembedding
    (the embedding matrix when tied); the embedding lookup reads one row, counted as nothing."""
    unembedding = spec.vocab_size * spec.d_model
    untouched = unembedding if not spec.tied_embeddings else 0  # the untied input embedding: one row per step
    return weight_bytes(spec, storage, embedding) - round(untouched * bytes_per_weight(embedding or storage))


def decode_step_bytes(spec: ModelSpec, storage: str, embedding: str | None, context: int, kv_bytes: float) -> int:
    """Bytes one decode step of one sequence reads at `context` tokens: the weights as stored
    (decode_weight_bytes) and every layer's K and V so far at `kv_bytes` per element (4 for float32)."""
    return decode_weight_bytes(spec, storage, embedding) + kv_cache_bytes_for(spec, context, kv_bytes)


def gguf_file_storage(path) -> tuple[str, str]:
    """(the projections' type, the token embedding's type) of a GGUF file, from its tensor list alone:
    ("Q4_1", "Q8_0") for the embedded SmolLM2. The projections' type is the commonest among the blocks'
    matrices (Q4_K_M files mix in a few Q6_K)."""
    from collections import Counter

    from prefill.costmodel.gguf_file import open_gguf

    tensors = open_gguf(path).tensors
    counts = Counter(t.tensor_type.name for t in tensors if t.name.startswith("blk.") and len(t.shape) == 2)
    if not counts:
        raise BadInput(f"{path}: no weight matrices in this GGUF file")
    proj = counts.most_common(1)[0][0]
    return proj, next((t.tensor_type.name for t in tensors if t.name == "token_embd.weight"), proj)
