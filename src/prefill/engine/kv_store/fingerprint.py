"""The model fingerprint: what K/V depend on besides the tokens, digested so a store never serves another's.

K and V at a position are a function of the tokens up to it, the weights, the shapes and family rules
(rotary, norms, windows), the dtype the engine computes in, and what the engine stores at a position (K
before or after rotary, say). The fingerprint digests all of them; the store roots its key chain in that
digest and writes it into every block's header, so a block of another model, dtype or engine version is
never found, and one that was copied under a foreign key is rejected when read.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import xxhash

from prefill.costmodel.costs import kv_dtype_name
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput

# What the engine writes at a position: K after rotary and qk-norm, V as projected, [H_kv, d_head] per layer.
# Bump it when that changes; blocks written before then stop matching (their keys are rooted elsewhere).
ENGINE_KV_VERSION = 1
BLOCK_SIZE = 16  # tokens per stored block: the prefix cache's unit, so a pool block maps to one stored block
KV_DTYPES = ("float32", "float16", "bfloat16")  # the pool's K/V dtypes a store keeps (not q8_0: its rows are bytes)


def weights_digest(state_dict: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> str:
    """XXH3-128 (hex) of every tensor's name, dtype, shape and bytes, in name order.

    Exact and cheap: xxh3 hashes ~10 GB/s on one core, so the 0.54 GB of a 135M-parameter model in float32
    takes tens of milliseconds, a 16 GB model about two seconds, once at load.
    """
    items = state_dict.items() if isinstance(state_dict, dict) else state_dict
    h = xxhash.xxh3_128()
    for name, t in sorted(items, key=lambda kv: kv[0]):
        flat = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{flat.dtype}|{tuple(t.shape)}|".encode())
        h.update(flat.view(torch.uint8).numpy())  # the raw bytes, any dtype (bfloat16 included)
    return h.hexdigest()


@dataclass(frozen=True)
class Fingerprint:
    """Everything a stored block's K/V depend on besides its tokens.

    weights: weights_digest() of the state dict; spec: the model's shapes, windows and rotary (its name is
    left out: the same weights under another file name are the same model); kv_dtype: the dtype K/V are
    computed and stored in; engine_kv_version: ENGINE_KV_VERSION; block_size: tokens per block.
    """

    weights: str
    spec: ModelSpec
    kv_dtype: str
    engine_kv_version: int = ENGINE_KV_VERSION
    block_size: int = BLOCK_SIZE

    def __post_init__(self) -> None:
        dtype = kv_dtype_name(str(self.kv_dtype))
        if dtype not in KV_DTYPES:
            raise BadInput(
                f"a KV store holds {', '.join(KV_DTYPES)} K/V blocks, not {dtype}: drop --kv-store or store K/V at "
                "16 or 32 bits (--kv-dtype)"
            )
        object.__setattr__(self, "kv_dtype", dtype)
        if not self.weights or self.block_size < 1:
            raise BadInput("a fingerprint needs a weights digest and a block size of at least one token")

    @classmethod
    def of(cls, spec: ModelSpec, state_dict, kv_dtype: str | torch.dtype) -> Fingerprint:
        """The fingerprint of a model loaded as `state_dict` that computes K/V in `kv_dtype`."""
        return cls(weights_digest(state_dict), spec, str(kv_dtype).removeprefix("torch."))

    def describe(self) -> dict:
        """The fingerprint as plain JSON values (the spec without its name, plus its family's table entry)."""
        spec = dataclasses.asdict(self.spec)
        spec.pop("name")
        return {
            "weights": self.weights,
            "spec": spec,
            "family": dataclasses.asdict(self.spec.family),
            "kv_dtype": self.kv_dtype,
            "engine_kv_version": self.engine_kv_version,
            "block_size": self.block_size,
        }

    @functools.cached_property
    def digest(self) -> bytes:
        """16 bytes: BLAKE2b-128 of describe() as canonical JSON (sorted keys, no spaces)."""
        text = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.kv_dtype)

    def block_shape(self, n_layers: int | None = None) -> tuple[int, int, int, int, int]:
        """[n_layers, 2, H_kv, block_size, d_head] of a stored block (all L layers by default)."""
        s = self.spec
        return (s.L if n_layers is None else n_layers, 2, s.H_kv, self.block_size, s.d_head)
