"""The prefix cache: blocks of K/V from earlier prompts, shared by reference, so a common prefix is prefilled once.

A request whose prompt starts with tokens seen before (a system prompt, a chat history) starts its block table
with the cached blocks of that prefix (no copy: the pool counts one more holder) and prefills only the rest.
K and V at a position depend only on the tokens up to it, so the result equals a cold prefill (the proofs'
tolerance). It shares the blocks of full-attention layers; a model with sliding-window layers (whose blocks are
given back as they leave the window) is served without it. Blocks of `block_size` tokens form a tree (a radix
tree over blocks, as in SGLang's
RadixAttention and vLLM's block hashing): a child extends its parent's prefix by one block. The tree's share of
the pool is bounded; least-recently-used leaves that no request holds are evicted first.

Used by the step loop's thread only, so it needs no lock.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from prefill.engine.kvcache import KVPool, SeqKV


@dataclass(frozen=True)
class PrefixMatch:
    """A cached prefix: `n_tokens` tokens held in pool blocks `blocks` (root first)."""

    blocks: tuple[int, ...]
    n_tokens: int


class PrefixCache(ABC):
    """What the step loop needs of a prefix cache (swappable: a radix tree, a hash table, none)."""

    @abstractmethod
    def match_prefix(self, ids: list[int], salt: str | None = None) -> PrefixMatch:
        """The longest cached prefix of `ids` in whole blocks (marks it recently used), among the prefixes
        inserted with the same `salt` (vLLM's cache_salt: requests of other salts never share blocks)."""

    @abstractmethod
    def insert_prefix(self, ids: list[int], seq: SeqKV, salt: str | None = None) -> int:
        """Share the whole blocks of `ids` that `seq` holds (its first positions), under `salt`; returns tokens
        newly cached."""

    @abstractmethod
    def evict(self, n_blocks: int) -> int:
        """Give back up to `n_blocks` blocks no request holds (least recently used first); returns blocks freed."""

    @property
    @abstractmethod
    def n_blocks(self) -> int:
        """Blocks the cache holds."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of K/V the cache holds (some may be shared with running requests)."""


@dataclass(eq=False)
class _Node:
    """One block of tokens in the tree, and the pool block holding their K/V."""

    tokens: tuple[int | str, ...]  # the first block's key starts with its salt, if any
    parent: _Node | None
    block: int = -1
    children: dict[tuple[int | str, ...], _Node] = field(default_factory=dict)
    last_used: int = 0


class RadixPrefixCache(PrefixCache):
    """A tree of token blocks over a KVPool, at most `capacity_bytes` of blocks, LRU eviction of free leaves."""

    def __init__(self, pool: KVPool, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.pool = pool
        self.blocks = pool.managers[0]  # the full-attention group's blocks
        self.block_size = pool.block_size
        self.enabled = len(pool.groups) == 1
        self.max_blocks = capacity_bytes // pool.bytes_per_block(0) if self.enabled else 0
        self._root = _Node((), None)
        self._clock = itertools.count(1)
        self._n_blocks = 0

    @property
    def n_blocks(self) -> int:
        return self._n_blocks

    @property
    def nbytes(self) -> int:
        return self._n_blocks * self.pool.bytes_per_block(0)

    def _keys(self, ids: list[int], salt: str | None) -> list[tuple[int | str, ...]]:
        """One key a whole block; a salt goes in front of the first, so every block after it differs too (as vLLM
        puts the salt in the first block's hash)."""
        bs = self.block_size
        keys: list[tuple[int | str, ...]] = [tuple(ids[i : i + bs]) for i in range(0, len(ids) - bs + 1, bs)]
        if salt is not None and keys:
            keys[0] = (salt, *keys[0])
        return keys

    def match_prefix(self, ids: list[int], salt: str | None = None) -> PrefixMatch:
        node, blocks, now = self._root, [], next(self._clock)
        for key in self._keys(ids, salt):
            node = node.children.get(key)
            if node is None:
                break
            node.last_used = now
            blocks.append(node.block)
        return PrefixMatch(tuple(blocks), len(blocks) * self.block_size)

    def insert_prefix(self, ids: list[int], seq: SeqKV, salt: str | None = None) -> int:
        if self.max_blocks == 0:
            return 0
        node, now, added = self._root, next(self._clock), 0
        for i, key in enumerate(self._keys(ids[: seq.length], salt)):
            child = node.children.get(key)
            if child is None:
                if self._n_blocks >= self.max_blocks and self.evict(1) == 0:
                    break  # full of blocks that running requests still hold
                child = _Node(key, node, seq.blocks[i])
                self.blocks.retain([child.block])  # the tree is one more holder: no copy
                node.children[key] = child
                self._n_blocks += 1
                added += self.block_size
            child.last_used = now
            node = child
        return added

    def _free_leaves(self) -> list[_Node]:
        """Leaves whose block only the tree holds."""
        out, stack = [], [self._root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node is not self._root and self.blocks.refs[node.block] == 1:
                out.append(node)
        return out

    def evict(self, n_blocks: int) -> int:
        freed = 0
        while freed < n_blocks:
            leaves = self._free_leaves()
            if not leaves:
                break
            # Oldest leaves first; removing a leaf may expose its parent as the next candidate.
            for leaf in sorted(leaves, key=lambda b: b.last_used)[: n_blocks - freed]:
                del leaf.parent.children[leaf.tokens]
                self.blocks.release([leaf.block])
                self._n_blocks -= 1
                freed += 1
        return freed
