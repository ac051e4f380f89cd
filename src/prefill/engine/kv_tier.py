"""The KV store as the tier below the prefix cache: stored blocks loaded into a request's pool blocks when it is
admitted, and a finished request's whole blocks handed to the store's background writer.

At admission (prefill.engine.scheduler), after the RAM prefix cache's match, `admit` looks up the longest
stored prefix beyond it (whole 16-token blocks of the request's ids, the block holding the last prompt token
included), asks the cost model whether loading those tokens is faster than prefilling them
(prefill.costmodel.kv_store.compute_or_load), and if so copies their K/V into freshly reserved pool blocks of
every layer and marks them cached up to the reusable ids: the last prompt token is always computed, as a
1-token prefill, and gives the first token's logits (its K/V, loaded, is written again by that prefill). When a
request leaves (`save`), the whole blocks the store lacks are cloned out of the pool (one copy, on the loop's
thread) and queued; serialising, checksumming and writing run on the store's writer thread.
Blocks that the prefix cache evicts later need no write of their own: every block in it came from a request
that stored its blocks when it left (a preempted one, when it resumes and leaves), so evictions only cost a
reload from the store.

Sliding-window layers (Gemma 3's local layers) store only the blocks their window still needs: a stored block
holds every full-attention layer and the windowed layers whose group still held it when it was written
(costs.kv_window_start: what a continuation from the sequence's last block boundary reads). Their groups give
blocks back as decode goes on, so a windowed model's prompt is also stored when its prefill ends (`prefilled`):
a repeated prompt needs the window at the prompt's end, long gone when the request leaves. A load into such a
model starts each windowed group's table where the continuation's window begins (SeqKV.open_windows_at).

A request with a cache salt (vLLM's cache_salt) neither loads nor saves: the store's keys have no salt, and its
prefixes stay shared only with requests of the same salt, in the prefix cache.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from prefill.costmodel.kv_store import LoadDecision, compute_or_load, split_ends
from prefill.engine.kv_copy import copy_into, copy_layers_into, copy_layers_out, copy_out
from prefill.engine.kv_store import (
    BlockKey,
    Fingerprint,
    KVBlock,
    KVStore,
    StoreBandwidth,
    probe_bandwidth,
    weights_digest,
)
from prefill.engine.kv_tail import StoreUse, TailLoader
from prefill.engine.kvcache import SeqKV
from prefill.errors import BadInput

if TYPE_CHECKING:
    from prefill.engine.request import Request

log = logging.getLogger("prefill.kv_store")
PrefillSeconds = Callable[[int, int, int | None], float]  # (n, past, chunk_size) -> predicted seconds
PROBE_BYTES = 16 << 20  # enough files for a steady read rate, a fraction of a second to write and read
STAGE_BYTES = 4 << 20  # a load reads this many bytes of block files at a time, then copies them into the pool


class StoreTier:
    """A KVStore under a KV pool's full-attention blocks, with its measured load rate.

    `prefill_seconds(n, past, chunk_size)`: the predicted seconds of a prefill of n tokens after `past` cached
    ones (the engine's time model). `force` ("load" or "both") overrides the decision where a stored prefix is
    found (tests and benchmarks of each path).
    """

    def __init__(
        self, store: KVStore, bandwidth: StoreBandwidth, prefill_seconds: PrefillSeconds, force: str | None = None
    ) -> None:
        if force not in (None, "load", "both"):
            raise BadInput(f"a KV store can be forced to 'load' or 'both', not {force!r}")
        self.store, self.bandwidth = store, bandwidth
        self.prefill_seconds, self.force = prefill_seconds, force
        self.block_size = store.fp.block_size
        self._staging: bytearray | None = None  # STAGE_BYTES of block files, reused by every load
        self._tails: TailLoader | None = None  # both ends: the background loader, started on first need

    @classmethod
    def open(
        cls,
        directory: str | Path,
        max_bytes: int,
        model: torch.nn.Module,
        dtype: str | torch.dtype,
        prefill_seconds: PrefillSeconds,
        force: str | None = None,
    ) -> StoreTier | None:
        """The store at `directory` for `model` (fingerprinted from its weights, spec and K/V dtype), its load rate
        probed; None, with one warning, when the directory cannot be used."""
        spec = model.spec
        fp = Fingerprint(weights_digest(model.state_dict()), spec, str(dtype).removeprefix("torch."))
        store = KVStore(directory, fp, max_bytes)
        bandwidth = probe_bandwidth(store, PROBE_BYTES)  # load-only: over the blocks it holds
        if bandwidth is None:
            store.close()
            if store.files is not None:  # else the store said why already
                log.warning("kv store %s: no load rate could be measured there; running without a KV store", directory)
            return None
        return cls(store, bandwidth, prefill_seconds, force)

    @property
    def load_bytes_per_s(self) -> float:
        """The rate a load is predicted at: the disk's (a block may have left the page cache), else the RAM's."""
        return self.bandwidth.disk_bytes_per_s or self.bandwidth.ram_bytes_per_s

    # ---- admission ----
    def admit(self, req: Request, seq: SeqKV, fits: Callable[[list[int]], bool], chunk_size: int | None) -> None:
        """Extend `seq` (holding a RAM-cached prefix, or nothing) with the stored blocks of req's reusable ids
        that follow, when loading them is predicted faster and the pool has blocks for them and the first chunk
        after them (`fits`: the scheduler's check). Records the decision in req.gen.kv_store."""
        if req.cache_salt is not None:
            return
        target = req.cached_target

        def room(end: int) -> bool:
            return fits(seq.reserve_needs(min(target, end + (chunk_size or target))))

        use = self.load(req.all_ids()[:target], seq, chunk_size, room, limit=len(req.reusable_ids()), both=True)
        if use is not None:
            req.gen.kv_store = use

    # ---- both ends: the step loop's side ----
    def prefill_target(self, req: Request, target: int) -> int:
        """Where req's prefill may go now: `target`, or the split while its tail is still loading (a tail that
        is in is applied here, when the head has reached it)."""
        use = req.gen.kv_store
        if use is None or use.pending is None:
            return target
        if req.seq.length >= use.pending.at and use.pending.done():
            self._settle(req)
            return target
        return use.pending.at

    def wait_for_tail(self, running: list[Request]) -> bool:
        """Block until the tail of one request whose head is computed is in (the step had nothing else to run);
        False when no request waits on one."""
        for req in running:
            use = req.gen.kv_store
            if use is not None and use.pending is not None and req.seq is not None and req.seq.length >= use.pending.at:
                use.pending.wait()
                return True
        return False

    def abandon(self, req: Request) -> None:
        """req lets go of its blocks (preempted, finished, cancelled): its tail's copies end first, unused."""
        use = req.gen.kv_store
        if use is not None and use.pending is not None:
            use.pending.wait()
            use.pending = None

    def _settle(self, req: Request) -> None:
        use, pending = req.gen.kv_store, req.gen.kv_store.pending
        gained = pending.apply(req.seq)
        use.pending = None
        use.loaded_tokens += gained
        use.loaded_bytes += sum(pending.sizes[: pending.wait()]) if gained else 0
        use.load_s = pending.seconds
        if not req.n_preemptions:  # as Request.start counts a first admission's cached positions only
            req.gen.cached_tokens += gained

    def load(
        self,
        ids: list[int],
        seq: SeqKV,
        chunk_size: int | None = None,
        room: Callable[[int], bool] = lambda end: True,
        limit: int | None = None,
        both: bool = False,
    ) -> StoreUse | None:
        """Extend `seq` past its `seq.length` cached positions with the stored whole blocks of `ids` that follow,
        up to `limit` positions (default: all of ids), when the cost model predicts loading them faster than
        computing them and `room(end)` says the pool can take positions up to `end`. A block that crosses
        `limit` is loaded whole and the positions after `limit` are recomputed (a prompt's last token, whose
        logits give the first token: 1 token to prefill instead of a block). With `both` (a step loop's
        admission), loading the tail while the head is computed is considered too: then the tail's load is
        started and left pending (prefill_target). Returns what was decided and loaded (None: not a whole block
        to look for)."""
        past, bs = seq.length, self.block_size
        limit = len(ids) if limit is None else min(limit, len(ids))
        ids = ids[: -(-limit // bs) * bs]  # the blocks that hold a position before `limit`
        if limit <= past or len(ids) < past + bs:
            return None
        bad0 = self.store.stats().corrupt_blocks
        match = self.store.longest_prefix(ids, limit)
        keys, sizes = match.keys[past // bs :], match.sizes[past // bs :]
        windowed = len(seq.pool.groups) > 1
        if windowed and past:  # pragma: no cover - no prefix cache shares a windowed model's blocks
            keys = ()
        usable = min(limit, past + len(keys) * bs) - past  # positions the blocks save computing
        if not keys:
            return StoreUse(LoadDecision("compute", 0, past, 0, 0.0, 0.0), bad_blocks=self._bad_since(bad0))
        decision = self._decide(usable, past, sizes, chunk_size, both and not windowed)
        use = StoreUse(decision, bad_blocks=self._bad_since(bad0))
        end = past + len(keys) * bs
        if windowed:
            seq.open_windows_at(past + usable)
        if decision.choice == "compute" or not room(end):
            if windowed:
                seq.free()  # nothing reserved yet: back to empty tables from position 0
            return use
        self.store.touch(match.keys)  # used: the whole chain from its first block, newest first (LRU)
        j = decision.split // bs if decision.choice == "both" else 0  # blocks computed from the head
        use.resident_share = self.store.files.resident_share([k.digest for k in keys[j:]])  # RAM tier, or disk
        t0 = time.perf_counter()
        seq.reserve(end)
        if decision.choice == "both":
            self._tails = self._tails or TailLoader()
            use.pending = self._tails.start(self, keys[j:], sizes[j:], seq, past + j * bs, past + usable)
            return use
        loaded, self._staging = self.load_blocks(keys, seq, past, self._staging)
        seq.length = min(limit, past + loaded * bs)
        if loaded < len(keys) and windowed:  # a bad block cut the chain: its windows begin elsewhere
            seq.free()
            loaded = 0
        use.loaded_tokens, use.loaded_bytes = seq.length - past, sum(sizes[:loaded])
        use.load_s = time.perf_counter() - t0
        use.bad_blocks = self._bad_since(bad0)
        return use

    def _decide(
        self, usable: int, past: int, sizes: tuple[int, ...], chunk_size: int | None, both: bool
    ) -> LoadDecision:
        """The cost model's compute-or-load for the `usable` positions after `past` that the blocks of `sizes`
        bytes hold (with `both`, loading the tail while the head is computed is weighed too), or what `force`
        asks for."""
        bs, rate = self.block_size, self.load_bytes_per_s
        prefill_s = lambda n, p: self.prefill_seconds(n, p, chunk_size)  # noqa: E731
        cpu = self.bandwidth.cpu_bytes_per_s  # a load's CPU work (verifying, copying), which the head loses
        decision = compute_or_load(usable, past, sum(sizes), rate, prefill_s, sizes if both else (), bs, cpu)
        if self.force == "both" and both and len(sizes) >= 2:
            split, both_s = split_ends(usable, past, sizes, rate, prefill_s, bs, cpu)
            split = split if split < usable else len(sizes) // 2 * bs  # the head and the tail, a block each at least
            decision = dataclasses.replace(decision, choice="both", split=split, both_s=both_s)
        elif self.force is not None:
            decision = dataclasses.replace(decision, choice="load")
        return decision

    def load_blocks(
        self,
        keys: tuple[BlockKey, ...],
        seq: SeqKV,
        start: int,
        staging: bytearray | None = None,
        copy: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    ) -> tuple[int, bytearray]:
        """Read `keys`' blocks a staging buffer's worth at a time (STAGE_BYTES, reused: its pages are faulted in
        once and stay in cache between the read and the copy) and copy each batch into seq's pool slots from
        position `start` (with `copy(dst, src)`, default torch's); stops at the first missing or bad block.
        Returns the blocks loaded and the staging buffer (made here on first use: pass it back next time)."""
        per_batch = max(1, STAGE_BYTES // self.store.slot_bytes)
        if staging is None:
            staging = bytearray(per_batch * self.store.slot_bytes)
        loaded = 0
        for i in range(0, len(keys), per_batch):
            batch = keys[i : i + per_batch]
            blocks = self.store.get(batch, staging)
            at = start + loaded * self.block_size
            if len(seq.pool.groups) == 1:
                copy_into(seq, at, self._stacked(blocks, staging), copy)
            else:
                copy_layers_into(seq, at, blocks)
            loaded += len(blocks)
            if len(blocks) < len(batch):
                break
        return loaded, staging

    def _stacked(self, blocks: list[KVBlock], staging: bytearray) -> torch.Tensor:
        """The blocks as one tensor [n, L, 2, H_kv, bs, d_head]: a strided view of the staging buffer when get()
        read block i into slot i (each holds every layer), else a stacked copy."""
        if not blocks:
            return torch.empty(0)
        first, slot = blocks[0].kv, self.store.slot_bytes
        whole = torch.frombuffer(staging, dtype=torch.uint8).view(first.dtype)
        if any(
            b.kv.shape != first.shape or b.kv.data_ptr() != first.data_ptr() + i * slot for i, b in enumerate(blocks)
        ):
            return torch.stack([b.kv for b in blocks])
        offset = (first.data_ptr() - whole.data_ptr()) // first.element_size()
        return whole.as_strided((len(blocks), *first.shape), (slot // first.element_size(), *first.stride()), offset)

    def _bad_since(self, count: int) -> int:
        return self.store.stats().corrupt_blocks - count

    # ---- leaving ----
    def save(self, req: Request) -> int:
        """Queue the whole blocks of req's cached positions that the store lacks (save_seq); none of a salted
        request."""
        return self.save_seq(req.all_ids(), req.seq) if req.cache_salt is None else 0

    def prefilled(self, req: Request) -> int:
        """req's prompt is in the cache: a windowed model stores its blocks now (the window at the prompt's end
        is what a repeated prompt needs, and decode gives it back); a full-attention one waits for `save`."""
        return self.save(req) if len(req.seq.pool.groups) > 1 else 0

    def save_seq(self, ids: list[int], seq: SeqKV) -> int:
        """Queue the whole blocks of `seq`'s cached positions (holding `ids`, from position 0) that the store
        lacks; returns how many were queued. The only work on the caller's thread is one copy out of the pool."""
        keys = self.store.keys(ids[: seq.length])
        if len(seq.pool.groups) > 1:
            return self._save_layers(keys, seq)
        have = self.store.stored_blocks(keys)
        if have == len(keys) or not self.store.writable:
            return 0
        kv = copy_out(seq, have * self.block_size, len(keys) * self.block_size)  # [L, 2, H_kv, n * bs, d_head]
        L, _, H_kv, _, d_head = kv.shape
        per_block = kv.view(L, 2, H_kv, len(keys) - have, self.block_size, d_head)
        blocks = [per_block[:, :, :, i] for i in range(len(keys) - have)]  # views; the writer makes them contiguous
        return self.store.put(keys[have:], blocks, head=keys[:have])

    def _save_layers(self, keys: list[BlockKey], seq: SeqKV) -> int:
        """save_seq for a model with windowed layers: block i with the layers whose group still holds it, unless
        the store has a file with at least those (a file with fewer is merged with, on the writer's thread)."""
        pool, bs = seq.pool, self.block_size
        held = [tuple(i for i in range(pool.L) if b * bs >= seq.first_held(pool.group_of[i])) for b in range(len(keys))]
        have = self.store.stored_blocks(keys, held)
        if have == len(keys) or not self.store.writable:
            return 0
        blocks = [KVBlock(copy_layers_out(seq, b, held[b]), held[b]) for b in range(have, len(keys))]
        return self.store.put(keys[have:], blocks, head=keys[:have])

    def flush(self) -> None:
        """Wait for the queued writes (shutdown, tests, benchmarks)."""
        self.store.flush()

    def close(self) -> None:
        if self._tails is not None:
            self._tails.close()
        self.store.close()
