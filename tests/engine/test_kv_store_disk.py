"""The KV store on a hostile disk (issue 44), on a small tmpfs of its own: a cap the disk can hold, room made by
eviction before the rate probe and before writes, a disk that others fill, read-only as load-only, and the
litter that opening removes. The tmpfs needs root (mount); elsewhere these tests skip and say why."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prefill.engine.kv_store import KVStore, probe_bandwidth
from prefill.engine.kv_store.store import margin_bytes

sys.path.insert(0, str(Path(__file__).parent))
from test_kv_store import BS, block_for, file_bytes, fingerprint  # noqa: E402

from tmpfs import mount_tmpfs, unmount  # noqa: E402

TMPFS_MB = 4  # about 650 blocks of the tiny model (6,336 bytes each)


@pytest.fixture
def tmpfs(tmp_path):
    """A 4 MiB tmpfs, unmounted after the test."""
    mount_tmpfs(tmp_path / "fs", TMPFS_MB)
    yield tmp_path / "fs"
    unmount(tmp_path / "fs")


@pytest.fixture
def warnings():
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("prefill.kv_store").addHandler(handler)
    yield messages
    logging.getLogger("prefill.kv_store").removeHandler(handler)


def fill(directory: Path, leave_bytes: int) -> Path:
    """Another program's file next to the store, filling the disk until `leave_bytes` are free."""
    st = os.statvfs(directory)
    other = directory / "other-program.bin"
    other.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave_bytes))
    return other


def free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def chains(n: int, first: int = 0) -> list[list[int]]:
    """n chains of 4 blocks, each its own prompt."""
    return [[first + c] * (4 * BS) for c in range(n)]


def put_chains(store: KVStore, ids_list: list[list[int]]) -> None:
    for ids in ids_list:
        keys = store.keys(ids)
        store.put(keys, [block_for(k, store.fp) for k in keys])
        store.flush()


def served(store: KVStore, ids: list[int]) -> int:
    """Blocks of `ids` the store serves, each checked bitwise."""
    got = store.get(store.longest_prefix(ids).keys)
    assert all(torch.equal(g.kv, block_for(k, store.fp)) for g, k in zip(got, store.keys(ids), strict=False))
    return len(got)


def test_the_cap_is_what_the_disk_holds_and_the_store_never_fills_it(tmpfs, warnings):
    fp = fingerprint()
    total = os.statvfs(tmpfs).f_blocks * os.statvfs(tmpfs).f_frsize
    store = KVStore(tmpfs / "store", fp, 1 << 32)  # asks for 4 GiB on a 4 MiB disk
    assert store.max_bytes == free_bytes(tmpfs) - margin_bytes(total) < TMPFS_MB << 20
    (msg,) = warnings
    assert "not the 4096 MiB asked" in msg
    put_chains(store, chains(200))  # 800 blocks: 5.1 MB, over what fits
    disk = sum(e.size for e in store.files.scan())
    assert disk <= store.max_bytes and free_bytes(tmpfs) >= margin_bytes(total)
    assert store.stats().evicted_blocks > 0 and store.writable and len(warnings) == 1
    assert (
        served(store, chains(200)[-1]) == 4 and served(store, chains(200)[0]) == 0
    )  # the newest prompt is served whole
    store.close()


def test_eviction_makes_room_for_the_rate_probe(tmpfs):
    fp = fingerprint()
    store = KVStore(tmpfs / "store", fp, 1 << 32)
    put_chains(store, chains(120))
    fill(tmpfs, leave_bytes=margin_bytes(TMPFS_MB << 20) + file_bytes(fp))  # room for one block, not 4
    evicted = store.stats().evicted_blocks
    bw = probe_bandwidth(store, nbytes=16 * file_bytes(fp))
    assert bw is not None and bw.n_blocks == 16 and bw.ram_bytes_per_s > 0
    assert store.stats().evicted_blocks > evicted and len(store.files.scan()) < 120 * 4  # the oldest went
    assert served(store, chains(120)[-1]) == 4 and served(store, chains(120)[0]) == 0
    store.close()


def test_a_disk_filled_by_others_keeps_serving_and_stores_in_place_of_the_oldest(tmpfs, warnings):
    fp = fingerprint()
    store = KVStore(tmpfs / "store", fp, 1 << 32)
    put_chains(store, chains(40))
    fill(tmpfs, leave_bytes=0)
    put_chains(store, chains(10, first=1000))  # each write evicts the least recently used first
    assert store.writable and all(served(store, ids) == 4 for ids in chains(10, first=1000))
    assert served(store, chains(40)[0]) == 0 and served(store, chains(40)[-1]) == 4  # the oldest went
    (tmpfs / "other-program.bin").unlink()
    fill(tmpfs, leave_bytes=0)  # now nothing the store holds can make room for what is asked
    before = len(warnings)
    store.make_room(10 * (TMPFS_MB << 20))  # more than the disk: refused, nothing raised
    assert served(store, chains(10, first=1000)[-1]) == 4 and len(warnings) == before
    store.close()


def test_a_read_only_store_loads_its_blocks_with_one_message_and_is_probed_on_them(tmpfs, warnings):
    fp = fingerprint()
    with KVStore(tmpfs / "store", fp, 1 << 32) as store:
        put_chains(store, chains(8))
    warnings.clear()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    store = KVStore(tmpfs / "store", fp, 1 << 32)
    (msg,) = warnings
    assert msg.endswith("cannot write (Read-only file system): loading its 32 blocks, storing none")
    assert not store.writable and all(served(store, ids) == 4 for ids in chains(8))
    bw = probe_bandwidth(store, nbytes=8 * file_bytes(fp))
    assert bw is not None and bw.n_blocks == 8 and bw.ram_bytes_per_s > 0 and bw.cpu_bytes_per_s > 0
    keys = store.keys(chains(1, first=99)[0])
    assert store.put(keys, [block_for(k, fp) for k in keys]) == 0
    assert len(warnings) == 1
    store.close()


def test_an_empty_read_only_directory_is_no_store_in_one_message(tmpfs, warnings):
    (tmpfs / "store" / "blocks").mkdir(parents=True)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    store = KVStore(tmpfs / "store", fingerprint(), 1 << 32)
    assert store.files is None and probe_bandwidth(store) is None
    (msg,) = warnings
    assert msg.endswith("cannot write (Read-only file system) and holds no blocks; running without a KV store")


def test_opening_removes_dead_writers_temporary_files_and_foreign_files(tmp_path, warnings):
    fp = fingerprint()
    with KVStore(tmp_path, fp, 1 << 30) as store:
        put_chains(store, chains(2))
        good = [Path(e.path) for e in store.files.scan()]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has ended
    shard = good[0].parent
    litter = [
        shard / f".{good[0].name}.{pid}.1.2.tmp",  # a crashed writer's half block
        tmp_path / "blocks" / f".probe.{pid}.1.tmp",  # a crashed probe's
    ]
    foreign = [
        shard / "notes.txt",
        shard / ("ab" * 32 + ".kv"),  # a block's name in the wrong shard
        shard / (shard.name + "0" * 62 + ".kv"),  # the right name, not a block inside
        tmp_path / "blocks" / "stray.bin",
    ]
    live = shard / f".{good[1].name}.{os.getpid()}.1.2.tmp"  # this process: a writer that may be running
    for p in (*litter, *foreign, live):
        p.write_bytes(b"not a block")
    warnings.clear()
    store = KVStore(tmp_path, fp, 1 << 30)
    assert warnings == [f"kv store {tmp_path}: removed 2 temporary files of writers that are gone and 4 foreign files"]
    assert not any(p.exists() for p in (*litter, *foreign)) and live.exists()
    assert all(p.exists() for p in good) and all(served(store, ids) == 4 for ids in chains(2))
    store.close()
