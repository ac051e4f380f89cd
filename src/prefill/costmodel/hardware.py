"""The hardware catalog (vendor datasheet figures, dense, no sparsity), and the calibration file.

Torch-free: looking up a GPU stays instant. "cpu" is this machine, measured by prefill.machine.probe.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from prefill.costmodel.costs import Calibration, canonical_dtype
from prefill.errors import BadInput

TFLOPS = 1e12
GB = 1e9  # datasheets count memory and bandwidth in decimal gigabytes


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or this CPU).

    peak_flops: dense peak FLOP/s by canonical dtype name (float32 means plain FP32, not TF32);
    bandwidth_bytes_per_s: memory bandwidth; memory_bytes: memory capacity as the datasheet states it;
    link_bytes_per_s: GPU-to-GPU bandwidth per direction (NVLink / Infinity Fabric / PCIe), None if unknown;
    compute_units: streaming multiprocessors (AMD: compute units), for wave quantization; source: where the
    figures come from.
    """

    name: str
    peak_flops: dict[str, float]
    bandwidth_bytes_per_s: float
    memory_bytes: float
    source: str
    link_bytes_per_s: float | None = None
    compute_units: int | None = None

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype` (any alias); BadInput if the datasheet gives none."""
        key = canonical_dtype(dtype)
        if key not in self.peak_flops:
            raise BadInput(f"{self.name} has no peak for {key}; choose one of {', '.join(self.peak_flops)}")
        return self.peak_flops[key]


def _gpu(
    name: str,
    fp32: float,
    bf16: float,
    fp8: float | None,
    bw_gb: float,
    mem_gb: float,
    link_gb: float,
    units: int,
    source: str,
) -> Hardware:
    peaks = {"float32": fp32 * TFLOPS, "bfloat16": bf16 * TFLOPS, "float16": bf16 * TFLOPS}
    if fp8 is not None:
        peaks["fp8"] = fp8 * TFLOPS
    return Hardware(name, peaks, bw_gb * GB, mem_gb * GB, source, link_gb * GB, units)


# TFLOPS dense (the datasheets' sparsity figures halved), GB/s, GB, GB/s per direction between GPUs
# (NVLink 900 = 900 GB/s both directions together), SMs (MI300X: compute units).
# The formatter is off for this table alone: it reads better aligned.
# fmt: off
HARDWARE: dict[str, Hardware] = {
    "a100-40gb": _gpu("NVIDIA A100 40GB SXM", 19.5, 312, None, 1555, 40, 300, 108,
                      "NVIDIA A100 datasheet (2021): BF16 312 TFLOPS, 1,555 GB/s, NVLink 600 GB/s"),
    "a100-80gb": _gpu("NVIDIA A100 80GB SXM", 19.5, 312, None, 2039, 80, 300, 108,
                      "NVIDIA A100 datasheet (2021): BF16 312 TFLOPS, 2,039 GB/s, NVLink 600 GB/s"),
    "h100-sxm": _gpu("NVIDIA H100 SXM", 67, 989.4, 1978.9, 3350, 80, 450, 132,
                     "NVIDIA H100 datasheet: BF16 1,979 TFLOPS sparse (989.4 dense), 3.35 TB/s, NVLink 900"),
    "h200": _gpu("NVIDIA H200 SXM", 67, 989.4, 1978.9, 4800, 141, 450, 132,
                 "NVIDIA H200 datasheet: BF16 1,979 TFLOPS sparse (989.4 dense), 4.8 TB/s, NVLink 900"),
    "l4": _gpu("NVIDIA L4", 30.3, 121, 242.5, 300, 24, 32, 58,
               "NVIDIA L4 datasheet: BF16 242 TFLOPS sparse (121 dense), 300 GB/s, PCIe Gen4 x16 64 GB/s"),
    "rtx-4090": _gpu("NVIDIA GeForce RTX 4090", 82.6, 165.2, 330.3, 1008, 24, 32, 128,
                     "NVIDIA Ada whitepaper: BF16 165.2 TFLOPS (FP32 accumulate), 1,008 GB/s, PCIe Gen4 x16"),
    "mi300x": _gpu("AMD Instinct MI300X", 163.4, 1307.4, 2614.9, 5300, 192, 448, 304,
                   "AMD MI300X datasheet: BF16 1,307.4 TFLOPS dense, 5.3 TB/s, Infinity Fabric 896 GB/s"),
}
# fmt: on

ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm", "h200-sxm": "h200", "4090": "rtx-4090", "mi300": "mi300x"}


def hardware_names() -> list[str]:
    """Every name get_hardware accepts (aliases excluded), `cpu` included."""
    return [*HARDWARE, "cpu"]


def get_hardware(name: str) -> Hardware:
    """A catalog entry by name or alias. "cpu" is this machine, measured: prefill.machine.profiles.get_hardware
    resolves it (the cost model takes a machine's numbers as data and never probes)."""
    key = name.lower()
    key = ALIASES.get(key, key)
    if key == "cpu":
        raise BadInput("'cpu' is this machine, measured by its probe: ask prefill.machine.profiles.get_hardware")
    if key not in HARDWARE:
        raise BadInput(f"unknown hardware {name!r}; choose one of: {', '.join(hardware_names())}")
    return HARDWARE[key]


# ---- calibration file --------------------------------------------------------------------------------


def calibration_path() -> Path:
    """Where the calibration lives: $PREFILL_CALIBRATION, else ~/.cache/prefill/calibration.json."""
    env = os.environ.get("PREFILL_CALIBRATION")
    return Path(env) if env else Path.home() / ".cache" / "prefill" / "calibration.json"


def save_calibration(cal: Calibration) -> Path:
    """Write `cal` as JSON to calibration_path(); returns the path."""
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(cal), indent=2) + "\n")
    return path


def load_calibration() -> Calibration | None:
    """The saved calibration, or None if there is none; BadInput if the file is damaged."""
    path = calibration_path()
    if not path.is_file():
        return None
    try:
        return Calibration(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise BadInput(f"cannot read calibration {path} ({e}); delete it and calibrate again") from None
