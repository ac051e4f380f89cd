"""The KV store on disk: bitwise round trips, hash-chain keys, every kind of bad block a counted miss with one
warning, the LRU cap, windowed layers, two processes on one directory, and directories that refuse writes.

No model: a tiny spec (L=3, H_kv=2, d_head=8) and random tensors; a block file is 6,144 payload bytes.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import xxhash

from prefill.costmodel.specs import ModelSpec
from prefill.engine.kv_store import (
    FORMAT_VERSION,
    Fingerprint,
    KVBlock,
    KVStore,
    layers_needed,
    probe_bandwidth,
    weights_digest,
)
from prefill.engine.kv_store.files import BlockFiles
from prefill.engine.kv_store.format import encode_header, header_size, payload_size
from prefill.engine.kv_store.probe import drop_from_page_cache
from prefill.errors import BadInput

BS = 16


def tiny_spec(windows=()) -> ModelSpec:
    shapes = dict(L=3, d_model=16, H_q=2, H_kv=2, d_head=8, d_ff=32, vocab_size=1000, context_length=4096)
    return ModelSpec("tiny", "llama", **shapes, tied_embeddings=True, rope_theta=1e4, norm_eps=1e-5, windows=windows)


def fingerprint(weights="w0", dtype="float32", windows=()) -> Fingerprint:
    return Fingerprint(weights, tiny_spec(windows), dtype)


def block_for(key, fp: Fingerprint) -> torch.Tensor:
    """A block's K/V as a function of its key alone, so any process can check what it read, bitwise."""
    g = torch.Generator().manual_seed(int.from_bytes(key.digest[:8], "little"))
    return torch.randn(fp.block_shape(), generator=g).to(fp.torch_dtype)  # [L, 2, H_kv, 16, d_head]


def file_bytes(fp: Fingerprint) -> int:
    return header_size(fp.spec.L, BS) + payload_size(fp, fp.spec.L)


@pytest.fixture
def open_store(tmp_path):
    stores = []

    def make(fp=None, directory=None, **kw) -> KVStore:
        store = KVStore(directory or tmp_path / "store", fp or fingerprint(), kw.pop("max_bytes", 1 << 30), **kw)
        stores.append(store)
        return store

    yield make
    for s in stores:
        s.close()


def put_all(store: KVStore, ids) -> list[torch.Tensor]:
    keys = store.keys(ids)
    blocks = [block_for(k, store.fp) for k in keys]
    assert store.put(keys, blocks) == len(keys)
    store.flush()
    return blocks


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "prefill.kv_store" and r.levelno == logging.WARNING]


# ---- round trip and keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_round_trip_is_bitwise(open_store, dtype):
    store = open_store(fingerprint(dtype=dtype))
    ids = list(range(100, 100 + 5 * BS + 7))  # 5 whole blocks and 7 tokens that form none
    blocks = put_all(store, ids)
    match = store.longest_prefix(ids)
    assert (match.n_blocks, match.n_tokens, match.nbytes) == (5, 5 * BS, 5 * file_bytes(store.fp))
    got = store.get(match.keys)
    assert len(got) == 5
    for g, b in zip(got, blocks, strict=True):
        assert g.layers == (0, 1, 2) and g.kv.dtype == b.dtype
        assert torch.equal(g.kv.view(torch.uint8), b.view(torch.uint8))  # bitwise, NaN patterns included
    s = store.stats()
    assert (s.lookups, s.hit_blocks, s.miss_blocks, s.corrupt_blocks) == (1, 5, 0, 0)
    assert s.written_blocks == 5 and s.bytes_loaded == s.written_bytes == 5 * file_bytes(store.fp)


def test_get_into_a_staging_buffer_is_bitwise_and_shares_its_memory(open_store):
    store = open_store(fingerprint())
    ids = list(range(7, 7 + 4 * BS))
    blocks = put_all(store, ids)
    assert store.stats().writer_cpu_s > 0  # the writer thread's CPU time is counted
    keys = store.longest_prefix(ids).keys
    staging = bytearray(3 * store.slot_bytes)  # room for 3: the 4th is read into fresh memory
    got = store.get(keys, staging)
    assert len(got) == 4
    for g, b in zip(got, blocks, strict=True):
        assert torch.equal(g.kv.view(torch.uint8), b.view(torch.uint8))
    base = torch.frombuffer(staging, dtype=torch.uint8).data_ptr()
    for i, g in enumerate(got[:3]):  # block i in slot i, after its header
        assert base + i * store.slot_bytes < g.kv.data_ptr() < base + (i + 1) * store.slot_bytes
    assert not base <= got[3].kv.data_ptr() < base + len(staging)


def test_a_block_of_some_layers_round_trips(open_store):
    store = open_store()
    key = store.keys(list(range(BS)))
    kv = torch.randn(store.fp.block_shape(2))  # [2, 2, H_kv, 16, d_head]: layers 0 and 2 only
    assert store.put(key, [KVBlock(kv, (0, 2))]) == 1
    store.flush()
    (got,) = store.get(key)
    assert got.layers == (0, 2) and torch.equal(got.kv, kv)
    assert os.path.getsize(store.files.path(key[0].digest)) == header_size(2, BS) + payload_size(store.fp, 2)


def test_keys_chain_the_prefix(open_store):
    store = open_store()
    a, b, suffix = [1] * BS, [2] * BS, list(range(3, 3 + BS))
    ka, kb = store.keys(a + suffix), store.keys(b + suffix)
    assert ka[1].tokens == kb[1].tokens and ka[1].digest != kb[1].digest  # same 16 tokens, other prefix
    assert store.keys(a + suffix + [9]) == ka  # a trailing partial block has no key
    put_all(store, a + suffix)
    assert store.longest_prefix(b + suffix).n_blocks == 0  # the same suffix after a different prefix: a miss
    assert store.longest_prefix(a + [7] * BS).n_blocks == 1  # shares the first block only
    assert store.longest_prefix(a + suffix + [5] * BS).n_blocks == 2
    assert store.stats().miss_blocks == 2 + 1 + 1


def test_put_rejects_blocks_of_the_wrong_shape_or_dtype(open_store):
    store = open_store()
    keys = store.keys(list(range(BS)))
    with pytest.raises(BadInput, match="a block of this store is"):
        store.put(keys, [torch.zeros(3, 2, 2, BS, 4)])
    with pytest.raises(BadInput, match="float32"):
        store.put(keys, [torch.zeros(store.fp.block_shape(), dtype=torch.float16)])
    with pytest.raises(BadInput, match="ascending"):
        store.put(keys, [KVBlock(torch.zeros(store.fp.block_shape(2)), (2, 0))])


# ---- fingerprints --------------------------------------------------------------------------------------


def test_weights_digest_sees_one_changed_element():
    sd = {"a.weight": torch.randn(4, 4), "b.weight": torch.randn(3, dtype=torch.bfloat16)}
    d0 = weights_digest(sd)
    assert weights_digest(dict(reversed(list(sd.items())))) == d0  # order of the dict does not matter
    sd["b.weight"][1] += 1
    assert weights_digest(sd) != d0


def test_fingerprint_covers_weights_dtype_spec_and_version():
    base = fingerprint()
    others = [
        fingerprint(weights="w1"),
        fingerprint(dtype="bfloat16"),
        fingerprint(windows=(32, None, 32)),
        Fingerprint("w0", tiny_spec(), "float32", engine_kv_version=2),
    ]
    assert len({base.digest, *(f.digest for f in others)}) == 5
    renamed = Fingerprint("w0", ModelSpec(**{**tiny_spec().__dict__, "name": "other-file-name"}), "float32")
    assert renamed.digest == base.digest  # the same weights under another name are the same model
    with pytest.raises(BadInput):
        Fingerprint("w0", tiny_spec(), "int8")
    sd = {"w": torch.ones(2)}
    assert Fingerprint.of(tiny_spec(), sd, torch.bfloat16) == Fingerprint(weights_digest(sd), tiny_spec(), "bf16")


def test_another_models_store_is_a_plain_miss(open_store, tmp_path, caplog):
    ids = list(range(3 * BS))
    put_all(open_store(), ids)
    other = open_store(fingerprint(weights="w1"))  # same directory, other weights: keys rooted elsewhere
    assert other.longest_prefix(ids).n_blocks == 0
    assert other.stats().corrupt_blocks == 0 and warnings_of(caplog) == []


# ---- bad blocks: each a miss, one warning, counted --------------------------------------------------------


def _stored(open_store, n=3):
    store = open_store()
    ids = list(range(500, 500 + n * BS))
    blocks = put_all(store, ids)
    return store, ids, blocks, store.keys(ids)


def _rewrite(path: Path, edit) -> None:
    data = bytearray(path.read_bytes())
    edit(data)
    path.write_bytes(bytes(data))


def _patched_header(field_offset: int, fmt: str, value):
    """An edit that changes one header field and fixes the header checksum, as a careless tool would."""

    def edit(data: bytearray) -> None:
        hb = struct.unpack_from("<H", data, 10)[0]
        struct.pack_into(fmt, data, field_offset, value)
        struct.pack_into("<Q", data, hb - 8, xxhash.xxh3_64_intdigest(bytes(data[: hb - 8])))

    return edit


def test_a_flipped_payload_byte_stops_get_there(open_store, caplog):
    store, ids, blocks, keys = _stored(open_store)
    path = Path(store.files.path(keys[1].digest))
    _rewrite(path, lambda d: d.__setitem__(len(d) - 100, d[len(d) - 100] ^ 0x01))
    match = store.longest_prefix(ids)
    assert match.n_blocks == 3  # headers are sound: the lookup cannot tell
    got = store.get(match.keys)
    assert len(got) == 1 and torch.equal(got[0].kv, blocks[0])
    (msg,) = warnings_of(caplog)
    assert "block 1" in msg and "payload checksum mismatch" in msg and "\n" not in msg
    s = store.stats()
    assert (s.corrupt_blocks, s.hit_blocks, s.miss_blocks) == (1, 1, 2)
    assert not path.exists()  # removed, so the next put writes a good one
    put_all(store, ids)
    assert len(store.get(store.longest_prefix(ids).keys)) == 3


@pytest.mark.parametrize(
    "edit,reason",
    [
        (lambda d: d.__setitem__(40, d[40] ^ 0x80), "header checksum mismatch"),
        (lambda d: d.__delitem__(slice(len(d) - 10, None)), "truncated"),
        (lambda d: d.__delitem__(slice(30, None)), "truncated"),
        (_patched_header(8, "<H", FORMAT_VERSION + 1), f"format version {FORMAT_VERSION + 1}"),
        (_patched_header(0, "<8s", b"GGUF\0\0\0\0"), "bad magic"),
        (_patched_header(24, "<16s", b"\x07" * 16), "fingerprint mismatch"),
        (_patched_header(72, "<I", 7), "block 7 of another token chain"),
    ],
    ids=["header-byte", "truncated-payload", "truncated-header", "version", "magic", "fingerprint", "index"],
)
def test_a_bad_header_ends_the_lookup_there(open_store, caplog, edit, reason):
    store, ids, _, keys = _stored(open_store)
    _rewrite(Path(store.files.path(keys[2].digest)), edit)
    assert store.longest_prefix(ids).n_blocks == 2
    (msg,) = warnings_of(caplog)
    assert reason in msg and "block 2" in msg
    assert store.stats().corrupt_blocks == 1


def test_a_bad_block_that_cannot_be_removed_warns_once(open_store, caplog):
    store, ids, _, keys = _stored(open_store)
    _rewrite(Path(store.files.path(keys[1].digest)), lambda d: d.__delitem__(slice(len(d) - 1, None)))
    store.writable = False  # as a read-only directory is: the file stays
    assert [store.longest_prefix(ids).n_blocks for _ in range(3)] == [1, 1, 1]
    assert len(warnings_of(caplog)) == 1 and store.stats().corrupt_blocks == 3


def test_a_block_copied_under_another_key_is_rejected(open_store, caplog):
    store, ids, _, keys = _stored(open_store)
    shutil.copyfile(store.files.path(keys[0].digest), store.files.path(keys[1].digest))
    assert store.longest_prefix(ids).n_blocks == 1
    assert "another token chain" in warnings_of(caplog)[0]


def test_a_foreign_models_file_under_our_key_is_rejected(open_store, tmp_path, caplog):
    ids = list(range(2 * BS))
    foreign = open_store(fingerprint(weights="w1"), directory=tmp_path / "foreign")
    put_all(foreign, ids)
    store = open_store()
    put_all(store, ids)
    k_ours, k_theirs = store.keys(ids)[1], foreign.keys(ids)[1]
    shutil.copyfile(foreign.files.path(k_theirs.digest), store.files.path(k_ours.digest))
    assert store.longest_prefix(ids).n_blocks == 1
    assert "fingerprint mismatch" in warnings_of(caplog)[0]


def test_a_file_vanishing_between_lookup_and_get_is_a_miss_without_warning(open_store, caplog):
    store, ids, _, keys = _stored(open_store)
    match = store.longest_prefix(ids)
    store.files.remove(keys[1].digest)  # evicted by another process meanwhile
    assert len(store.get(match.keys)) == 1
    assert warnings_of(caplog) == [] and store.stats().corrupt_blocks == 0


def test_the_documented_reader_reads_a_block(open_store):
    """docs/kv-store-format.md's reader (struct, numpy, xxhash; no prefill) agrees with the store."""
    doc = (Path(__file__).parents[2] / "docs" / "kv-store-format.md").read_text()
    namespace: dict = {}
    exec(doc.split("```python\n")[1].split("```")[0], namespace)
    store = open_store()
    ids = list(range(40, 40 + 2 * BS))
    blocks = put_all(store, ids)
    key = store.keys(ids)[1]
    layers, tokens, kv = namespace["read_block_file"](store.files.path(key.digest))
    assert layers == (0, 1, 2) and tokens == tuple(ids[BS:]) and kv.shape == (3, 2, 2, BS, 8)
    assert torch.equal(torch.from_numpy(kv.copy()), blocks[1])
    assert os.path.basename(store.files.path(key.digest)) == key.digest.hex() + ".kv"


def test_a_restart_finds_the_blocks_and_sweeps_crash_litter(open_store, tmp_path):
    ids = list(range(4 * BS))
    blocks = put_all(open_store(directory=tmp_path), ids)
    shard = Path(open_store(directory=tmp_path).files.path(b"\0" * 32)).parent
    shard.mkdir(exist_ok=True)
    stale, live = shard / ".x.kv.1.2.3.tmp", shard / ".y.kv.1.2.3.tmp"  # a crashed writer's, a running one's
    for p in (stale, live):
        p.write_bytes(b"half a block")
    os.utime(stale, ns=(0, 0))
    store = open_store(directory=tmp_path)  # what a restarted server does: no index to load, only files
    store.flush()  # its first job is a scan of the directory
    got = store.get(store.longest_prefix(ids).keys)
    assert len(got) == 4 and all(torch.equal(g.kv, b) for g, b in zip(got, blocks, strict=True))
    assert not stale.exists() and live.exists()


# ---- capacity, queue, windows ---------------------------------------------------------------------------


def _disk_bytes(store: KVStore) -> int:
    return sum(e.size for e in store.files.scan())


def test_lru_cap_holds_and_keeps_the_recently_used(open_store):
    fp = fingerprint()
    store = open_store(fp, max_bytes=int(10.5 * file_bytes(fp)))
    chains = [[c] * (2 * BS) for c in range(8)]  # 8 chains of 2 blocks: 16 blocks for room for 10
    for c in chains[:4]:
        put_all(store, c)
    hit = store.longest_prefix(chains[0]).keys
    assert len(store.get(hit)) == 2
    store.touch(hit)  # a hit stamps its chain from the first block, as StoreTier.load does: chain 0 is the most recent
    for c in chains[4:]:
        put_all(store, c)
    store.flush()
    assert _disk_bytes(store) <= store.max_bytes
    assert store.longest_prefix(chains[0]).n_blocks == 2  # used recently: kept
    assert store.longest_prefix(chains[1]).n_blocks == 0  # the least recently used: gone
    assert store.longest_prefix(chains[7]).n_blocks == 2
    assert store.stats().evicted_blocks >= 16 - 10


def test_eviction_trims_a_chain_from_its_tail(open_store):
    fp = fingerprint()
    store = open_store(fp, max_bytes=int(4.5 * file_bytes(fp)))
    ids = list(range(6 * BS))
    put_all(store, ids)
    assert 1 <= store.longest_prefix(ids).n_blocks <= 4  # the first blocks survive; no orphaned tails
    assert store.longest_prefix(ids).n_blocks == len(store.files.scan())


def test_a_full_queue_drops_and_counts(open_store):
    fp = fingerprint()
    store = open_store(fp, max_pending_bytes=payload_size(fp, fp.spec.L) - 1)  # not even one block fits
    keys = store.keys(list(range(4 * BS)))
    assert store.put(keys, [block_for(k, fp) for k in keys]) == 0
    store.flush()
    assert store.stats().dropped_blocks == 4 and store.longest_prefix(list(range(4 * BS))).n_blocks == 0


def test_a_busy_writer_queues_the_first_blocks_and_drops_the_rest(open_store):
    import threading

    fp = fingerprint()
    store = open_store(fp, max_pending_bytes=2 * payload_size(fp, fp.spec.L))
    gate = threading.Event()
    store._writer.submit(gate.wait)  # the writer is busy (a slow disk): put must still return at once
    ids = list(range(5 * BS))
    keys = store.keys(ids)
    assert store.put(keys, [block_for(k, fp) for k in keys]) == 2
    gate.set()
    store.flush()
    assert store.stats().dropped_blocks == 3 and store.longest_prefix(ids).n_blocks == 2


def test_layers_needed_by_window():
    windows = (32, None, 100)  # the query at `end` sees end - W + 1 .. end
    assert layers_needed(windows, 2, 64, BS) == {0, 1, 2}  # block 2 is 32..47; layer 0 sees 33..64
    assert layers_needed(windows, 1, 64, BS) == {1, 2}  # block 1 is 16..31: out of layer 0's window
    assert layers_needed(windows, 0, 114, BS) == {1, 2}  # layer 2 sees 15..114: position 15 is in block 0
    assert layers_needed(windows, 0, 115, BS) == {1}  # 16..115: block 0 is out of every window


def test_lookup_uses_blocks_only_as_far_as_their_layers_serve(open_store):
    fp = fingerprint(windows=(32, None, None))  # layer 0 sees its last 32 positions
    store = open_store(fp)
    ids = list(range(7 * BS))
    keys = store.keys(ids)
    # Blocks 0, 1 without layer 0 (a windowed pool had freed them), block 6 without layer 2 (full attention).
    layers = {0: (1, 2), 1: (1, 2), 6: (0, 1)}
    blocks = [
        KVBlock(block_for(k, fp)[list(layers.get(k.index, (0, 1, 2)))], layers.get(k.index, (0, 1, 2))) for k in keys
    ]
    assert store.put(keys, blocks) == 7
    store.flush()
    assert store.longest_prefix(ids).n_blocks == 6  # block 6 lacks a full-attention layer: the match ends before
    assert store.longest_prefix(ids[: 6 * BS]).n_blocks == 6  # from 96 on, layer 0 reads 65..: blocks 4, 5 only
    assert store.longest_prefix(ids[: 4 * BS]).n_blocks == 4  # from 64 on, layer 0 reads 33..: blocks 2, 3
    # From 48 on layer 0 reads 17..48, so block 1's missing layer 0 is needed; a shorter prefix needs block 0's.
    assert store.longest_prefix(ids[: 3 * BS]).n_blocks == 0


# ---- two processes on one directory ----------------------------------------------------------------------


# Forked, not spawned: a fresh interpreter spends seconds importing torch. Each child first sets one torch
# thread, as DataLoader workers do, so it never enters an OpenMP pool inherited from the parent.
_FORK = mp.get_context("fork")


def _in_child(target, queue, *args) -> None:
    torch.set_num_threads(1)
    queue.put(target(*args))


def _run_children(target, *args) -> list:
    """Run `target(*a)` in one process per tuple `a` of `args`, at once; returns what each returned."""
    queue = _FORK.Queue()
    procs = [_FORK.Process(target=_in_child, args=(target, queue, *a)) for a in args]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def _share_child(directory: str, me: int, max_bytes: int) -> dict:
    """Write shared and own chains, read back the shared ones and the other's, check every block bitwise."""
    fp = fingerprint()
    store = KVStore(directory, fp, max_bytes)
    wrong = served = 0
    for r in range(30):
        chains = [[r] * BS + list(range(3 * BS)), [1000 + 100 * me + r] * (3 * BS)]  # shared, then own
        for ids in chains:
            keys = store.keys(ids)
            store.put(keys, [block_for(k, fp) for k in keys])
        store.flush()
        for ids in (chains[0], [1000 + 100 * (1 - me) + r] * (3 * BS), [max(0, r - 1)] * BS + list(range(3 * BS))):
            for got, key in zip(store.get(store.longest_prefix(ids).keys), store.keys(ids), strict=False):
                served += 1
                wrong += not torch.equal(got.kv, block_for(key, fp))
    store.close()
    return {"wrong": wrong, "served": served, "corrupt": store.stats().corrupt_blocks}


def test_two_processes_write_and_read_one_store(tmp_path):
    fp = fingerprint()
    cap = 40 * file_bytes(fp)  # both write 30 x 7 blocks into room for 40: eviction runs under the readers
    results = _run_children(_share_child, (str(tmp_path), 0, cap), (str(tmp_path), 1, cap))
    assert all(r["wrong"] == 0 and r["corrupt"] == 0 for r in results), results
    assert all(r["served"] > 30 for r in results), results  # each read many blocks, its own and the other's
    # Each process rescans (and evicts down to the cap) after writing a tenth of the cap: the directory is over
    # the cap by at most what both wrote since the last scan, a tenth and one block each.
    on_disk = sum(e.size for e in BlockFiles(tmp_path).scan())
    assert on_disk <= 1.2 * cap + 2 * file_bytes(fp)


def _rewrite_child(directory: str, rounds: int) -> int:
    """Replace one block's file over and over with one of two payloads, as two writers racing would."""
    fp = fingerprint()
    key = KVStore(directory, fp, 1 << 30).keys(list(range(BS)))[0]
    files = BlockFiles(directory)
    for i in range(rounds):
        kv = block_for(key, fp) * (1 if i % 2 else -1)
        payload = memoryview(kv.reshape(-1).view(torch.uint8).numpy())
        files.write(key.digest, [encode_header(fp, key, (0, 1, 2), payload), payload], i)
    return rounds


def test_a_reader_never_sees_half_a_block(open_store, tmp_path):
    store = open_store(directory=tmp_path)
    key = store.keys(list(range(BS)))
    plus = block_for(key[0], store.fp)
    put_all(store, list(range(BS)))
    queue = _FORK.Queue()
    writer = _FORK.Process(target=_in_child, args=(_rewrite_child, queue, str(tmp_path), 300))
    writer.start()
    seen = 0
    while writer.is_alive() or seen == 0:
        for got in store.get(key):
            assert torch.equal(got.kv, plus) or torch.equal(got.kv, -plus)
            seen += 1
    assert queue.get(timeout=60) == 300
    writer.join()
    assert writer.exitcode == 0
    assert seen > 0 and store.stats().corrupt_blocks == 0


# ---- directories that refuse ------------------------------------------------------------------------------


def _degraded(directory: str, held: list[int], new: list[int]) -> dict:
    """Open a store on a directory that refuses writes, look up `held` (stored before), put `new`: what
    happened, warnings included. Raises nothing if the store is right."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("prefill.kv_store").addHandler(handler)
    fp = fingerprint()
    try:
        store = KVStore(directory, fp, 1 << 30)
        got = store.get(store.longest_prefix(held).keys)
        keys = store.keys(new)
        queued = store.put(keys, [block_for(k, fp) for k in keys])
        store.flush()
        found_new = store.get(store.longest_prefix(new).keys)
        store.close()
    finally:
        logging.getLogger("prefill.kv_store").removeHandler(handler)
    litter = [p.name for p in Path(directory).rglob("*.tmp")]
    return {
        "warnings": messages,
        "held": len(got),
        "held_ok": all(torch.equal(g.kv, block_for(k, fp)) for g, k in zip(got, store.keys(held), strict=False)),
        "queued": queued,
        "new": len(found_new),
        "new_ok": all(torch.equal(g.kv, block_for(k, fp)) for g, k in zip(found_new, keys, strict=False)),
        "writable": store.writable,
        "litter": litter,
    }


HELD, NEW = list(range(3 * BS)), list(range(7, 7 + 30 * BS))


def test_an_unusable_directory_is_no_store(tmp_path, caplog):
    (tmp_path / "a-file").write_text("not a folder")
    r = _degraded(str(tmp_path / "a-file" / "store"), HELD, NEW)
    assert (r["held"], r["queued"], r["new"]) == (0, 0, 0)
    (msg,) = r["warnings"]
    assert "unusable" in msg and "running without a KV store" in msg


def test_a_file_size_limit_stops_writes_with_one_warning(open_store, tmp_path):
    """The kernel refuses every block file (RLIMIT_FSIZE below one block): the writer stops, nothing raises."""
    put_all(open_store(directory=tmp_path), HELD)

    def limited(directory):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        return _degraded(directory, HELD, NEW)

    (r,) = _run_children(limited, (str(tmp_path),))
    assert (r["held"], r["held_ok"], r["new"], r["writable"]) == (3, True, 0, False)
    (msg,) = r["warnings"]
    assert "File too large" in msg and "storing none" in msg
    assert r["litter"] == []  # the half-written temporary file was removed


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def private_mounts(tmp_path_factory):
    """A read-only and a full (64 KiB tmpfs) store directory, in a private mount namespace (unshare), each
    opened by one child interpreter that reports what _degraded saw. Skipped where unshare is not allowed."""
    if not _can_unshare():
        pytest.skip("unshare -rm (user and mount namespaces) is not available here")
    root = tmp_path_factory.mktemp("mounts")
    ro, full = root / "ro", root / "full"
    with KVStore(ro, fingerprint(), 1 << 30) as store:
        put_all(store, HELD)
    full.mkdir()
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_kv_store as t
        print(json.dumps({{"ro": t._degraded({str(ro)!r}, t.HELD, t.NEW),
                          "full": t._degraded({str(full)!r}, t.HELD, t.NEW)}}))
    """)
    setup = f"mount --bind {ro} {ro} && mount -o remount,ro,bind {ro} && mount -t tmpfs -o size=64k tmpfs {full}"
    out = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f'{setup} && exec "$0" -c "$1"', sys.executable, code],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_read_only_directory_serves_what_it_holds(private_mounts):
    r = private_mounts["ro"]
    assert (r["held"], r["held_ok"], r["queued"], r["new"], r["writable"]) == (3, True, 0, 0, False)
    (msg,) = r["warnings"]
    assert "cannot write (Read-only file system): loading its 3 blocks, storing none" in msg


def test_a_full_disk_keeps_the_newest_blocks_that_fit_and_goes_on_writing(private_mounts):
    """64 KiB of tmpfs: the cap is what the disk holds (one warning says so), and a chain of 30 blocks keeps the
    head that fits (LRU trims it from its tail): served, verified, and the store still writes."""
    r = private_mounts["full"]
    assert r["held"] == 0 and r["queued"] == 30 and r["writable"]
    assert 1 <= r["new"] < 30 and r["new_ok"]
    (msg,) = r["warnings"]
    assert "not the 1024 MiB asked" in msg and "free" in msg
    assert r["litter"] == []


# ---- the bandwidth probe -----------------------------------------------------------------------------------


def test_probe_measures_both_tiers_and_leaves_nothing(open_store):
    store = open_store()
    bw = probe_bandwidth(store, nbytes=256 << 10)
    assert bw.n_blocks == -(-(256 << 10) // file_bytes(store.fp)) and bw.nbytes == bw.n_blocks * file_bytes(store.fp)
    assert bw.ram_bytes_per_s > 0 and (bw.disk_bytes_per_s is None or bw.disk_bytes_per_s > 0)
    assert store.files.scan() == [] and store.stats().hit_blocks == 0  # probe blocks removed, counters untouched


def test_resident_share_says_whether_a_load_reads_memory_or_the_disk(open_store):
    store = open_store()
    keys = store.keys(list(range(64)))
    store.put(keys, [torch.randn(store.fp.block_shape()) for _ in keys])
    store.flush()
    digests = [k.digest for k in keys]
    assert len(store.get(keys)) == 4 and store.files.resident_share(digests) == 1.0  # just written and read
    assert store.files.resident_share([b"\0" * 32]) is None  # no such file: nothing to say
    os.sync()  # written back first: the kernel keeps dirty pages when asked to drop them
    drop_from_page_cache([store.files.path(d) for d in digests])
    after = store.files.resident_share(digests)
    if after == 1.0:
        pytest.skip("this file system keeps a file's pages when asked to drop them (tmpfs)")
    assert after == 0.0
