"""Peers in a child process: a segfault in the peer (on purpose: os.kill(getpid, SIGSEGV)) becomes a crash with
its reason and log, and the sweep goes on without that peer."""

from __future__ import annotations

import pytest
from crashing_peer import crash_at_load, crashing_peer

from prefill.bench import report
from prefill.bench.peer_process import PeerCrashed, PeerFailed, PeerProcess, PeerRun
from prefill.bench.peers import start_peer
from prefill.bench.results import OURS, BenchConfig, Crash
from prefill.bench.timing import SelfTimed, time_interleaved


def test_a_segfault_in_the_child_is_a_crash_with_its_log():
    peer = PeerProcess(crashing_peer, {"crash_from": 8}, "crashy", "gguf")
    try:
        assert peer.version == "0.0-test"
        seconds = peer.prefill([1, 2, 3])
        assert isinstance(seconds, SelfTimed) and 0 <= seconds < 1.0  # timed in the child
        with pytest.raises(PeerFailed, match="ValueError: a Python error in the child"):
            peer.call("fails")
        assert peer.prefill([1]) >= 0  # a Python error leaves the child alive
        with pytest.raises(PeerCrashed) as crash:
            peer.prefill(list(range(8)))
        assert crash.value.reason == "crashed (signal 11, SIGSEGV)"
        assert "about to crash at 8 tokens" in crash.value.log
        with pytest.raises(PeerCrashed):  # and it stays dead
            peer.prefill([1])
    finally:
        peer.close()


def test_a_crash_while_loading_is_a_crash_record():
    notes: list[str] = []
    crash = start_peer(crash_at_load, {}, "llamacpp", "gguf", notes)
    assert isinstance(crash, Crash) and crash.P is None and crash.reason == "crashed (signal 11, SIGSEGV)"
    assert "loading, then crashing" in crash.log
    assert crash.note().startswith("llamacpp (gguf) crashed (signal 11, SIGSEGV) while loading; the benchmark went")


def test_the_timers_take_the_childs_own_seconds():
    timings = time_interleaved({"child": lambda: SelfTimed(0.125)}, repeats=3, warmup=0)
    assert timings["child"].samples_s == (0.125, 0.125, 0.125)


@pytest.fixture
def crashing_llamacpp(monkeypatch):
    """`prefill bench`'s llama.cpp peer replaced by one that segfaults from 64 tokens."""
    from prefill.bench import runner

    def load(config, model_path, dtype, first, n_ctx, threads, notes):
        return [PeerProcess(crashing_peer, {"crash_from": 64}, "llamacpp", "gguf")] if first else []

    monkeypatch.setattr(runner, "load_llamacpp_peers", load)


def test_the_sweep_goes_on_after_a_peer_crashes(crashing_llamacpp, tiny_folder):
    from prefill.bench.runner import run_bench

    cfg = BenchConfig(model=str(tiny_folder), prompt_lengths=(16, 64, 128), dtypes=("float32",), repeats=1, warmup=0)
    result = run_bench(replace_peers(cfg))
    ours = [m.P for m in result.measurements if m.engine == OURS]
    assert ours == [16, 64, 128]  # every point of ours measured
    assert [m.P for m in result.measurements if m.engine == "llamacpp"] == [16]
    assert [(c.engine, c.P, c.reason) for c in result.crashes] == [("llamacpp", 64, "crashed (signal 11, SIGSEGV)")]
    assert any(n.startswith("llamacpp (float32) crashed (signal 11, SIGSEGV) at P = 64") for n in result.notes)
    from rich.console import Console

    con = Console(record=True, width=200)
    con.print(report.peers_table(result))
    text = con.export_text()
    assert text.count("crashed (signal 11, SIGSEGV)") == 2  # at P = 64 and 128
    assert "crashed (signal 11, SIGSEGV)" in report.markdown(report.to_json(result))


def replace_peers(cfg: BenchConfig) -> BenchConfig:
    from dataclasses import replace

    return replace(cfg, peers=("llamacpp",), threads=1)


def test_a_peer_run_measures_its_memory_in_the_child():
    peer = PeerProcess(crashing_peer, {"crash_from": 10**9}, "calm", "gguf")
    try:
        memory = PeerRun(peer, [1, 2]).peak_memory()
        assert memory.kind == "rss" and memory.peak_bytes > 10 * 2**20  # a Python process's resident set
    finally:
        peer.close()
