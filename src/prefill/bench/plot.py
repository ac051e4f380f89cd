"""PNG plots of a run: prefill time against P per engine with the cost model's lines, and the chunk sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prefill.bench.results import OURS, BenchResult
from prefill.costmodel.costs import (
    bytes_to_mib,
    calibrated_prefill_seconds,
    compute_seconds,
    dtype_bytes,
    kv_cache_bytes_for,
    prefill_flops_exact,
)

MARKERS = {OURS: "o", "transformers": "s", "llamacpp": "^"}


def plot_times(result: BenchResult, out_dir: Path) -> Path:
    """bench.png: median prefill seconds (p90 as the error bar) against P, one panel per dtype, log-log.

    Lines: the exact FLOPs at the GEMM rate measured in the run (dashed) and, when calibrated, the calibrated
    prediction (solid).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = result.config.dtypes
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
    plain = [m for m in result.measurements if m.chunk_size is None]
    lengths = sorted({m.P for m in plain})
    grid = np.geomspace(lengths[0], lengths[-1], 50).round().astype(int)
    for ax, dtype in zip(axes[0], dtypes, strict=True):
        for engine in sorted({m.engine for m in plain}):
            pts = [m for m in plain if m.engine == engine and m.dtype in (dtype, "gguf")]
            if not pts:
                continue
            label = f"{engine} ({pts[0].dtype})"
            p = np.array([m.P for m in pts])
            med = np.array([m.median_s for m in pts])
            p90 = np.array([m.p90_s for m in pts])
            ax.errorbar(
                p,
                med,
                yerr=[np.zeros_like(med), p90 - med],
                marker=MARKERS.get(engine, "x"),
                linestyle="none",
                capsize=3,
                label=label,
            )
        rate = result.gemm_flops_per_s[dtype]
        roof = [compute_seconds(prefill_flops_exact(result.spec, int(P)).total, rate) for P in grid]
        ax.plot(grid, roof, "--", color="gray", label=f"cost model at GEMM rate {rate / 1e9:.0f} GFLOP/s")
        rep = result.calibrations.get(dtype)
        if rep is not None:
            cal = [calibrated_prefill_seconds(prefill_flops_exact(result.spec, int(P)), rep.calibration) for P in grid]
            ax.plot(grid, cal, "-", color="black", label=f"calibrated (MAPE {rep.mape_pct:.1f}%)")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="prompt tokens P",
            ylabel="prefill seconds",
            title=f"{result.spec.name} {dtype}",
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result.machine['threads']} threads, {result.machine['device']}", fontsize=9)
    return _save(fig, out_dir / "bench.png")


def plot_chunks(result: BenchResult, out_dir: Path) -> Path | None:
    """chunks.png: median seconds and peak memory rise against chunk size C, with the KV cache's bytes as the
    floor the rise cannot go below (None if no chunk sweep ran)."""
    rows = [m for m in result.measurements if m.engine == OURS and m.chunk_size is not None]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for dtype in sorted({m.dtype for m in rows}):
        pts = sorted((m for m in rows if m.dtype == dtype), key=lambda m: m.chunk_size)
        P = pts[0].P
        whole = result.find(OURS, dtype, P)
        c = [m.chunk_size for m in pts] + ([P] if whole else [])  # one pass = one chunk of C = P
        pts = pts + ([whole] if whole else [])
        (line,) = ax_t.plot(c, [m.median_s for m in pts], "o-", label=f"{dtype}, P={P} (C = P: one pass)")
        ax_m.plot(
            c, [bytes_to_mib(m.peak_delta_bytes) for m in pts], "o-", color=line.get_color(), label=f"{dtype}, P={P}"
        )
        kv = kv_cache_bytes_for(result.spec, P, dtype_bytes(dtype))
        ax_m.axhline(
            bytes_to_mib(kv),
            linestyle="--",
            color=line.get_color(),
            alpha=0.6,
            label=f"KV cache of P={P} ({dtype}, cost model)",
        )
    ax_t.set(xscale="log", xlabel="chunk size C", ylabel="prefill seconds (median)")
    ax_m.set(xscale="log", xlabel="chunk size C", ylabel=f"peak memory rise, MiB ({rows[0].memory_kind})")
    ticks = sorted({m.chunk_size for m in rows} | {m.P for m in rows})
    for ax in (ax_t, ax_m):
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, out_dir / "chunks.png")


def _save(fig, path: Path) -> Path:
    """Lay out, write `path` (its folder made if missing) and free the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
