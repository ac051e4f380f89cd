"""A restart of the real server on a warm KV store: the second app (a fresh engine object, pool and store, the same
directory) serves the repeated prompt's prefix from the store's files, says so in usage, timings and /metrics, and
answers the same text; a store smaller than one prompt keeps a usable prefix; a full disk keeps no probe file."""

from __future__ import annotations

import contextlib
import os
import re

import pytest
from fastapi.testclient import TestClient

from prefill.engine.llm import DEFAULT_KV_STORE_MB, Engine
from prefill.server.app import ServeConfig, create_app, model_id_of
from tmpfs import mount_tmpfs, unmount

pytestmark = pytest.mark.slow
PROMPT = "A short history of Paris for a school essay, in plain sentences. " * 8


def served(smollm_native, directory, salt: str | None = None) -> tuple[dict, str]:
    """One server's life on `directory`: start, one greedy completion (with `salt` as its cache_salt, if given),
    /metrics, shut down (the store flushed)."""
    engine = Engine(smollm_native.runner, smollm_native.tokenizer, smollm_native.source)
    engine.attach_kv_store(directory, 256, force="load")  # the decision itself: tests/engine/test_kv_tier.py
    cfg = ServeConfig(model_id_of(engine), kv_cache_mb=256, chunk_size=64)
    with TestClient(create_app(engine, cfg)) as client:
        body = {"model": cfg.model_id, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
        if salt is not None:
            body["cache_salt"] = salt
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json(), client.get("/metrics").text


def sample(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def test_a_restarted_server_serves_the_prefix_from_the_store(smollm_native, tmp_path):
    cold, cold_metrics = served(smollm_native, tmp_path)
    warm, warm_metrics = served(smollm_native, tmp_path)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    P = warm["usage"]["prompt_tokens"]
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (P - 1) // 16 * 16 > 0  # every whole block before the last prompt token
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
    store = warm["timings"]["kv_store"]
    assert store["choice"] == "load" and store["loaded_tokens"] == cached and store["bad_blocks"] == 0
    assert store["predicted_load_s"] > 0 and store["predicted_compute_s"] > 0
    assert sample(cold_metrics, "prefill_kv_store_hits_total") == 0
    assert sample(warm_metrics, "prefill_kv_store_hits_total") == 1
    assert sample(warm_metrics, "prefill_kv_store_bytes_loaded_total") == store["loaded_bytes"]
    assert sample(warm_metrics, "prefill_kv_store_seconds_saved_predicted_total") == pytest.approx(
        store["predicted_saved_s"]
    )
    assert sample(warm_metrics, "prefill_kv_store_bad_blocks_total") == 0


def test_a_salted_request_neither_saves_to_the_store_nor_loads_from_it(smollm_native, tmp_path):
    """The store's keys have no salt: a salted request stays out of it, both ways."""
    salted, _ = served(smollm_native, tmp_path, salt="one")
    plain, _ = served(smollm_native, tmp_path)  # nothing was stored by the salted request
    again, _ = served(
        smollm_native, tmp_path, salt="one"
    )  # the plain one stored its blocks; a salted one does not read them
    for reply in (salted, plain, again):
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert reply["choices"][0]["text"] == plain["choices"][0]["text"]
    assert plain["timings"]["kv_store"]["choice"] is not None  # the plain one looked in the store (and missed)
    assert again["timings"].get("kv_store") is None


def test_a_restart_on_a_50_mb_tmpfs_hits(smollm_native, tmp_path):
    """Issue 44's repro at half its size: the default --kv-store-mb (4096) on a 50 MB disk, 4 prompts of about 500
    tokens (31 blocks of 737 KB each: 91 MB, more than the disk), a restart, the same prompts again, newest first
    (in the order sent, LRU over a working set twice its size evicts each prompt just before it comes back). The
    store holds what fits under its cap and the probe finds its room: the second life hits."""
    mount_tmpfs(tmp_path / "fs", 50)
    try:
        prompts = [f"Chapter {i}. " + f"The river {i} runs past the mill and the bridge. " * 45 for i in range(4)]
        cold = served_all(smollm_native, tmp_path / "fs" / "store", prompts)
        warm = served_all(smollm_native, tmp_path / "fs" / "store", prompts[::-1])[::-1]
    finally:
        unmount(tmp_path / "fs")
    assert all(r["usage"]["prompt_tokens"] > 450 for r in cold)
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in cold] == [0, 0, 0, 0]
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in warm]
    assert cached[-1] > 0, cached  # the newest prompt's blocks are the last evicted
    for a, b in zip(cold, warm, strict=True):
        if b["usage"]["prompt_tokens_details"]["cached_tokens"]:
            assert a["choices"][0]["text"] == b["choices"][0]["text"]


def served_all(smollm_native, directory, prompts: list[str]) -> list[dict]:
    """One server's life on `directory` (the default store size), one greedy completion of each prompt."""
    engine = Engine(smollm_native.runner, smollm_native.tokenizer, smollm_native.source)
    assert engine.attach_kv_store(directory, DEFAULT_KV_STORE_MB, force="load") is not None
    cfg = ServeConfig(model_id_of(engine), kv_cache_mb=256, chunk_size=256, prefix_cache_mb=0)
    with TestClient(create_app(engine, cfg)) as client:
        out = []
        for prompt in prompts:
            body = {"model": cfg.model_id, "prompt": prompt, "max_tokens": 4, "temperature": 0}
            reply = client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            out.append(reply.json())
        return out


def test_a_store_smaller_than_one_prompt_keeps_a_usable_prefix_across_restarts(smollm_native, tmp_path):
    """Issue 53: a 5 MiB store (6 blocks of 737 KB) under a prompt of 16 blocks. Every life leaves on disk exactly
    the first blocks of the prompt's chain (never a block without those before it), and every restart loads the
    same prefix from it (not 64 tokens, then 0)."""
    prompt = "The river runs past the mill and the bridge, and on to the sea. " * 16
    cached, stored = [], []
    for _ in range(3):
        engine = Engine(smollm_native.runner, smollm_native.tokenizer, smollm_native.source)
        engine.attach_kv_store(tmp_path, 5, force="load")
        cfg = ServeConfig(model_id_of(engine), kv_cache_mb=256, chunk_size=64, prefix_cache_mb=0)
        with TestClient(create_app(engine, cfg)) as client:
            body = {"model": cfg.model_id, "prompt": prompt, "max_tokens": 2, "temperature": 0}
            reply = client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            cached.append(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        store = engine.kv_store.store
        keys = store.keys(smollm_native.tokenizer.encode(prompt, add_special_tokens=True))
        assert len(keys) >= 16
        held = [os.path.exists(store.files.path(k.digest)) for k in keys]
        n = held.index(False)
        assert held == [True] * n + [False] * (len(keys) - n), held  # a prefix of the chain, nothing after a gap
        assert len(list((tmp_path / "blocks").rglob("*.kv"))) == n  # and nothing else
        stored.append(n)
    assert cached[0] == 0 and stored[0] > 0
    assert cached[1:] == [stored[0] * 16] * 2, (cached, stored)
    assert stored == [stored[0]] * 3


def test_a_full_disk_leaves_no_probe_file(smollm_native, tmp_path):
    """Issue 53: on a full disk the store's writability probe creates its file and cannot write its byte; the file
    is removed all the same, not left until the next start."""
    mount_tmpfs(tmp_path / "fs", 4)
    try:
        (tmp_path / "fs" / "store" / "blocks").mkdir(parents=True)
        with open(tmp_path / "fs" / "filler", "wb") as f, contextlib.suppress(OSError):
            while True:  # until the disk is full
                f.write(b"\0" * 65536)
                f.flush()
        engine = Engine(smollm_native.runner, smollm_native.tokenizer, smollm_native.source)
        engine.attach_kv_store(tmp_path / "fs" / "store", 64, force="load")
        cfg = ServeConfig(model_id_of(engine), kv_cache_mb=64, chunk_size=64)
        with TestClient(create_app(engine, cfg)) as client:
            assert client.get("/health").status_code == 200
        left = [p.name for p in (tmp_path / "fs" / "store").rglob("*") if p.is_file()]
    finally:
        unmount(tmp_path / "fs")
    assert left == [], left
