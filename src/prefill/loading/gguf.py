"""GGUF weights: read with the `gguf` package, dequantized, renamed to Hugging Face names.

llama.cpp's converter stores Q and K rows of Llama-architecture models in the interleaved-pair rotary order
(it permutes each head's rows so that pairs (0,1), (2,3), ... rotate together). We undo that permutation so
one rotary implementation (the half-split one of the reference) serves every file.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

import numpy as np
import torch

from prefill.costmodel.families import Family, family_of
from prefill.costmodel.specs import ModelSpec
from prefill.errors import ModelFileError

DENSE_TYPES = ("F32", "F16", "BF16")  # stored as floats: read as they are, nothing to decode
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str, family: Family | None = None) -> str | None:
    """The Hugging Face name of a GGUF tensor of `family` (default Llama), or None for tensors the model does
    not use (rope_freqs)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = (family or family_of("llama")).gguf_layer_names
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}"
    return None


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of Q or K rows [n_heads * d_head, ...] (weights or biases)."""
    d_head = w.shape[0] // n_heads
    return w.reshape(n_heads, d_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf_state_dict(
    reader,
    spec: ModelSpec,
    dtype: torch.dtype,
    progress: Callable[[int, int], None] | None = None,
    native: bool = False,
) -> dict:
    """Every tensor of an open GGUF file, named as in a Hugging Face checkpoint: dequantized to `dtype`, or with
    `native`, the matrices whose type has a kernel (prefill.model.quant.KERNEL_TYPES) kept as their blocks, and
    the quantized ones of other types dequantized once here, said in one line (stderr)."""
    from gguf.quants import dequantize

    family = spec.family
    tensors = reader.tensors
    sd: dict = {}
    decoded: dict[str, int] = {}  # native: quantized matrices without a kernel, by type
    for i, t in enumerate(tensors):
        name = hf_name(t.name, family)
        if name is not None and native and len(t.shape) == 2 and t.tensor_type.name in _kernel_types():
            sd[name] = _blocks(t, spec, family)
        elif name is not None:
            if native and len(t.shape) == 2 and t.tensor_type.name not in DENSE_TYPES:
                decoded[t.tensor_type.name] = decoded.get(t.tensor_type.name, 0) + 1
            try:
                w = np.array(
                    dequantize(t.data, t.tensor_type), dtype=np.float32
                )  # a copy: the file is mapped read-only
            except Exception as e:
                raise ModelFileError(f"cannot dequantize {t.name} ({t.tensor_type.name}): {e}") from None
            # GGUF lists dims innermost first; numpy data is already [out, in].
            w = w.reshape([int(d) for d in reversed(t.shape.tolist())])
            if family.gguf_permuted_qk and (".attn_q." in t.name or ".attn_k." in t.name):
                w = unpermute_qk(w, spec.H_q if ".attn_q." in t.name else spec.H_kv)
            if family.norm_plus_one and t.name.endswith("norm.weight"):
                w -= 1.0  # llama.cpp stores Gemma's 1 + w; Hugging Face checkpoints hold w
            sd[name] = torch.from_numpy(w).to(dtype)
        if progress:
            progress(i + 1, len(tensors))
    if decoded:
        which = ", ".join(f"{n} {t}" for t, n in decoded.items())
        print(f"weights: no kernel here for {which} matrices: dequantized to float32 at load", file=sys.stderr)
    return sd


def _kernel_types() -> tuple[str, ...]:
    from prefill.model.quant import KERNEL_TYPES

    return KERNEL_TYPES


def _blocks(t, spec: ModelSpec, family: Family):
    """A quantized GGUF matrix as a QuantWeight: its rows of blocks copied out of the mapped file, Q/K rows
    put back in the half-split rotary order (whole rows move, so no weight is decoded)."""
    from prefill.machine.probe import give_blocks
    from prefill.model.quant import QuantWeight

    K, N = (int(d) for d in t.shape.tolist())  # GGUF lists dims innermost first
    give_blocks(t.tensor_type.name, t.data)  # real blocks for the probe, where gguf-py cannot make the type
    blocks = torch.from_numpy(np.array(t.data).reshape(N, -1))  # uint8 [N, row_bytes], a copy
    w = QuantWeight(blocks, t.tensor_type.name, N, K)
    if family.gguf_permuted_qk and (".attn_q." in t.name or ".attn_k." in t.name):
        order = unpermute_qk(np.arange(N), spec.H_q if ".attn_q." in t.name else spec.H_kv)
        w = w.permute_rows(torch.from_numpy(order))
    return w
