"""Keys of stored blocks: a hash chain over the 16-token blocks, rooted in the model's fingerprint.

K/V of a block depend on every token before it, so a block's key must too: key_i = BLAKE2b-256(key_{i-1} ||
tokens of block i as little-endian uint32), key_{-1} = the root. The same 16 tokens after a different prefix
get a different key (LMCache and vLLM's prefix caching chain their block hashes the same way). The root is
the fingerprint's digest and the store format's version, so another model's or another format's blocks
are simply never found. A cryptographic hash because a collision would serve wrong K/V silently.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from prefill.errors import BadInput

KEY_BYTES = 32
_MAX_TOKEN = 2**32 - 1  # ids are stored as uint32: every vocabulary we load is far smaller


@dataclass(frozen=True, slots=True)
class BlockKey:
    """Block `index` of a token chain: its key (`digest`) and its own `block_size` tokens."""

    digest: bytes
    index: int
    tokens: tuple[int, ...]


def chain_root(fingerprint_digest: bytes, format_version: int) -> bytes:
    """The key before the first block: the fingerprint digest and the format version, hashed."""
    seed = b"prefill-kv-root" + fingerprint_digest + struct.pack("<H", format_version)
    return hashlib.blake2b(seed, digest_size=KEY_BYTES).digest()


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 (what keys hash and block headers hold); BadInput if out of range."""
    if any(not 0 <= t <= _MAX_TOKEN for t in tokens):
        raise BadInput(f"token ids must lie in 0..{_MAX_TOKEN}")
    return struct.pack(f"<{len(tokens)}I", *tokens)


def block_keys(root: bytes, token_ids: Sequence[int], block_size: int) -> list[BlockKey]:
    """One key per whole block of `token_ids` (a trailing partial block has none)."""
    keys, prev = [], root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        tokens = tuple(int(t) for t in token_ids[start : start + block_size])
        prev = hashlib.blake2b(prev + token_bytes(tokens), digest_size=KEY_BYTES).digest()
        keys.append(BlockKey(prev, start // block_size, tokens))
    return keys


def layers_needed(windows: Sequence[int | None], block: int, end: int, block_size: int) -> frozenset[int]:
    """Layers whose K/V of block `block` a continuation from position `end` can still read.

    The query at `end` sees positions end - W + 1 .. end in a layer with a window of W, and later queries
    see later ones; so a windowed layer needs the block only when its last position is at least
    end - W + 1. A full-attention layer (window None) always needs it.
    """
    last = (block + 1) * block_size - 1
    return frozenset(layer for layer, w in enumerate(windows) if w is None or last >= end - w + 1)
