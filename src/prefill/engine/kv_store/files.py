"""The store's directory: one file per block, written atomically, recency in the files' mtimes.

    DIR/blocks/<first 2 hex digits of the key>/<key as 64 hex digits>.kv

The directory is the index: a block exists when its file does, its size is the file's, and its last use is the
file's mtime (set explicitly on every write and hit: atime is unreliable under noatime/relatime). Nothing else
needs to survive a crash, and every process sharing the directory sees the others' blocks through it.
A block is written to a temporary file in the same folder and renamed over its final name (os.replace is
atomic on POSIX), so a reader opens either the whole old file, the whole new one, or none. Temporary files a
crashed writer left behind are removed by the next scan (an hour old), or at start-up (`clean`: its writer's
process is gone), with every file that is not a block of this format (foreign files: another program's).
No fsync on the way (a block is a cache entry): a file torn by a power cut fails its checksum and is recomputed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from prefill.engine.kv_store.format import MAGIC

_SUFFIX, _TMP = ".kv", ".tmp"
_STAMP_STEP_NS = 1000  # a chain's later blocks look older (chain_stamp)
_STALE_TMP_NS = 3600 * 10**9  # a live writer finishes a block in milliseconds; an hour-old temp file is litter
_BLOCK_NAME = re.compile(r"[0-9a-f]{64}\.kv")
_SHARD_NAME = re.compile(r"[0-9a-f]{2}")
_TMP_PID = re.compile(r"\.(\d+)\.\d+(?:\.\d+)?\.tmp$")  # .<name>.<pid>.<thread>.<ns>.tmp, .probe.<pid>.<thread>.tmp


def chain_stamp(now_ns: int, index: int) -> int:
    """The mtime of block `index` of a chain written or hit at `now_ns`: 1 µs older per block from the chain's
    start. Every write and hit stamps the chain from its first block, so each block is newer than every block after
    it and LRU eviction trims a chain from its tail: it never leaves a block without the blocks before it."""
    return now_ns - index * _STAMP_STEP_NS


@dataclass(frozen=True)
class Entry:
    """One block file as a scan saw it."""

    path: Path
    size: int  # bytes
    mtime_ns: int  # its last write or hit


class BlockFiles:
    """The block files under `root`/blocks (the folder is created if missing)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.blocks = self.root / "blocks"
        self.blocks.mkdir(parents=True, exist_ok=True)
        os.listdir(self.blocks)  # at most 256 shards: raises now if the folder cannot be read
        self._prefix = str(self.blocks) + os.sep

    def path(self, key: bytes) -> str:
        """The block file of `key` (a plain string: a lookup builds one per block, pathlib is slower)."""
        name = key.hex()
        return self._prefix + name[:2] + os.sep + name + _SUFFIX

    def check_writable(self) -> None:
        """Write and remove a one-byte temporary file; the OSError of a read-only or full file system if not."""
        probe = self.blocks / f".probe.{os.getpid()}.{threading.get_ident()}{_TMP}"
        try:
            probe.write_bytes(b"\0")
        finally:  # a full disk creates the file and refuses its byte: removed all the same
            with contextlib.suppress(OSError):  # none there (read-only): nothing to remove
                probe.unlink()

    def write(self, key: bytes, parts: list, stamp_ns: int, sync: bool = False) -> int:
        """Write the concatenated buffers `parts` as the block file of `key` (whole, or not at all), its mtime
        set to `stamp_ns`; `sync` waits for the disk (fsync). Returns the bytes written; OSError as raised."""
        final = Path(self.path(key))
        final.parent.mkdir(exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}{_TMP}")
        try:
            with open(tmp, "wb") as f:
                size = sum(f.write(p) for p in parts)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
            os.utime(tmp, ns=(stamp_ns, stamp_ns))
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return size

    def touch(self, key: bytes, stamp_ns: int) -> None:
        """Mark the block used at `stamp_ns` (gone already: nothing to do)."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path(key), ns=(stamp_ns, stamp_ns))

    def peek(self, key: bytes, n: int) -> tuple[bytes, int] | None:
        """The first `n` bytes of the block file and its size, or None when there is no such file."""
        try:
            fd = os.open(self.path(key), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return os.pread(fd, n, 0), os.fstat(fd).st_size
        finally:
            os.close(fd)

    def read(self, key: bytes, into: memoryview | None = None) -> bytearray | memoryview | None:
        """The whole block file, or None when there is none: read into the start of `into` when the file fits
        there (a reused buffer: no fresh pages to fault in), else into a new bytearray. The open file is one
        inode: a rename over it while we read does not mix two versions."""
        try:
            with open(self.path(key), "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                buf = into[:size] if into is not None and size <= len(into) else bytearray(size)
                n = f.readinto(buf)
        except FileNotFoundError:
            return None
        return buf if n == len(buf) else buf[:n]

    def resident_share(self, keys: list[bytes]) -> float | None:
        """The share of the files' pages in the page cache now (mincore over a read-only mapping of each), or
        None where that cannot be asked (not Linux): whether a load of them will read memory or the disk."""
        if _mincore() is None:
            return None
        resident = total = 0
        for key in keys:
            with contextlib.suppress(FileNotFoundError, OSError):
                r, t = _resident_pages(self.path(key))
                resident, total = resident + r, total + t
        return resident / total if total else None

    def remove(self, key: bytes) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(key))

    def scan(self) -> list[Entry]:
        """Every block file, and the removal of stale temporary files on the way."""
        out, now = [], time.time_ns()
        for shard in _subdirs(self.blocks):
            for e in _entries(shard):
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue  # removed by another process since the listing
                if e.name.endswith(_SUFFIX):
                    out.append(Entry(Path(e.path), st.st_size, st.st_mtime_ns))
                elif e.name.endswith(_TMP) and now - st.st_mtime_ns > _STALE_TMP_NS:
                    Path(e.path).unlink(missing_ok=True)
        return out

    def disk_space(self) -> tuple[int, int]:
        """(bytes free to this process, bytes of the whole file system) where the blocks live."""
        st = os.statvfs(self.blocks)
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    def clean(self) -> tuple[int, int]:
        """Remove the temporary files of writers that are gone (their process has ended, or an hour passed) and
        every foreign file: not a block file by name (<2 hex>/<64 hex>.kv) or by its first bytes (the magic).
        Folders are left alone. Returns (temporary files, foreign files) removed; OSError as raised."""
        tmp = foreign = 0
        for e in _entries(self.blocks):
            is_shard = e.is_dir() and _SHARD_NAME.fullmatch(e.name)
            for f, shard in [(f, e.name) for f in _entries(e)] if is_shard else [(e, None)]:
                kind = _litter(f, shard)
                if kind is not None:
                    Path(f.path).unlink(missing_ok=True)
                    tmp, foreign = tmp + (kind == "tmp"), foreign + (kind == "foreign")
        return tmp, foreign

    def evict(self, target_bytes: int) -> tuple[int, int]:
        """Remove the least recently used block files until at most `target_bytes` remain.
        Returns (files removed, bytes remaining)."""
        entries = sorted(self.scan(), key=lambda e: e.mtime_ns)
        total, removed = sum(e.size for e in entries), 0
        for e in entries:
            if total <= target_bytes:
                break
            e.path.unlink(missing_ok=True)  # another process may have removed it first: same outcome
            total -= e.size
            removed += 1
        return removed, total


def _litter(e: os.DirEntry, shard: str | None) -> str | None:
    """ "tmp" for a dead writer's temporary file, "foreign" for a file that is no block, None to keep it."""
    if e.is_dir():
        return None
    if e.name.endswith(_TMP):
        m = _TMP_PID.search(e.name)
        try:
            stale = time.time_ns() - e.stat().st_mtime_ns > _STALE_TMP_NS
        except FileNotFoundError:
            return None  # renamed by its writer meanwhile
        return "tmp" if stale or (m is not None and not _alive(int(m.group(1)))) else None
    if shard is None or not (_BLOCK_NAME.fullmatch(e.name) and e.name.startswith(shard)):
        return "foreign"
    try:
        with open(e.path, "rb") as f:
            return None if f.read(len(MAGIC)) == MAGIC else "foreign"
    except FileNotFoundError:
        return None


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (in this PID namespace; a writer in another one looks alive or not, and its
    file then waits for the hour)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _subdirs(folder: Path) -> list[os.DirEntry]:
    return [e for e in _entries(folder) if e.is_dir()]


def _entries(folder: Path | os.DirEntry) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except FileNotFoundError:
        return []


@functools.cache
def _mincore():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mmap.restype = ctypes.c_void_p
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def _resident_pages(path: str) -> tuple[int, int]:
    """(pages of the file in the page cache, pages of the file)."""
    libc, page = _mincore(), mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            n = (size + page - 1) // page
            vec = ctypes.create_string_buffer(n)
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(b & 1 for b in vec.raw), n
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
