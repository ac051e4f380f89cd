"""`prefill bench --llama-bench` with a llama.cpp that segfaults (on purpose) at its first prompt: the test it
died in is a row that says so, it is measured again with its extra buffer types off, and every test goes on."""

from __future__ import annotations

import pytest
from crashing_peer import crashing_llamacpp, repacking_llamacpp
from rich.console import Console

from prefill.bench.versus import (
    COLUMNS,
    EXTRA_BUFTS_OFF,
    EXTRA_BUFTS_WHY,
    VersusConfig,
    run_versus,
    to_json,
    versus_cells,
    versus_table,
)
from prefill.model.quant import ops


@pytest.mark.slow
@pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")
def test_a_crashing_llamacpp_is_a_row_and_the_tests_go_on(monkeypatch):
    import prefill.bench.peers as peers

    monkeypatch.setattr(peers, "llamacpp_available", lambda: True)
    monkeypatch.setattr(peers, "load_llamacpp_child", crashing_llamacpp)
    config = VersusConfig(prompt_lengths=(4, 8), depths=(16,), threads=(1,), repeats=1, tg_steps=2)
    result = run_versus(config)
    rows = [(r.test, r.engine.split(" ")[0], EXTRA_BUFTS_OFF in r.engine, r.status) for r in result.rows]
    assert rows == [
        ("pp 4", "prefill", False, ""),
        ("pp 4", "llama.cpp", False, ""),
        ("pp 8", "llama.cpp", False, "crashed (signal 11, SIGSEGV)"),
        ("pp 8", "llama.cpp", True, "crashed (signal 11, SIGSEGV)"),  # with its extra buffer types off, again
        ("pp 8", "prefill", False, ""),
        ("tg @ d16", "prefill", False, ""),
    ]
    assert any("crashed (signal 11, SIGSEGV) at pp 8" in n for n in result.notes)
    assert result.notes.count(EXTRA_BUFTS_WHY) == 1
    ours = [r for r in result.rows if r.engine.startswith("prefill")]
    assert all(r.predicted_s is not None and 0 < r.predicted_s < 10 for r in ours)  # the time model beside each
    con = Console(record=True, width=200)
    con.print(versus_table(result))
    assert "crashed (signal 11, SIGSEGV)" in con.export_text()


@pytest.mark.slow
@pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")
def test_a_llamacpp_whose_extra_buffer_types_crash_runs_again_without_them(monkeypatch):
    """As on an AMX Xeon: the test it died in is a crash row, then the same test and every later one (at every
    thread count) has a llama.cpp row that says its extra buffer types were off, and a ratio beside ours."""
    import prefill.bench.peers as peers

    monkeypatch.setattr(peers, "llamacpp_available", lambda: True)
    monkeypatch.setattr(peers, "load_llamacpp_child", repacking_llamacpp)
    config = VersusConfig(prompt_lengths=(4, 8), depths=(16,), threads=(1, 2), repeats=1, tg_steps=2, predict=False)
    result = run_versus(config)
    llama = [(r.test, r.threads, EXTRA_BUFTS_OFF in r.engine, r.status) for r in result.rows if "llama" in r.engine]
    assert llama == [
        ("pp 4", 1, False, ""),
        ("pp 8", 1, False, "crashed (signal 11, SIGSEGV)"),
        ("pp 8", 1, True, ""),
        ("tg @ d16", 1, True, ""),
        ("pp 4", 2, True, ""),  # once they crashed, they stay off
        ("pp 8", 2, True, ""),
        ("tg @ d16", 2, True, ""),
    ]
    assert result.notes.count(EXTRA_BUFTS_WHY) == 1
    cells = versus_cells(to_json(result))
    ours_at = {(c[0], c[1]): c[COLUMNS.index("vs llama.cpp")] for c in cells if c[2].startswith("prefill")}
    assert all(ratio.endswith("x") for ratio in ours_at.values()), cells  # beside the live llama.cpp row


@pytest.mark.slow
@pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")
def test_each_path_is_probed_before_llamacpps_child_starts(monkeypatch):
    """llama.cpp's threads spin on the cores after each of its evals: a probe of our paths beside them measured a
    machine 3x slower (the native path's decode predicted 25 ms for 8.6 measured on a Zen 4), and `auto` then took
    the slower path. So every path is probed first, then the child starts."""
    import prefill.bench.peers as peers
    import prefill.bench.versus as versus
    from prefill.bench.peer_process import PeerCrashed
    from prefill.engine.llm import Engine

    events: list[str] = []
    real_profile = Engine.profile
    monkeypatch.setattr(
        Engine, "profile", lambda self, *a, **kw: events.append("probe") or real_profile(self, *a, **kw)
    )

    def child(*args, **kwargs):
        events.append("llama.cpp")
        raise PeerCrashed("llamacpp", "exited with status 1", "", "-")

    monkeypatch.setattr(peers, "llamacpp_available", lambda: True)
    monkeypatch.setattr(versus, "PeerProcess", child)
    weights = ("native:f32", "float32")
    config = VersusConfig(prompt_lengths=(4,), depths=(8,), threads=(1,), repeats=1, tg_steps=1, weights=weights)
    run_versus(config)
    first = events.index("llama.cpp")
    assert events[:first] == ["probe"] * len(weights), events
