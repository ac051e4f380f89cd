"""The sweep end to end on a tiny random Llama folder: every point measured, tables, JSON and plots written."""

import json

import pytest

from prefill.bench import plot, report
from prefill.bench.results import OURS, BenchConfig
from prefill.bench.runner import run_bench
from prefill.costmodel.costs import prefill_flops_exact

# The times the fake clock gives a prefill: a known overhead and known rates, which the calibration must recover.
OVERHEAD_S, LINEAR_FLOPS, ATTENTION_FLOPS = 2e-3, 3e9, 7e8


@pytest.fixture
def fake_clock(monkeypatch):
    """Every timed call still runs (the engine prefills for real), but its seconds are those of the engine's
    prefills in it under the known rates: a calibration fit on a busy machine's real times can fail, and tests
    never assert timings."""
    from prefill.bench import timing
    from prefill.engine.llm import Engine

    ran = []
    real_prefill = Engine.prefill

    def prefill(self, ids, cache=None, chunk_size=None):
        past = 0 if cache is None else cache.length
        ran.append(prefill_flops_exact(self.spec, len(ids[-1]), past=past))
        return real_prefill(self, ids, cache, chunk_size)

    def timed(fn, device):
        ran.clear()
        fn()
        return sum(OVERHEAD_S + (c.linear + c.unembed) / LINEAR_FLOPS + c.attention / ATTENTION_FLOPS for c in ran)

    monkeypatch.setattr(Engine, "prefill", prefill)
    monkeypatch.setattr(timing, "_timed", timed)


def test_sweep_measures_every_point_with_calibration_and_chunks(tiny_folder, tmp_path, fake_clock):
    cfg = BenchConfig(
        model=str(tiny_folder),
        prompt_lengths=(16, 64, 256, 1024, 2048),
        dtypes=("float32",),
        repeats=2,
        warmup=0,
        peers=(),
        threads=1,
        calibrate=True,
        chunk_sizes=(256, 512),
    )
    seen = []
    result = run_bench(cfg, on_step=lambda description, seconds: seen.append(description))
    # 2048 exceeds the context length 1024: dropped with a note
    assert any("context length 1024" in n for n in result.notes)
    assert len(seen) == 4 + 2  # one step per P (all engines at once), one per chunk size
    ours = [m for m in result.measurements if m.engine == OURS and m.chunk_size is None]
    assert [m.P for m in ours] == [16, 64, 256, 1024]
    for m in ours:
        assert len(m.samples_s) == 2 and m.median_s > 0
        assert m.flops == prefill_flops_exact(result.spec, m.P).total
        assert m.tokens_per_s == pytest.approx(m.P / m.median_s)
        assert m.mfu == pytest.approx(m.flops_per_s / result.gemm_flops_per_s["float32"])
        assert m.predicted_s > 0 and m.predicted_bound in ("compute", "memory", "overhead")  # the time model
    chunks = [m for m in result.measurements if m.chunk_size is not None]
    assert [(m.P, m.chunk_size) for m in chunks] == [(1024, 256), (1024, 512)]
    assert all(m.calibrated_s > 0 for m in ours)
    rep = result.calibrations["float32"]
    cal = rep.calibration  # the fake clock's parameters, recovered from the sweep and the cached halves
    assert cal.overhead_s == pytest.approx(OVERHEAD_S, rel=1e-6)
    assert cal.linear_flops_per_s == pytest.approx(LINEAR_FLOPS, rel=1e-6)
    assert cal.attention_flops_per_s == pytest.approx(ATTENTION_FLOPS, rel=1e-6)
    assert all(abs(r.error_pct) < 1e-4 for r in rep.rows)
    assert rep.fitted_on == (64, 1024)
    assert [r.P for r in rep.sweep] == [16, 64, 256, 1024]
    assert [(r.P, r.past) for r in rep.rows if r.past] == [(32, 32), (512, 512)]  # the cached halves

    from rich.console import Console

    con = Console(record=True, width=200)
    for t in (
        report.ours_table(result),
        report.peers_table(result),
        report.chunk_table(result),
        report.calibration_table("float32", rep),
    ):
        con.print(t)
    console_text = con.export_text()
    assert "calibrated ms" in console_text and "chunked prefill" in console_text
    path = report.write_json(result, tmp_path)
    data = json.loads(path.read_text())
    assert len(data["measurements"]) == 6
    assert data["calibrations"]["float32"]["fitted_on"] == [64, 1024]
    assert plot.plot_times(result, tmp_path).stat().st_size > 10_000
    assert plot.plot_chunks(result, tmp_path).stat().st_size > 10_000


def test_bench_command_writes_json_plot_and_calibration(tiny_folder, tmp_path):
    import os
    import subprocess
    import sys

    env = os.environ | {"PREFILL_CALIBRATION": str(tmp_path / "cal.json")}
    args = [
        "bench",
        "--model",
        str(tiny_folder),
        "--prompt-lengths",
        "16,128,1024",
        "--dtypes",
        "float32",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--peers",
        "none",
        "--threads",
        "1",
        "--calibrate",
        "--out",
        str(tmp_path / "out"),
    ]
    cmd = [sys.executable, "-c", "from prefill.cli.main import main; main()", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "bench.json").is_file() and (tmp_path / "out" / "bench.png").is_file()
    if "float32 calibration failed" not in done.stdout:  # a busy machine can defeat the fit (see above)
        assert "calibration float32" in done.stdout and "MAPE" in done.stdout
        cal = json.loads((tmp_path / "cal.json").read_text())
        assert cal["dtype"] == "float32" and cal["threads"] == 1 and cal["linear_flops_per_s"] > 0

    bad = subprocess.run([*cmd[:3], "bench", "--prompt-lengths", "32,x"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2
    assert "--prompt-lengths must be comma-separated integers" in bad.stderr
    assert "Traceback" not in bad.stderr
