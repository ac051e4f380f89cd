"""What a sweep will run, and for how long, decided before it starts.

- dtypes: by default the ones this device runs natively (prefill.machine.native); a dtype asked for explicitly that is
  emulated here is measured at the smallest P only, with a note, unless --force.
- duration: every timed call's exact FLOPs (prefill.costmodel.costs) at the probe's GEMM rate, divided by a rough
  efficiency per engine, plus loading and compiling; printed before the sweep and used to weigh the progress
  bar's steps, so its time-left column counts seconds, not points.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefill.costmodel.costs import prefill_flops_exact
from prefill.costmodel.specs import ModelSpec
from prefill.device.capability import Capability
from prefill.machine.native import AUTO, AUTO_CANDIDATES

# Rough fraction of the probe's GEMM rate each engine reaches in a whole prefill (measured on 2-core CPUs:
# ours 0.6-1.0, transformers 0.5-1.0, llama.cpp 0.2-0.5); an estimate only needs the right order.
EFFICIENCY = {"prefill": 0.6, "prefill-compiled": 0.6, "transformers": 0.5, "llamacpp": 0.3}
LOAD_S = 8.0  # loading one engine (dequantizing the GGUF), seconds
COMPILE_S = 20.0  # torch.compile of the two block functions, seconds


@dataclass(frozen=True)
class Plan:
    """The dtypes to sweep, the prompt lengths per dtype, notes to print, and the estimated seconds."""

    dtypes: tuple[str, ...]
    lengths: dict[str, tuple[int, ...]]
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    point_seconds: dict[tuple[str, int], float] = field(default_factory=dict)  # (dtype, P) -> all its engines


def default_dtypes(cap: Capability) -> tuple[str, ...]:
    """The dtypes a sweep runs when none is asked for: float32, and bfloat16 where it is native."""
    return tuple(dt for dt in ("float32", "bfloat16") if dt in AUTO_CANDIDATES and cap.native(dt))


def dtypes_and_lengths(
    requested: tuple[str, ...], lengths: tuple[int, ...], cap: Capability, force: bool
) -> tuple[tuple[str, ...], dict[str, tuple[int, ...]], list[str]]:
    """`requested` (AUTO or dtypes) -> dtypes, the lengths each runs at, and notes for the emulated ones."""
    dtypes = default_dtypes(cap) if requested in ((), (AUTO,)) else requested
    per: dict[str, tuple[int, ...]] = {}
    notes = []
    for dt in dtypes:
        if cap.native(dt) or force or len(lengths) == 1:
            per[dt] = lengths
        else:
            per[dt] = (min(lengths),)
            notes.append(
                f"{dt} is emulated on this {cap.kind} device ({cap.why(dt)}): measured at P = {min(lengths)} only "
                "(--force measures every P)"
            )
    return dtypes, per, notes


def engines_per_point(peers: tuple[str, ...], compile: bool, llama_files: int) -> list[str]:
    """The engines timed at one (dtype, P): ours, ours compiled, transformers, llama.cpp on `llama_files` GGUFs."""
    names = ["prefill"] + ["prefill-compiled"] * compile + ["transformers"] * ("transformers" in peers)
    return names + ["llamacpp"] * (llama_files if "llamacpp" in peers else 0)


def estimate(
    spec: ModelSpec,
    dtypes: tuple[str, ...],
    lengths: dict[str, tuple[int, ...]],
    rates: dict[str, float],
    *,
    peers: tuple[str, ...],
    compile: bool,
    llama_files_per_dtype: dict[str, int],
    repeats: int,
    warmup: int,
    chunk_sizes: tuple[int, ...] = (),
    calibrate: bool = False,
) -> tuple[float, dict[tuple[str, int], float]]:
    """Estimated seconds of the whole sweep, and of each (dtype, P) point with all its engines."""
    calls = 2 + warmup + repeats  # cold, warm-up, timed, one more for peak memory
    per_point: dict[tuple[str, int], float] = {}
    total = 0.0
    for dt in dtypes:
        rate = rates.get(dt) or rates.get("float32") or 1e10
        engines = engines_per_point(peers, compile, llama_files_per_dtype.get(dt, 0))
        total += LOAD_S * len(set(engines)) + COMPILE_S * compile
        for P in lengths[dt]:
            one = prefill_flops_exact(spec, P).total / rate
            per_point[(dt, P)] = calls * sum(one / EFFICIENCY[e] for e in engines)
        total += sum(per_point[(dt, P)] for P in lengths[dt])
        longest = prefill_flops_exact(spec, max(lengths[dt])).total / rate / EFFICIENCY["prefill"]
        total += calls * longest * len(chunk_sizes) + (calls * longest if calibrate else 0.0)
    return total, per_point


def duration_text(seconds: float) -> str:
    """'about 40 s' / 'about 3.5 min' / 'about 1.2 h'."""
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 5400:
        return f"about {seconds / 60:.1f} min"
    return f"about {seconds / 3600:.1f} h"
