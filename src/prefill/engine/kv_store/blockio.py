"""One block between tensors and files: KVBlock (K and V of the layers it holds), reading one back verified
(`read_block`), whether a stored file already holds some layers (`holds`), and a block's bytes for writing."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from prefill.engine.kv_store.files import BlockFiles
from prefill.engine.kv_store.fingerprint import Fingerprint
from prefill.engine.kv_store.format import BlockError, decode_payload, parse_header
from prefill.engine.kv_store.keys import BlockKey


@dataclass(frozen=True)
class KVBlock:
    """K and V of one block for the layers it holds."""

    kv: torch.Tensor  # [n_layers, 2, H_kv, block_size, d_head]: K then V of each stored layer
    layers: tuple[int, ...]  # the model layers of kv's rows, ascending


def read_block(
    files: BlockFiles, fp: Fingerprint, key: BlockKey, into: memoryview | None = None
) -> tuple[KVBlock, int] | None:
    """Block `key` read whole (into `into` when it fits) and verified, with its file's size in bytes; None when
    there is no file; BlockError (the reason) when it must not be used."""
    try:
        buf = files.read(key.digest, into)
    except OSError as e:
        raise BlockError(f"unreadable: {e.strerror or e}") from None
    if buf is None:
        return None
    header = parse_header(buf, len(buf), fp, key)
    return KVBlock(decode_payload(buf, header, fp), header.layers), len(buf)


def holds(peeked: tuple[bytes, int], fp: Fingerprint, key: BlockKey, layers: tuple[int, ...]) -> bool:
    """Whether a stored file (its first bytes, its size) is a sound header of `key` with at least `layers`."""
    try:
        return set(layers) <= set(parse_header(peeked[0], peeked[1], fp, key).layers)
    except BlockError:
        return False


def merged(files: BlockFiles, fp: Fingerprint, key: BlockKey, block: KVBlock) -> KVBlock:
    """`block` with the layers of the stored file of `key` that it lacks (the file's K/V: the same tokens
    give the same K/V); `block` alone when the file is unsound. Stacked by numpy, as _bytes_of copies: this
    runs on the writer thread."""
    try:
        got = read_block(files, fp, key)
    except BlockError:
        return block
    if got is None:
        return block
    stored = got[0]
    rows = {layer: stored.kv[i] for i, layer in enumerate(stored.layers)}
    rows.update((layer, block.kv[i]) for i, layer in enumerate(block.layers))
    layers, ints = tuple(sorted(rows)), SAME_SIZE_INT[block.kv.element_size()]
    kv = np.stack([rows[layer].cpu().view(ints).numpy() for layer in layers])  # [n_layers, 2, H_kv, bs, d]
    return KVBlock(torch.from_numpy(kv).view(block.kv.dtype), layers)


SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bytes_of(kv: torch.Tensor) -> memoryview:
    """The bytes of `kv` (any strides, any device) in C order, made contiguous by numpy on the writer thread: a
    torch copy here would open a second OpenMP team beside the engine's, whose threads spin between the writer's
    copies on the cores the engine computes on (measured on a 2-core Zen 3: 0.7 of a core for a 1.5 MB copy every
    10 ms). Integers of the element's width stand in for it: numpy has no bfloat16."""
    flat = kv.detach().cpu().view(SAME_SIZE_INT[kv.element_size()]).numpy()
    return memoryview(np.ascontiguousarray(flat).reshape(-1).view(np.uint8))
