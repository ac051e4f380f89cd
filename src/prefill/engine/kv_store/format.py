"""One stored block as bytes: a self-describing header, then K and V of the layers it holds.

The layout (docs/kv-store-format.md is the reference; all integers little-endian):

    header  fixed part (_FIXED): magic, version, header size, dtype, shapes, fingerprint, key, block index,
            payload size, payload checksum; then the stored layers (uint16 each), the block's tokens (uint32
            each), zero padding, and the header's own XXH3-64 in its last 8 bytes; header size is a multiple
            of 64 so the payload is aligned for any dtype
    payload [n_layers, 2, H_kv, block_size, d_head] in the header's dtype, C order (layer, K/V, head, token)

A reader checks everything it can before trusting a byte: magic and version first (they never move), then
the header's checksum, then that the block is the one asked for (fingerprint, key, index, shapes), then the
file's size (a truncated file is caught here), then the payload's checksum. Any failure is a BlockError
whose message is the one-line reason.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch
import xxhash

from prefill.costmodel.costs import dtype_bytes, kv_cache_bytes
from prefill.engine.kv_store.fingerprint import Fingerprint
from prefill.engine.kv_store.keys import BlockKey, token_bytes

MAGIC = b"PFKVBLK\x00"
FORMAT_VERSION = 1
DTYPE_CODES = {"float32": 1, "float16": 2, "bfloat16": 3}
# magic, version, header_bytes, dtype, reserved, block_size, L, n_layers, H_kv, d_head, fingerprint, key,
# block index, payload_bytes, payload XXH3-64
_FIXED = struct.Struct("<8sHHBBHHHHH16s32sIQQ")
_ALIGN = 64
PEEK_BYTES = 4096  # a first read this long holds the whole header of any model we run (L <= 1,000)


class BlockError(Exception):
    """A stored block that must not be used; the message says why, in one line."""


@dataclass(frozen=True)
class Header:
    """A parsed, checked header: what the payload holds and how to verify it."""

    layers: tuple[int, ...]  # model layers in the payload, ascending
    header_bytes: int
    payload_bytes: int
    payload_checksum: int


def header_size(n_layers: int, block_size: int) -> int:
    """Bytes of a header: the fixed part, layers, tokens and the checksum, rounded up to 64."""
    raw = _FIXED.size + 2 * n_layers + 4 * block_size + 8
    return -(-raw // _ALIGN) * _ALIGN


def payload_size(fp: Fingerprint, n_layers: int) -> int:
    """Bytes of K and V of `n_layers` layers for one block of fp.block_size tokens."""
    return kv_cache_bytes(n_layers, fp.spec.H_kv, fp.spec.d_head, fp.block_size, dtype_bytes(fp.kv_dtype))


def file_size(fp: Fingerprint, n_layers: int) -> int:
    """Bytes of a block file holding `n_layers` layers: its header and its payload."""
    return header_size(n_layers, fp.block_size) + payload_size(fp, n_layers)


def encode_header(fp: Fingerprint, key: BlockKey, layers: tuple[int, ...], payload: memoryview) -> bytes:
    """The header of block `key` holding `payload` (the K/V bytes of `layers`, in order)."""
    n, hb = len(layers), header_size(len(layers), fp.block_size)
    s, code, check = fp.spec, DTYPE_CODES[fp.kv_dtype], xxhash.xxh3_64_intdigest(payload)
    shapes = (fp.block_size, s.L, n, s.H_kv, s.d_head)
    fixed = _FIXED.pack(
        MAGIC, FORMAT_VERSION, hb, code, 0, *shapes, fp.digest, key.digest, key.index, payload.nbytes, check
    )
    body = fixed + struct.pack(f"<{n}H", *layers) + token_bytes(key.tokens)
    body += bytes(hb - 8 - len(body))
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def parse_header(buf: bytes | bytearray | memoryview, file_size: int, fp: Fingerprint, key: BlockKey) -> Header:
    """Check the header at the start of `buf` (a file of `file_size` bytes) against the block `key`."""
    if len(buf) < _FIXED.size:
        raise BlockError(f"truncated: {file_size} bytes, a header alone is at least {_FIXED.size}")
    fields = _FIXED.unpack_from(buf)
    magic, version, hb, code, _, bs, L, n, H_kv, d_head, f_digest, f_key, f_index, nbytes, check = fields
    if magic != MAGIC:
        raise BlockError("not a prefill KV block (bad magic)")
    if version != FORMAT_VERSION:
        raise BlockError(f"format version {version}; this engine reads version {FORMAT_VERSION}")
    if hb > len(buf) or hb != header_size(n, bs):
        raise BlockError(f"truncated or damaged header ({len(buf)} of {hb} bytes read)")
    if xxhash.xxh3_64_intdigest(memoryview(buf)[: hb - 8]) != struct.unpack_from("<Q", buf, hb - 8)[0]:
        raise BlockError("header checksum mismatch")
    if f_digest != fp.digest:
        raise BlockError("written by another model, dtype or engine version (fingerprint mismatch)")
    if f_key != key.digest or f_index != key.index:
        raise BlockError(f"holds block {f_index} of another token chain, not block {key.index} of this one")
    want = (DTYPE_CODES[fp.kv_dtype], fp.block_size, fp.spec.L, fp.spec.H_kv, fp.spec.d_head)
    if (code, bs, L, H_kv, d_head) != want:
        raise BlockError(f"shape or dtype (code {code}, {L}x{H_kv}x{bs}x{d_head}) differs from the model's")
    layers = struct.unpack_from(f"<{n}H", buf, _FIXED.size)
    if n == 0 or list(layers) != sorted(set(layers)) or layers[-1] >= L or nbytes != payload_size(fp, n):
        raise BlockError("layer list or payload size inconsistent with the shapes")
    if file_size != hb + nbytes:
        raise BlockError(f"truncated: {file_size} bytes, the header says {hb + nbytes}")
    if struct.unpack_from(f"<{bs}I", buf, _FIXED.size + 2 * n) != key.tokens:
        raise BlockError("its tokens differ from the block asked for")
    return Header(tuple(layers), hb, nbytes, check)


def decode_payload(buf: bytearray | memoryview, header: Header, fp: Fingerprint) -> torch.Tensor:
    """The payload of a whole file read into `buf` (writable), checksum verified, as a tensor sharing its memory:
    [n_layers, 2, H_kv, block_size, d_head]."""
    payload = memoryview(buf)[header.header_bytes :]
    if xxhash.xxh3_64_intdigest(payload) != header.payload_checksum:
        raise BlockError("payload checksum mismatch")
    flat = torch.frombuffer(buf, dtype=fp.torch_dtype, offset=header.header_bytes)  # [n_layers*2*H_kv*bs*d_head]
    return flat.view(fp.block_shape(len(header.layers)))
