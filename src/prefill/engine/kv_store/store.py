"""KVStore: K/V blocks on disk, found by the hash chain of their tokens, for one model fingerprint.

    store = KVStore(dir, fingerprint, max_bytes)
    store.put(store.keys(ids), blocks)        # queued; written by the background thread
    match = store.longest_prefix(ids)         # blocks of ids' longest stored prefix (no payload read)
    blocks = store.get(match.keys)            # verified blocks, stopping at the first bad one
    store.touch(match.keys)                   # marked used (LRU), the chain from its first block

Nothing here raises on a disk problem. A directory that cannot be created or listed is no store (lookups miss);
a read-only one is load-only: it serves what it holds and stores nothing (one warning; with nothing to serve,
no store). The size cap is the smaller of `max_bytes` and what the file system can hold (the store's files and
the free space, less a margin); every write first evicts (LRU) to make room under both, so a full disk keeps
serving its blocks and stores new ones in place of the oldest. Opening removes the temporary files of writers
that are gone and any file that is no block, and says how many. A block that fails verification is a miss:
one warning line, a count, and its file removed so the next put writes it afresh. The page cache is the store's
RAM tier: a block read or written recently is served from memory; probe.py measures both rates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from prefill.engine.kv_store.blockio import KVBlock, bytes_of, holds, merged, read_block
from prefill.engine.kv_store.files import BlockFiles, chain_stamp
from prefill.engine.kv_store.fingerprint import Fingerprint
from prefill.engine.kv_store.format import (
    FORMAT_VERSION,
    PEEK_BYTES,
    BlockError,
    Header,
    encode_header,
    file_size,
    parse_header,
)
from prefill.engine.kv_store.keys import BlockKey, block_keys, chain_root, layers_needed
from prefill.engine.kv_store.stats import StoreMatch, StoreStats
from prefill.engine.kv_store.writer import BackgroundWriter
from prefill.errors import BadInput

log = logging.getLogger("prefill.kv_store")
_LOW_WATER = 0.9  # eviction frees down to 90% of max_bytes, so it runs once per tenth of the cap written
_MARGIN_SHARE, _MARGIN_MAX = 0.05, 256 << 20  # free space left to others: 5% of the file system, at most 256 MiB
_FULL = (errno.ENOSPC, errno.EDQUOT)  # a full disk: make room and go on (other errors stop the writes)


def margin_bytes(fs_bytes: int) -> int:
    """The free space a store leaves on a file system of `fs_bytes` (bytes)."""
    return min(int(fs_bytes * _MARGIN_SHARE), _MARGIN_MAX)


class KVStore:
    """Blocks of K/V of the model `fingerprint` under `directory`, at most `max_bytes` of files (LRU).

    `max_pending_bytes` bounds the blocks waiting for the background writer (put() drops beyond it).
    """

    def __init__(
        self, directory: str | Path, fingerprint: Fingerprint, max_bytes: int, max_pending_bytes: int = 256 << 20
    ) -> None:
        if max_bytes < 0 or max_pending_bytes < 0:
            raise BadInput("a KV store's max_bytes and max_pending_bytes must be >= 0")
        self.fp, self.max_bytes, self.directory = fingerprint, max_bytes, Path(directory)
        self.asked_bytes = max_bytes  # max_bytes is this, or less where the file system holds less
        self._root = chain_root(fingerprint.digest, FORMAT_VERSION)
        self._stats, self._lock = StoreStats(), threading.Lock()
        self._disk_bytes = 0  # this process's estimate of the directory's block bytes; rescanned when over
        self._since_scan = 0  # bytes written since the last scan
        self._rejected: set[bytes] = set()  # keys warned about: a read-only store cannot remove them
        self._warned_full = False
        self.files: BlockFiles | None = None
        self.writable = False
        try:
            files = BlockFiles(self.directory)
            self._disk_bytes, n_blocks = self._open(files)
        except OSError as e:
            log.warning("kv store %s unusable (%s); running without a KV store", self.directory, _why(e))
            return
        try:
            files.check_writable()
            self.writable = True
        except OSError as e:
            self.writable = e.errno in _FULL  # full: writes make room by eviction
            if not self.writable and not n_blocks:  # load-only with nothing to load
                log.warning(
                    "kv store %s: cannot write (%s) and holds no blocks; running without a KV store", directory, _why(e)
                )
                return
            if not self.writable:
                log.warning(
                    "kv store %s: cannot write (%s): loading its %d blocks, storing none", directory, _why(e), n_blocks
                )
        self.files = files
        self._writer = BackgroundWriter(max_pending_bytes)
        if self.writable:
            self._fit_disk()

    def _open(self, files: BlockFiles) -> tuple[int, int]:
        """Remove litter (saying how much), then (bytes, count) of the block files there."""
        try:
            tmp, foreign = files.clean()
        except OSError:  # read-only: nothing can be removed, and nothing needs to be
            tmp = foreign = 0
        if tmp or foreign:
            log.warning(
                "kv store %s: removed %d temporary files of writers that are gone and %d foreign files",
                self.directory,
                tmp,
                foreign,
            )
        entries = files.scan()
        return sum(e.size for e in entries), len(entries)

    def _fit_disk(self) -> None:
        """Cap max_bytes at what the file system holds for the store (its files, the free space, less the margin),
        saying so once, and evict down to the cap."""
        free, total = self.files.disk_space()
        room = max(0, self._disk_bytes + free - margin_bytes(total))
        if room < self.max_bytes:
            log.warning(
                "kv store %s: at most %.1f MiB, not the %.0f MiB asked: the file system holds %.1f MiB free, less a "
                "margin of %.1f MiB",
                self.directory,
                room / 2**20,
                self.asked_bytes / 2**20,
                free / 2**20,
                margin_bytes(total) / 2**20,
            )
            self.max_bytes = room
        if self._disk_bytes > self.max_bytes:
            self._evict(int(self.max_bytes * _LOW_WATER))

    def make_room(self, nbytes: int, under_cap: bool = True) -> bool:
        """Evict the least recently used blocks until `nbytes` more fit under the cap (`under_cap`; the start-up
        probe's files are removed at once: only the disk's room counts) and leave the file system's margin free;
        False when they cannot (the disk is full of others' files). On the writer thread, or before it writes."""
        free, total = self.files.disk_space()
        over_cap = self._disk_bytes + nbytes - self.max_bytes if under_cap else 0
        need = max(nbytes + margin_bytes(total) - free, over_cap)
        if need <= 0:
            return True
        if over_cap > 0:  # over the cap: down to the low-water mark, as a rescan
            need = max(need, self._disk_bytes + nbytes - int(self.max_bytes * _LOW_WATER))
        if need > self._disk_bytes:
            return False
        return self._evict(self._disk_bytes - need)

    # ---- keys and lookups ------------------------------------------------------------------------------

    def keys(self, token_ids: Sequence[int]) -> list[BlockKey]:
        """The key of every whole block of `token_ids`, chained from this store's fingerprint."""
        return block_keys(self._root, token_ids, self.fp.block_size)

    def longest_prefix(self, token_ids: Sequence[int], limit: int | None = None) -> StoreMatch:
        """The longest run of stored blocks from the start of `token_ids` that a continuation can use: each
        block present, with every layer whose window still reaches it from where the continuation starts (the
        prefix's end, or `limit` if that is sooner: the positions after it are recomputed). Reads headers only.
        Pass the tokens whose K/V you want (a prompt less its last token, whose logits must be computed)."""
        keys = self.keys(token_ids) if self.files else []
        found: list[Header] = []
        for key in keys:
            header = self._peek(key)
            if header is None:
                break
            found.append(header)
        n, bs = len(found), self.fp.block_size
        while n and not self._usable(found[:n], n * bs if limit is None else min(limit, n * bs)):
            n -= 1
        with self._lock:
            self._stats.lookups += 1
            self._stats.miss_blocks += len(keys) - n
        sizes = tuple(h.header_bytes + h.payload_bytes for h in found[:n])
        return StoreMatch(tuple(keys[:n]), n * self.fp.block_size, sizes)

    @property
    def slot_bytes(self) -> int:
        """Bytes of a block file holding every layer: a slot of get()'s `into` buffer."""
        return file_size(self.fp, self.fp.spec.L)

    def stored_blocks(self, keys: Sequence[BlockKey], layers: Sequence[tuple[int, ...]] | None = None) -> int:
        """How many of `keys`, from the first, have a block file: what a put of a chain may skip. Existence only
        (nothing read or verified) unless `layers` (per key) asks that each file hold at least those (headers
        read)."""
        n = 0
        while self.files and n < len(keys) and os.path.exists(self.files.path(keys[n].digest)):
            if layers is not None:
                peeked = self.files.peek(keys[n].digest, PEEK_BYTES)
                if peeked is None or not holds(peeked, self.fp, keys[n], layers[n]):
                    break
            n += 1
        return n

    def get(self, keys: Sequence[BlockKey], into: bytearray | None = None) -> list[KVBlock]:
        """The blocks of `keys` in order, each verified (checksums, fingerprint, version, key, shapes); stops
        at the first missing or bad one, so the result is always a prefix of `keys`. With `into` (a reused
        buffer), block i is read into its i-th slot of `slot_bytes` and the blocks are views of it, valid until
        the buffer is read into again (a file that does not fit its slot is read into fresh memory)."""
        out: list[KVBlock] = []
        loaded, view, slot = 0, memoryview(into) if into is not None else None, self.slot_bytes
        for i, key in enumerate(keys if self.files else ()):
            try:
                got = read_block(
                    self.files, self.fp, key, view[i * slot : (i + 1) * slot] if view is not None else None
                )
            except BlockError as e:
                self._reject(key, e)
                break
            if got is None:
                break  # evicted since the lookup (here or by another process)
            out.append(got[0])
            loaded += got[1]
        with self._lock:
            self._stats.hit_blocks += len(out)
            self._stats.miss_blocks += len(keys) - len(out)
            self._stats.bytes_loaded += loaded
        return out

    def touch(self, keys: Sequence[BlockKey]) -> None:
        """Mark a chain's blocks used now, off the caller's path: `keys` from the chain's first block, so that each
        stays newer than the blocks after it (a get() of a later batch, stamped alone, would not)."""
        if keys and keys[0].index == 0 and self.writable:
            self._writer.submit(functools.partial(self._touch, list(keys), time.time_ns()))

    # ---- writes ----------------------------------------------------------------------------------------

    def put(
        self, keys: Sequence[BlockKey], blocks: Sequence[torch.Tensor | KVBlock], head: Sequence[BlockKey] = ()
    ) -> int:
        """Queue `blocks` (a tensor [L, 2, H_kv, block_size, d_head] of all layers, or a KVBlock of some) of one
        chain for writing under `keys`, `head` being the chain's stored blocks before them (touched with them);
        returns at once. The store keeps references: pass tensors nobody will write to. Returns how many were
        queued: the first ones, up to the writer's bound (the rest are dropped and counted)."""
        if len(keys) != len(blocks):
            raise BadInput(f"{len(keys)} keys for {len(blocks)} blocks")
        items = [self._checked(b) for b in blocks]
        stamp, queued = time.time_ns(), 0
        if head and self.writable:
            self._writer.submit(functools.partial(self._touch, list(head), stamp))
        parents = [head[-1] if head else None, *keys[:-1]]
        for key, parent, block in zip(keys, parents, items, strict=True):
            nbytes = block.kv.numel() * block.kv.element_size()
            job = functools.partial(self._write, key, block, chain_stamp(stamp, key.index), parent)
            if not (self.writable and self._writer.submit(job, nbytes)):
                break
            queued += 1
        with self._lock:
            self._stats.dropped_blocks += len(items) - queued
        return queued

    def flush(self) -> None:
        """Wait until every queued write has reached the directory (tests, shutdown, benchmarks)."""
        if self.files:
            self._writer.flush()

    def close(self) -> None:
        """Finish the queued writes and stop the writer thread."""
        if self.files:
            self._writer.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> StoreStats:
        """A snapshot of the counters."""
        with self._lock:
            return dataclasses.replace(self._stats, writer_cpu_s=self._writer.cpu_s if self.files else 0.0)

    # ---- inside ----------------------------------------------------------------------------------------

    def _checked(self, block: torch.Tensor | KVBlock) -> KVBlock:
        if isinstance(block, torch.Tensor):
            block = KVBlock(block, tuple(range(self.fp.spec.L)))
        want = self.fp.block_shape(len(block.layers))
        if tuple(block.kv.shape) != want or block.kv.dtype != self.fp.torch_dtype:
            got = f"{list(block.kv.shape)} {block.kv.dtype}"
            raise BadInput(f"a block of this store is {list(want)} {self.fp.kv_dtype}; got {got}")
        if not block.layers or list(block.layers) != sorted(set(block.layers)) or block.layers[-1] >= self.fp.spec.L:
            raise BadInput(f"a block's layers must be distinct, ascending and below L={self.fp.spec.L}")
        return block

    def _usable(self, headers: list[Header], end: int) -> bool:
        """Whether every block holds the layers a continuation from position `end` needs."""
        windows = self.fp.spec.windows
        return all(layers_needed(windows, i, end, self.fp.block_size) <= set(h.layers) for i, h in enumerate(headers))

    def _peek(self, key: BlockKey) -> Header | None:
        """The checked header of a stored block; None when absent or rejected."""
        try:
            got = self.files.peek(key.digest, PEEK_BYTES)
            return None if got is None else parse_header(got[0], got[1], self.fp, key)
        except (BlockError, OSError) as e:
            self._reject(key, e)
            return None

    def _reject(self, key: BlockKey, e: Exception) -> None:
        with self._lock:
            self._stats.corrupt_blocks += 1
            first = key.digest not in self._rejected
            self._rejected.add(key.digest)
        if first:
            path = self.files.path(key.digest)
            log.warning("kv store: block %d at %s rejected (%s); recomputing it", key.index, path, _why(e))
        if self.writable:
            with contextlib.suppress(OSError):  # the next put of this block writes a good one
                self.files.remove(key.digest)

    def _write(self, key: BlockKey, block: KVBlock, stamp: int, parent: BlockKey | None) -> None:
        """On the writer thread: the block, unless a file with at least its layers is there (a sound file with
        other layers is merged with it, so what one sequence's window kept and another's did not add up), or its
        chain's block before it (`parent`) is gone (evicted since the put: this one could never be used); then
        evict."""
        if not self.writable:
            return  # a write queued before the first failure
        if parent is not None and not os.path.exists(self.files.path(parent.digest)):
            with self._lock:
                self._stats.dropped_blocks += 1
            return
        try:
            old = self.files.peek(key.digest, PEEK_BYTES)
            if old is not None and holds(old, self.fp, key, block.layers):
                self.files.touch(key.digest, stamp)
                return
            if old is not None:
                block = merged(self.files, self.fp, key, block)
            # room on the disk now; the cap is held after the write (the new block, stamped older than its chain's
            # head, may be what goes: a chain is trimmed from its tail)
            if not self.make_room(file_size(self.fp, len(block.layers)), under_cap=False):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            payload = bytes_of(block.kv)
            size = self.files.write(key.digest, [encode_header(self.fp, key, block.layers, payload), payload], stamp)
        except OSError as e:
            self._full(e) if e.errno in _FULL else self._stop_writing(e)
            return
        with self._lock:
            self._stats.written_blocks += 1
            self._stats.written_bytes += size
            self._rejected.discard(key.digest)  # a good block now: a later fault deserves its own warning
        self._disk_bytes += size - (old[1] if old else 0)
        self._since_scan += size
        if self._disk_bytes > self.max_bytes or self._since_scan > self.max_bytes * (1 - _LOW_WATER):
            self._rescan()

    def _full(self, e: OSError) -> None:
        """A block that found no room: dropped (counted), one warning; the store keeps serving and writing."""
        with self._lock:
            self._stats.dropped_blocks += 1
        if not self._warned_full:
            self._warned_full = True
            log.warning(
                "kv store %s: the disk is full (%s) beyond what eviction frees; serving its blocks, storing new "
                "ones as room frees",
                self.directory,
                _why(e),
            )

    def _rescan(self) -> None:
        """Learn the directory's real size (other processes write too) and evict down to the low-water mark."""
        self._evict(int(self.max_bytes * _LOW_WATER) if self._disk_bytes > self.max_bytes else self.max_bytes)

    def _evict(self, target: int) -> bool:
        """Remove the least recently used block files down to `target` bytes; False (writes stop) on an error."""
        try:
            removed, self._disk_bytes = self.files.evict(target)
        except OSError as e:
            self._stop_writing(e)
            return False
        self._since_scan = 0
        with self._lock:
            self._stats.evicted_blocks += removed
        return True

    def _touch(self, keys: list[BlockKey], stamp: int) -> None:
        try:
            for key in keys:
                self.files.touch(key.digest, chain_stamp(stamp, key.index))
        except OSError as e:
            self._stop_writing(e)

    def _stop_writing(self, e: OSError) -> None:
        """Store nothing more: load-only from now on; one warning (the first failure)."""
        if self.writable:
            self.writable = False
            log.warning("kv store %s: cannot write (%s): loading its blocks, storing none", self.directory, _why(e))


def _why(e: Exception) -> str:
    return e.strerror or str(e) if isinstance(e, OSError) else str(e)
