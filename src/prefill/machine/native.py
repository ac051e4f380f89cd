"""Which dtypes this device runs natively, how fast, and which one `--dtype auto` picks.

A CPU multiplies bfloat16 in hardware only with AVX-512-BF16 or AMX; elsewhere torch emulates it, often 100x
slower than float32. So the choice is made from two readings: the instruction sets the CPU reports
(/proc/cpuinfo flags, torch's CPU capability: prefill.device.capability), and the machine probe's GEMM rate
per dtype at the model's own shapes (prefill.machine.profiles.gemm_rates: measured once, cached on disk per
machine, torch version and thread count).

    capability() -> Capability          what the hardware says
    gemm_rates(...) -> {dtype: FLOP/s}  what the probe measured (or the cache remembers)
    choose(requested, cap, rates)       the pure choice: dtype, why, and a warning for an emulated one
    resolve_dtype(requested, device)    the CLI's one call: choose, print one line, warn once
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prefill.costmodel.costs import canonical_dtype
from prefill.device.cache import machine_key, read_json, write_json
from prefill.device.capability import Capability, capability
from prefill.machine.profiles import gemm_rates

AUTO = "auto"
# --dtype auto picks from these; float16 never: weights trained in bf16 can overflow it.
AUTO_CANDIDATES = ("bfloat16", "float32")
BF16_WINS = 1.2  # --dtype auto takes bf16 when its GEMMs run at least this many times float32's rate


@dataclass(frozen=True)
class Choice:
    """The dtype to run, the one-line reason, and a warning when it is emulated here (else None)."""

    dtype: str
    reason: str
    warning: str | None = None


def choose(requested: str, cap: Capability, rates: dict[str, float] | None) -> Choice:
    """Pure choice logic: `requested` is "auto" or a dtype; `rates` the probe's FLOP/s by dtype (may be partial).

    auto: bfloat16 where the hardware flags say it is native and the probe (when there is one) found its GEMMs
    at least BF16_WINS x float32's rate at the model's shapes; else float32. The margin is there because a bf16
    prefill also pays for conversions in its norms and softmax: an AVX-512-BF16 core without AMX (Intel's
    VDPBF16PS runs at the FP32 FMA rate) gains nothing, a Zen 4 (2x) or AMX (much more) does. An explicit dtype is
    kept; if it is emulated here the warning gives its measured rate beside float32's.
    """
    rates = rates or {}
    if requested.lower() != AUTO:
        dtype = canonical_dtype(requested)
        if cap.native(dtype):
            return Choice(dtype, f"{dtype} as asked ({cap.why(dtype)})")
        return Choice(dtype, f"{dtype} as asked", _emulated_warning(dtype, cap, rates))
    native = [dt for dt in AUTO_CANDIDATES if cap.native(dt)]
    fast = [dt for dt in native if dt == "float32" or not _measured_no_faster(dt, rates)]
    best = fast[0]
    if best == "float32":
        if "bfloat16" in native:  # native by its flags, measured no faster
            why = f"bfloat16 is native ({cap.why('bfloat16')}) but no faster here: {_rates_text('bfloat16', rates)}"
        else:
            why = cap.why("bfloat16")
        return Choice("float32", f"dtype auto: float32 ({why}{_rate_suffix('float32', rates)})")
    return Choice(best, f"dtype auto: {best} ({cap.why(best)}{_rate_suffix(best, rates)})")


def _measured_no_faster(dtype: str, rates: dict[str, float]) -> bool:
    return dtype in rates and "float32" in rates and rates[dtype] < BF16_WINS * rates["float32"]


def _emulated_warning(dtype: str, cap: Capability, rates: dict[str, float]) -> str:
    where = "this GPU" if cap.device == "cuda" else "this CPU"
    text = f"{dtype} is emulated on {where} ({cap.why(dtype)})"
    if dtype in rates and "float32" in rates:
        text += f": {_gflops(rates[dtype])} GFLOP/s vs {_gflops(rates['float32'])} in float32"
    return text + "; expect it to be slow (--dtype auto picks the fastest native dtype)"


def _gflops(rate: float) -> str:
    g = rate / 1e9
    return f"{g:.1f}" if g < 10 else f"{g:.0f}"


def _rates_text(dtype: str, rates: dict[str, float]) -> str:
    return f"{_gflops(rates[dtype])} vs {_gflops(rates['float32'])} GFLOP/s in float32"


def _rate_suffix(dtype: str, rates: dict[str, float]) -> str:
    return f"; GEMM probe {_gflops(rates[dtype])} GFLOP/s" if dtype in rates else ""


_WARNED: set[str] = set()


def resolve_dtype(requested: str, device: str = "cpu", echo: Callable[[str], None] | None = print) -> str:
    """The dtype to run for `requested` ("auto" or a dtype) on `device`; prints the one-line reason, and the
    emulation warning once per process. CUDA needs no probe: its tensor cores are known."""
    cap = capability("cuda" if device.startswith("cuda") else "cpu")
    wanted = requested.lower()
    probe = cap.device == "cpu" and (wanted == AUTO or not cap.native(wanted))
    rates = gemm_rates(device, dtypes=_probe_set(wanted, cap)) if probe else {}
    choice = choose(requested, cap, rates)
    if echo is not None:
        if wanted == AUTO:
            echo(choice.reason)
        if choice.warning and choice.warning not in _WARNED:
            _WARNED.add(choice.warning)
            echo(f"warning: {choice.warning}")
    return choice.dtype


def _probe_set(wanted: str, cap: Capability) -> tuple[str, ...]:
    if wanted == AUTO:
        return tuple(dt for dt in AUTO_CANDIDATES if cap.native(dt)) or ("float32",)
    return ("float32", canonical_dtype(wanted))


# ---- --compile only where it helps -------------------------------------------------------------------


@dataclass(frozen=True)
class CompileVerdict:
    """What the last `prefill bench` on this machine measured for one dtype: eager vs compiled tokens/s at P."""

    dtype: str
    P: int
    eager_tok_s: float
    compiled_tok_s: float

    @property
    def use_compile(self) -> bool:
        return self.compiled_tok_s > self.eager_tok_s

    def message(self) -> str:
        rates = f"{self.compiled_tok_s:,.0f} vs {self.eager_tok_s:,.0f} tok/s at P = {self.P} in the last bench"
        if self.use_compile:
            return f"compiling pays here ({rates}, {self.dtype})"
        return f"compiling was slower here ({rates}, {self.dtype}); running eager"


def save_compile_verdict(v: CompileVerdict, device: str = "cpu", threads: int | None = None) -> None:
    """Remember the bench's eager-vs-compiled result for this machine and dtype (cache_dir()/compile.json)."""
    data = read_json("compile.json")
    data[f"{machine_key(device, threads)}|{v.dtype}"] = {"P": v.P, "eager": v.eager_tok_s, "compiled": v.compiled_tok_s}
    write_json("compile.json", data)


def compile_verdict(dtype: str, device: str = "cpu", threads: int | None = None) -> CompileVerdict | None:
    """The saved verdict for this machine and dtype, or None when no bench measured both here."""
    row = read_json("compile.json").get(f"{machine_key(device, threads)}|{canonical_dtype(dtype)}")
    if not row:
        return None
    return CompileVerdict(canonical_dtype(dtype), int(row["P"]), float(row["eager"]), float(row["compiled"]))


def keep_compile(dtype: str, device: str = "cpu", echo: Callable[[str], None] | None = print) -> bool:
    """For `run --compile` / `serve --compile`: False (and says why) when the last bench here found compiling
    slower in `dtype`; True when it found it faster or never measured it."""
    v = compile_verdict(dtype, device)
    if v is not None and echo is not None:
        echo(v.message())
    return v is None or v.use_compile
