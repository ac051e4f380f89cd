"""`prefill bench --llama-bench` with a llama.cpp that segfaults (on purpose) at its first prompt: the test it
died in is a row that says so, and every test goes on with ours."""

from __future__ import annotations

import pytest
from crashing_peer import crashing_llamacpp
from rich.console import Console

from prefill.bench.versus import VersusConfig, run_versus, versus_table
from prefill.model.quant import ops


@pytest.mark.slow
@pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")
def test_a_crashing_llamacpp_is_a_row_and_the_tests_go_on(monkeypatch):
    import prefill.bench.peers as peers

    monkeypatch.setattr(peers, "llamacpp_available", lambda: True)
    monkeypatch.setattr(peers, "load_llamacpp_child", crashing_llamacpp)
    config = VersusConfig(prompt_lengths=(4, 8), depths=(16,), threads=(1,), repeats=1, tg_steps=2)
    result = run_versus(config)
    rows = [(r.test, r.engine.split(" ")[0], r.status) for r in result.rows]
    assert rows == [
        ("pp 4", "prefill", ""),
        ("pp 4", "llama.cpp", ""),
        ("pp 8", "llama.cpp", "crashed (signal 11, SIGSEGV)"),
        ("pp 8", "prefill", ""),
        ("tg @ d16", "prefill", ""),
    ]
    assert any("crashed (signal 11, SIGSEGV) at pp 8" in n for n in result.notes)
    con = Console(record=True, width=200)
    con.print(versus_table(result))
    assert "crashed (signal 11, SIGSEGV)" in con.export_text()
