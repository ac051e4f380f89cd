"""A probe disturbed by other processes is probed again and each point's fastest kept (other load only slows a
measurement down): the merge, and the retry around it."""

from __future__ import annotations

from prefill.machine.entries import best_entry, implausible, undisturbed


def entry(m2_rate: float, attention: list, overhead: float = 5e-6, bandwidth: float = 10e9) -> dict:
    return {
        "gemm": {"576x576": [[1, 8e9], [2, m2_rate], [4, 30e9]]},
        "attention": {"9/3x64": {"prefill": attention, "decode": [[64, 4e9]]}},
        "op_overhead_s": overhead,
        "bandwidth_bytes_per_s": bandwidth,
        "cache_bandwidth_bytes_per_s": 50e9,
    }


def test_the_fastest_of_each_point_over_every_size_any_probe_reached():
    stalled = entry(0.1e9, [[4, 1e6]], overhead=9e-6)  # one slow GEMM, one point of attention at 1 MFLOP/s
    clean = entry(16e9, [[4, 1e9], [16, 3e9], [64, 8e9]], bandwidth=12e9)
    best = best_entry([stalled, clean])
    assert best["gemm"]["576x576"] == [[1, 8e9], [2, 16e9], [4, 30e9]]
    assert best["attention"]["9/3x64"]["prefill"] == [[4, 1e9], [16, 3e9], [64, 8e9]]
    assert best["op_overhead_s"] == 5e-6 and best["bandwidth_bytes_per_s"] == 12e9
    assert implausible(stalled) and not implausible(best)


def test_a_disturbed_probe_is_probed_again():
    fresh = [entry(16e9, [[4, 1e9]])]

    def measure(e):
        e.update(fresh.pop())

    lines: list[str] = []
    out = undisturbed(entry(0.1e9, [[4, 1e9]]), measure, lines.append)
    assert out["gemm"]["576x576"][1] == [2, 16e9] and not implausible(out)
    assert len(lines) == 1 and lines[0].startswith("the probe was disturbed (the probe's GEMM of 2 rows")
    calm = entry(16e9, [[4, 1e9]])
    assert undisturbed(calm, measure, lines.append) == best_entry([calm])
    assert len(lines) == 1  # an undisturbed probe is not measured again
