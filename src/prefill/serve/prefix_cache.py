"""The prefix cache: K/V of earlier prompts, kept per block of tokens, so a shared prefix is prefilled once.

A request whose prompt starts with tokens seen before (a system prompt, a chat history) copies the
longest cached prefix's K/V into its own KVCache and prefills only the rest. K and V at a position
depend only on the tokens up to it, so the result equals a cold prefill (tests check float32 logits
within 1e-4). Blocks of `block_size` tokens form a tree (a radix tree over blocks, as in SGLang's
RadixAttention and vLLM's block hashing): a child extends its parent's prefix by one block. The tree is
bounded in bytes and evicts least-recently-used leaves first.

Used by the scheduler's single worker thread only, so it needs no lock.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from prefill.kvcache import KVCache


class PrefixCache(ABC):
    """What the scheduler needs of a prefix cache (swappable: a radix tree, a hash table, none)."""

    @abstractmethod
    def match_prefix(self, ids: list[int]) -> PrefixMatch:
        """The longest cached prefix of `ids` (marks it recently used)."""

    @abstractmethod
    def insert_prefix(self, ids: list[int], cache: KVCache) -> int:
        """Store the K/V of `ids` (cache positions 0..len(ids)-1); returns tokens newly stored."""

    @abstractmethod
    def evict(self, nbytes: int) -> int:
        """Free at least `nbytes` (least recently used first, as far as possible); returns bytes freed."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of K/V held."""


@dataclass(eq=False)
class _Block:
    """One block of `block_size` tokens: its K and V for every layer."""

    tokens: tuple[int, ...]
    parent: _Block | None
    k: torch.Tensor | None = None  # [L, H_kv, block_size, d_head]
    v: torch.Tensor | None = None  # [L, H_kv, block_size, d_head]
    children: dict[tuple[int, ...], _Block] = field(default_factory=dict)
    last_used: int = 0

    @property
    def nbytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()


@dataclass(frozen=True)
class PrefixMatch:
    """A cached prefix: `n_tokens` tokens held in `blocks` (root first)."""

    blocks: tuple[_Block, ...]
    block_size: int

    @property
    def n_tokens(self) -> int:
        return len(self.blocks) * self.block_size

    def copy_into(self, cache: KVCache) -> None:
        """Write the prefix's K/V into positions 0..n_tokens-1 of an empty `cache` (batch row 0)."""
        bs = self.block_size
        for i, block in enumerate(self.blocks):
            for layer in range(len(cache.k)):
                cache.k[layer][0, :, i * bs : (i + 1) * bs].copy_(block.k[layer])
                cache.v[layer][0, :, i * bs : (i + 1) * bs].copy_(block.v[layer])
        cache.length = self.n_tokens


class RadixPrefixCache(PrefixCache):
    """A tree of token blocks, bounded by `capacity_bytes`, LRU eviction of leaves."""

    def __init__(self, capacity_bytes: int, block_size: int = 16) -> None:
        if block_size < 1 or capacity_bytes < 0:
            raise ValueError("block_size must be >= 1 and capacity_bytes >= 0")
        self.capacity_bytes = capacity_bytes
        self.block_size = block_size
        self._root = _Block((), None)
        self._clock = itertools.count(1)
        self._nbytes = 0
        self.n_blocks = 0

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def _blocks_of(self, ids: list[int]) -> list[tuple[int, ...]]:
        bs = self.block_size
        return [tuple(ids[i : i + bs]) for i in range(0, len(ids) - bs + 1, bs)]

    def match_prefix(self, ids: list[int]) -> PrefixMatch:
        node, path, now = self._root, [], next(self._clock)
        for key in self._blocks_of(ids):
            node = node.children.get(key)
            if node is None:
                break
            node.last_used = now
            path.append(node)
        return PrefixMatch(tuple(path), self.block_size)

    def insert_prefix(self, ids: list[int], cache: KVCache) -> int:
        if self.capacity_bytes == 0:
            return 0
        bs, node, now, added = self.block_size, self._root, next(self._clock), 0
        for i, key in enumerate(self._blocks_of(ids[: cache.length])):
            child = node.children.get(key)
            if child is None:
                a, b = i * bs, (i + 1) * bs
                k = torch.stack([cache.k[layer][0, :, a:b] for layer in range(len(cache.k))])  # [L,H_kv,bs,d]
                v = torch.stack([cache.v[layer][0, :, a:b] for layer in range(len(cache.v))])  # [L,H_kv,bs,d]
                child = _Block(key, node, k, v)
                node.children[key] = child
                self._nbytes += child.nbytes
                self.n_blocks += 1
                added += bs
            child.last_used = now
            node = child
        if self._nbytes > self.capacity_bytes:
            self.evict(self._nbytes - self.capacity_bytes)
        return added

    def _leaves(self) -> list[_Block]:
        out, stack = [], [self._root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self._root:
                out.append(node)
        return out

    def evict(self, nbytes: int) -> int:
        freed = 0
        while freed < nbytes:
            leaves = self._leaves()
            if not leaves:
                break
            # Oldest leaves first; removing a leaf may expose its parent as the next candidate.
            for leaf in sorted(leaves, key=lambda b: b.last_used):
                if freed >= nbytes:
                    break
                del leaf.parent.children[leaf.tokens]
                freed += leaf.nbytes
                self._nbytes -= leaf.nbytes
                self.n_blocks -= 1
        return freed

    def clear(self) -> None:
        """Drop every block."""
        self.evict(self._nbytes)
