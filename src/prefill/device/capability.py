"""What a device says it can do: the CPU's instruction sets (/proc/cpuinfo flags, torch's CPU capability) or the
GPU's compute capability. Read once per process; nothing here is timed (prefill.machine.probe times)."""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass, field
from pathlib import Path

from prefill.costmodel.costs import canonical_dtype

PROBE_DTYPES = ("float32", "bfloat16", "float16")
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "fma", "f16c")


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
        return Capability(
            "cuda", torch.cuda.get_device_name(), f"CUDA sm_{major}{minor}", cuda_bf16=torch.cuda.is_bf16_supported()
        )
    return Capability("cpu", cpu_name(), torch.backends.cpu.get_cpu_capability(), cpu_flags())
