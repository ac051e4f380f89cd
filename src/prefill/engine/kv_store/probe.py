"""How fast this store loads blocks: bytes per second from the disk and from the page cache (its RAM tier).

The cost model weighs "compute or load" with these rates: loading n bytes takes n / rate seconds. The probe
writes `nbytes` of random blocks of the store's own shape into its directory (fsync'd, under keys of a random
token chain, so they meet no real prompt), asks the kernel to drop them from the page cache
(POSIX_FADV_DONTNEED), reads them back through the store's verifying reader, holding them as get() does (the
disk rate, checksums included), reads them again (the page-cache rate), and removes them. Both rates end where
a get() ends: the blocks in memory, not yet copied into the pool. A third rate is the CPU's alone: verifying a
block already in memory and copying it once, what a load costs the cores whatever the store (both ends weigh
it against the prefill that runs beside the load).

The probe's files fit the store: at most a quarter of its cap (at least 4 blocks), and the least recently used
blocks are evicted first when the disk lacks the room. A store that cannot be written (load-only) is probed on
the blocks it holds instead: each read whole and checksummed, as a load verifies it.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import xxhash

from prefill.engine.kv_store.blockio import KVBlock, read_block
from prefill.engine.kv_store.fingerprint import Fingerprint
from prefill.engine.kv_store.format import decode_payload, encode_header, header_size, parse_header, payload_size
from prefill.engine.kv_store.keys import BlockKey
from prefill.engine.kv_store.store import KVStore


@dataclass(frozen=True)
class StoreBandwidth:
    """Read rates of a store's directory, bytes/s, over `n_blocks` block files of `nbytes` in all."""

    disk_bytes_per_s: float | None  # first read after the page cache dropped them (None: the OS cannot drop)
    ram_bytes_per_s: float  # the same files again, from the page cache
    nbytes: int
    n_blocks: int
    cpu_bytes_per_s: float = float("inf")  # verifying and copying blocks already in memory: the CPU's part


def probe_bandwidth(store: KVStore, nbytes: int = 64 << 20) -> StoreBandwidth | None:
    """Measure `store`'s load rates over about `nbytes` of blocks (at least 4, at most a quarter of the cap); None
    when there is nothing to measure with (no room to write, nothing stored to read) or another process evicted
    a probe block mid-way."""
    if store.files is None:
        return None
    if not store.writable:
        return _probe_stored(store, nbytes)
    fp, files = store.fp, store.files
    per_file = header_size(fp.spec.L, fp.block_size) + payload_size(fp, fp.spec.L)
    n = max(4, math.ceil(min(nbytes, store.max_bytes // 4) / per_file))
    keys = store.keys([secrets.randbelow(2**31) for _ in range(n * fp.block_size)])
    block, payload = _random_block(fp)
    try:
        if not store.make_room(n * per_file, under_cap=False):
            return _probe_stored(store, nbytes)
        for key in keys:  # mtime 0: the first thing any eviction removes
            files.write(key.digest, [encode_header(fp, key, block.layers, payload), payload], 0, sync=True)
        dropped = drop_from_page_cache([files.path(k.digest) for k in keys])
        cold = _read_seconds(store, keys)
        warm = _read_seconds(store, keys)
    except OSError:
        return _probe_stored(store, nbytes)
    finally:
        for key in keys:
            files.remove(key.digest)
    if cold is None or warm is None:
        return None
    total = n * per_file
    cpu = _cpu_seconds(fp, block, payload, keys[0], n)
    return StoreBandwidth(total / cold if dropped else None, total / warm, total, n, total / cpu)


def _probe_stored(store: KVStore, nbytes: int) -> StoreBandwidth | None:
    """The rates of a store that cannot be written, over the block files it holds (up to `nbytes` of them,
    the most recently used first): read whole and checksummed, as a load verifies them. None when it holds none."""
    entries = sorted(store.files.scan(), key=lambda e: -e.mtime_ns)
    chosen, total = [], 0
    for e in entries:
        if total >= nbytes and len(chosen) >= 4:
            break
        chosen.append(str(e.path))
        total += e.size
    if not chosen:
        return None
    try:
        dropped = drop_from_page_cache(chosen)
        cold, warm = _checksum_seconds(chosen), _checksum_seconds(chosen)
    except OSError:
        return None
    key = store.keys(list(range(store.fp.block_size)))[0]
    cpu = _cpu_seconds(store.fp, *_random_block(store.fp), key, len(chosen))
    return StoreBandwidth(total / cold if dropped else None, total / warm, total, len(chosen), total / cpu)


def _checksum_seconds(paths: Sequence[str]) -> float:
    """Seconds to read every file whole into fresh memory and checksum it (XXH3-64, the format's hash)."""
    t0 = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            xxhash.xxh3_64_intdigest(f.read())
    return time.perf_counter() - t0


def _random_block(fp: Fingerprint) -> tuple[KVBlock, memoryview]:
    """A random block of every layer in the store's shape, and its payload's bytes."""
    kv = torch.randn(fp.block_shape()).to(fp.torch_dtype)  # [L, 2, H_kv, block_size, d_head]
    return KVBlock(kv, tuple(range(fp.spec.L))), memoryview(kv.reshape(-1).view(torch.uint8).numpy())


def drop_from_page_cache(paths) -> bool:
    """Ask the kernel to forget the files' cached pages (clean after fsync); False where it cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def _cpu_seconds(fp: Fingerprint, block: KVBlock, payload: memoryview, key: BlockKey, n: int) -> float:
    """Seconds to verify n blocks already in memory (`block`'s file image) and copy each once, as numpy copies."""
    image = bytearray(encode_header(fp, key, block.layers, payload)) + bytes(payload)
    header = parse_header(image, len(image), fp, key)
    into = np.empty(len(image) - header.header_bytes, dtype=np.uint8)
    t0 = time.perf_counter()
    for _ in range(n):
        kv = decode_payload(image, header, fp)  # the checksum
        np.copyto(into, kv.reshape(-1).view(torch.uint8).numpy())
    return time.perf_counter() - t0


def _read_seconds(store: KVStore, keys: Sequence[BlockKey]) -> float | None:
    """Seconds to read and verify every block of `keys`, holding them all as get() does (fresh memory for
    each, page faults included); None if one is missing."""
    held = []
    t0 = time.perf_counter()
    for key in keys:
        held.append(read_block(store.files, store.fp, key))
        if held[-1] is None:
            return None
    return time.perf_counter() - t0
