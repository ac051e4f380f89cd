"""How fast this store loads blocks: bytes per second from the disk and from the page cache (its RAM tier).

The cost model weighs "compute or load" with these rates: loading n bytes takes n / rate seconds. The probe
writes `nbytes` of random blocks of the store's own shape into its directory (fsync'd, under keys of a random
token chain, so they meet no real prompt), asks the kernel to drop them from the page cache
(POSIX_FADV_DONTNEED), reads them back through the store's verifying reader, holding them as get() does (the
disk rate, checksums included), reads them again (the page-cache rate), and removes them. Both rates end where
a get() ends: the blocks in memory, not yet copied into the pool. A third rate is the CPU's alone: verifying a
block already in memory and copying it once, what a load costs the cores whatever the store (both ends weigh
it against the prefill that runs beside the load).
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

from prefill.engine.kv_store.format import decode_payload, encode_header, header_size, parse_header, payload_size
from prefill.engine.kv_store.keys import BlockKey
from prefill.engine.kv_store.store import KVStore, read_block


@dataclass(frozen=True)
class StoreBandwidth:
    """Read rates of a store's directory, bytes/s, over `n_blocks` block files of `nbytes` in all."""

    disk_bytes_per_s: float | None  # first read after the page cache dropped them (None: the OS cannot drop)
    ram_bytes_per_s: float  # the same files again, from the page cache
    nbytes: int
    n_blocks: int
    cpu_bytes_per_s: float = float("inf")  # verifying and copying blocks already in memory: the CPU's part


def probe_bandwidth(store: KVStore, nbytes: int = 64 << 20) -> StoreBandwidth | None:
    """Measure `store`'s load rates over about `nbytes` of blocks (at least 4); None when the store cannot
    be written (nothing to measure with) or another process evicted a probe block mid-way."""
    if not store.writable:
        return None
    fp, files = store.fp, store.files
    per_file = header_size(fp.spec.L, fp.block_size) + payload_size(fp, fp.spec.L)
    n = max(4, math.ceil(nbytes / per_file))
    tokens = [secrets.randbelow(2**31) for _ in range(n * fp.block_size)]
    keys = store.keys(tokens)
    kv = torch.randn(fp.block_shape()).to(fp.torch_dtype)  # [L, 2, H_kv, block_size, d_head]
    payload = memoryview(kv.reshape(-1).view(torch.uint8).numpy())
    layers = tuple(range(fp.spec.L))
    try:
        for key in keys:  # mtime 0: the first thing any eviction removes
            files.write(key.digest, [encode_header(fp, key, layers, payload), payload], 0, sync=True)
        dropped = drop_from_page_cache([files.path(k.digest) for k in keys])
        cold = _read_seconds(store, keys)
        warm = _read_seconds(store, keys)
        cpu = _cpu_seconds(store, keys[0], n)
    except OSError:
        return None
    finally:
        for key in keys:
            files.remove(key.digest)
    if cold is None or warm is None:
        return None
    total = n * per_file
    return StoreBandwidth(total / cold if dropped else None, total / warm, total, n, total / cpu)


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


def _cpu_seconds(store: KVStore, key: BlockKey, n: int) -> float:
    """Seconds to verify n blocks already in memory (key's file, read once) and copy each once, as numpy copies."""
    image = bytearray(store.files.read(key.digest))
    header = parse_header(image, len(image), store.fp, key)
    into = np.empty(len(image) - header.header_bytes, dtype=np.uint8)
    t0 = time.perf_counter()
    for _ in range(n):
        payload = decode_payload(image, header, store.fp)  # the checksum
        np.copyto(into, payload.reshape(-1).view(torch.uint8).numpy())
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
