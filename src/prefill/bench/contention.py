"""A benchmark run on a shared machine: other load can only lower a GEMM measurement, so the rate is measured
again at the end and the higher kept, MFU is computed against it, and a busy machine or an unsteady point is said
beside the table."""

from __future__ import annotations

import os
from dataclasses import replace

from prefill.bench.results import BenchResult, Measurement
from prefill.costmodel.costs import mfu


def rate_again(result: BenchResult, gemm: dict[str, float], threads: int) -> None:
    """Measure each dtype's GEMM rate (FLOP/s) again, keep the higher of `gemm`'s and the new one, rate every
    measurement's MFU against it, and note the machine's load."""
    from prefill.machine.probe import measure_gemm_rate

    result.machine["gemm_flops_per_s_start"] = dict(gemm)
    device = result.config.device
    result.machine["gemm_flops_per_s_end"] = {
        dt: measure_gemm_rate(dt, device=device, threads=threads) for dt in result.config.dtypes
    }
    for dt, rate in result.machine["gemm_flops_per_s_end"].items():
        gemm[dt] = max(gemm[dt], rate)
    result.measurements[:] = [_rated(m, gemm) for m in result.measurements]
    _note_contention(result)


def _rated(m: Measurement, gemm: dict[str, float]) -> Measurement:
    """`m` with MFU against the final GEMM rates."""
    rate = gemm.get(m.dtype)
    return replace(m, mfu=mfu(m.flops, m.median_s, rate) if rate else None)


UNSTABLE_P90_OVER_MEDIAN = 1.25  # a point whose p90 exceeds its median by more than this was disturbed


def _note_contention(result: BenchResult) -> None:
    # Other processes on the same cores make every engine's threads wait on each other: say so beside the table.
    load = os.getloadavg()[1] if hasattr(os, "getloadavg") else 0.0  # 5-minute average
    result.machine["load_average_5min"] = load
    cores = result.machine["cores"] or 1
    if load > cores + 0.5:
        result.notes.append(
            f"the 5-minute load average was {load:.1f} on {cores} cores: other processes competed for the CPU "
            "during this run, so its times are not reliable; rerun on an idle machine"
        )
    unstable = [m for m in result.measurements if m.p90_s > UNSTABLE_P90_OVER_MEDIAN * m.median_s]
    if unstable:
        names = ", ".join(
            f"{m.engine} {m.dtype} P={m.P}" + (f" C={m.chunk_size}" if m.chunk_size else "") for m in unstable
        )
        result.notes.append(
            f"unsteady points (p90 > {UNSTABLE_P90_OVER_MEDIAN} x median, the machine was busy): {names}"
        )
