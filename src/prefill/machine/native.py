"""Which dtypes this device runs natively, how fast, and which one `--dtype auto` picks.

A CPU multiplies bfloat16 in hardware only with AVX-512-BF16 or AMX; elsewhere torch emulates it, often 100x
slower than float32. So the choice is made from two readings: the instruction sets the CPU reports
(/proc/cpuinfo flags, torch's CPU capability), and a short GEMM probe per dtype at the model's own shapes
(well under a second, cached on disk per machine, torch version and thread count, and once per process).

    capability() -> Capability          what the hardware says
    gemm_rates(...) -> {dtype: FLOP/s}  what the probe measured (or the cache remembers)
    choose(requested, cap, rates)       the pure choice: dtype, why, and a warning for an emulated one
    resolve_dtype(requested, device)    the CLI's one call: choose, print one line, warn once
"""

from __future__ import annotations

import functools
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prefill.costmodel.costs import canonical_dtype

AUTO = "auto"
# --dtype auto picks from these; float16 never: weights trained in bf16 can overflow it.
AUTO_CANDIDATES = ("bfloat16", "float32")
PROBE_DTYPES = ("float32", "bfloat16", "float16")
# The embedded SmolLM2-135M's widest projection: [P, d_model=576] x [576, 2 d_ff=3072] (gate and up in one GEMM).
DEFAULT_SHAPE = (576, 3072)
BF16_WINS = 1.2  # --dtype auto takes bf16 when its GEMMs run at least this many times float32's rate
PROBE_ROUNDS = 2  # the probe runs the dtypes in turn this many times and keeps each one's best: load bursts pass
PROBE_M = 512  # the prompt length the probe aims at (P = 512 is where the speed targets are set)
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "fma")


@dataclass(frozen=True)
class Capability:
    """What a device says it can do. isa: torch's CPU capability ("AVX2", "AVX512", ...) or "CUDA sm_XY";
    flags: the matrix-relevant /proc/cpuinfo flags (empty on CUDA)."""

    device: str  # "cpu" or "cuda"
    name: str  # CPU model name or GPU name
    isa: str
    flags: frozenset[str] = field(default_factory=frozenset)
    cuda_bf16: bool = False

    @property
    def kind(self) -> str:
        """Short name of the matrix hardware: "AMX", "AVX512-BF16", "AVX512", "AVX2", "CUDA" or the isa."""
        if self.device == "cuda":
            return "CUDA"
        if "amx_bf16" in self.flags:
            return "AMX"
        if "avx512_bf16" in self.flags:
            return "AVX512-BF16"
        if "avx512f" in self.flags or self.isa.startswith("AVX512"):
            return "AVX512"
        if "avx2" in self.flags or self.isa == "AVX2":
            return "AVX2"
        return self.isa or "unknown"

    def native(self, dtype: str) -> bool:
        """True when the hardware multiplies `dtype` itself (no emulation through float32)."""
        dtype = canonical_dtype(dtype)
        if dtype == "float32":
            return True
        if self.device == "cuda":
            return dtype == "float16" or (dtype == "bfloat16" and self.cuda_bf16)
        if dtype == "bfloat16":
            return bool({"avx512_bf16", "amx_bf16"} & self.flags)
        if dtype == "float16":
            return bool({"avx512_fp16", "amx_fp16"} & self.flags)
        return False

    def native_dtypes(self) -> tuple[str, ...]:
        """The dtypes among float32, bfloat16, float16 that run natively here, in that order."""
        return tuple(dt for dt in PROBE_DTYPES if self.native(dt))

    def why(self, dtype: str) -> str:
        """The hardware reason `dtype` is native or emulated, in a few words."""
        dtype = canonical_dtype(dtype)
        if self.device == "cuda":
            return f"{self.name} has {'bf16 and fp16' if self.cuda_bf16 else 'fp16'} tensor cores"
        units = {"bfloat16": ("AMX-BF16", "AVX-512-BF16"), "float16": ("AMX-FP16", "AVX-512-FP16")}.get(dtype)
        if units is None:
            return f"{self.kind} runs float32 natively"
        has = [u for u, f in zip(units, _flag_pairs(dtype), strict=True) if f in self.flags]
        if has:
            return f"this CPU has {' and '.join(has)}"
        return f"this CPU ({self.kind}) has no {' or '.join(units)}"


def _flag_pairs(dtype: str) -> tuple[str, str]:
    return ("amx_bf16", "avx512_bf16") if dtype == "bfloat16" else ("amx_fp16", "avx512_fp16")


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


# ---- reading the hardware ------------------------------------------------------------------------------


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The matrix-relevant flags of this CPU from /proc/cpuinfo (or the given text); empty where unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split()) & frozenset(_CPU_FLAGS)
    return frozenset()


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def capability(device: str = "cpu") -> Capability:
    """This device's Capability (read once per process)."""
    import torch

    if device.startswith("cuda"):
        major, minor = torch.cuda.get_device_capability()
        return Capability("cuda", torch.cuda.get_device_name(), f"CUDA sm_{major}{minor}",
                          cuda_bf16=torch.cuda.is_bf16_supported())  # fmt: skip
    return Capability("cpu", cpu_name(), torch.backends.cpu.get_cpu_capability(), cpu_flags())


# ---- the probe and its cache ---------------------------------------------------------------------------


def probe_gemm(dtype: str, device: str = "cpu", shape: tuple[int, int] = DEFAULT_SHAPE, budget_s: float = 0.1) -> float:
    """FLOP/s of [M, K] x [K, N] in `dtype` (shape = (K, N)): M grows 8, 32, 128, 512 (PROBE_M) while the next
    size's GEMM is predicted to stay under budget_s, so an emulated dtype costs a fraction of a second instead of
    minutes; a slow first call that is only thread wake-up (a busy machine) does not stop the growth early."""
    import torch

    dt = getattr(torch, canonical_dtype(dtype))
    K, N = shape
    w = torch.randn(N, K, device=device).to(dt)  # [N, K], as nn.Linear stores it

    def once(a) -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        torch.nn.functional.linear(a, w)  # [M, N]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t

    M = 8
    while True:
        a = torch.randn(M, K, device=device).to(dt)  # [M, K]
        once(a)  # warm-up at this size (kernel choice, packing)
        t = min(once(a) for _ in range(2))
        if M >= PROBE_M or 4 * t > budget_s:
            break
        M = min(4 * M, PROBE_M)
    repeats = max(1, min(5, int(budget_s / max(t, 1e-6))))
    return 2 * M * K * N / min([t] + [once(a) for _ in range(repeats)])


def cache_dir() -> Path:
    """$PREFILL_CACHE_DIR, else ~/.cache/prefill: the probe rates and the bench's compile verdicts live here."""
    env = os.environ.get("PREFILL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "prefill"


def machine_key(device: str = "cpu", threads: int | None = None) -> str:
    """What a cached measurement is valid for: device name, torch version, thread count."""
    import torch

    cap = capability(device)
    n = threads or (torch.get_num_threads() if device == "cpu" else 1)
    return f"{cap.device}|{cap.name}|{cap.isa}|torch {torch.__version__}|{n} threads"


def read_json(name: str) -> dict:
    """A JSON file of cache_dir() as a dict ({} when missing or damaged: a cache is only a cache)."""
    try:
        return json.loads((cache_dir() / name).read_text())
    except (OSError, ValueError):
        return {}


def write_json(name: str, data: dict) -> None:
    """Write a JSON file of cache_dir(), quietly giving up where the folder is not writable."""
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        tmp = cache_dir() / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(cache_dir() / name)
    except OSError:
        pass


_RATES: dict[str, dict[str, float]] = {}  # once per process


def gemm_rates(
    device: str = "cpu",
    shape: tuple[int, int] = DEFAULT_SHAPE,
    dtypes: tuple[str, ...] = PROBE_DTYPES,
    threads: int | None = None,
    refresh: bool = False,
) -> dict[str, float]:
    """FLOP/s per dtype at `shape`, from this process's memory, the disk cache, or the probe (in that order)."""
    key = f"{machine_key(device, threads)}|{shape[0]}x{shape[1]}"
    known = {} if refresh else dict(_RATES.get(key) or read_json("native.json").get(key, {}).get("rates", {}))
    missing = [canonical_dtype(dt) for dt in dtypes if canonical_dtype(dt) not in known]
    if missing:
        for _ in range(PROBE_ROUNDS):  # interleaved, so a burst of other load does not decide the race
            for dt in missing:
                known[dt] = max(known.get(dt, 0.0), probe_gemm(dt, device, shape))
        data = read_json("native.json")
        data[key] = {"rates": known, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
        write_json("native.json", data)
    _RATES[key] = known
    return {canonical_dtype(dt): known[canonical_dtype(dt)] for dt in dtypes}


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
