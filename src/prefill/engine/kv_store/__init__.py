"""A KV store on disk below the prefix cache: K/V blocks that outlive the RAM pool and the process.

fingerprint (what K/V depend on) -> keys (the hash chain) -> format (one block's bytes) -> files (the
directory, atomic writes, LRU by mtime) -> writer (the background thread) -> store (the API) -> probe (load
rates). The on-disk format is documented in docs/kv-store-format.md.
"""

from prefill.engine.kv_store.fingerprint import ENGINE_KV_VERSION, Fingerprint, weights_digest
from prefill.engine.kv_store.format import FORMAT_VERSION, BlockError
from prefill.engine.kv_store.keys import BlockKey, layers_needed
from prefill.engine.kv_store.probe import StoreBandwidth, probe_bandwidth
from prefill.engine.kv_store.store import KVBlock, KVStore, StoreMatch, StoreStats

__all__ = [
    "ENGINE_KV_VERSION",
    "FORMAT_VERSION",
    "BlockError",
    "BlockKey",
    "Fingerprint",
    "KVBlock",
    "KVStore",
    "StoreBandwidth",
    "StoreMatch",
    "StoreStats",
    "layers_needed",
    "probe_bandwidth",
    "weights_digest",
]
