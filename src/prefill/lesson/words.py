"""The lesson's way of writing numbers: the seed's compact N (7e9), SI units (14 TFLOP, 93.3 ms) and its two
worked lines."""

from __future__ import annotations


def short_sci(x: float) -> str:
    """7e9 -> '7e9', 1.35e8 -> '1.35e8', 500 -> '500': the lesson's compact way of writing N."""
    if abs(x) < 1e4:
        return f"{x:.3g}"
    mantissa, exp = f"{x:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"


def human(x: float, unit: str) -> str:
    """1.4e13, 'FLOP' -> '14 TFLOP'; 0.0933, 's' -> '93.3 ms'; bytes and rates alike."""
    if unit == "s":
        if x == 0 or x >= 1:
            return f"{x:.3g} s"
        return f"{x * 1e3:.3g} ms" if x >= 1e-3 else f"{x * 1e6:.3g} µs"
    for power, prefix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if abs(x) >= 10**power:
            return f"{x / 10**power:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def seed_lines(N: float, P: float, flops: float, rate: float, seconds: float) -> dict[str, str]:
    """The seed's two lines: 'FLOPs ≈ 2 · N · P = 2 · 7e9 · 1,000 = 1.40e+13' and 'time ≈ … = 0.28 s'."""
    return {
        "flops": f"FLOPs ≈ 2 · N · P = 2 · {short_sci(N)} · {P:,.0f} = {flops:.2e}",
        "time": f"time ≈ {flops:.2e} / {rate:.1e} = {seconds:.3g} s",
    }


def plural(n: int, word: str) -> str:
    """1, 'token' -> '1 token'; 3, 'pair' -> '3 pairs' (with thousands separators)."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")
