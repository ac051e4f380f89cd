"""The hardware catalog (vendor datasheet figures, dense, no sparsity), and the calibration file.

Torch-free: looking up a GPU stays instant. "cpu" is this machine, measured by prefill.machine.probe.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from prefill.costmodel.costs import FP4_WEIGHTS, Calibration, canonical_dtype
from prefill.errors import BadInput

TFLOPS = 1e12
GB = 1e9  # datasheets count memory and bandwidth in decimal gigabytes


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or this CPU).

    peak_flops: dense peak FLOP/s by canonical dtype name (float32 means plain FP32, not TF32; fp4: the FP4 tensor
    cores that nvfp4 and mxfp4 weights run on, Blackwell only);
    bandwidth_bytes_per_s: memory bandwidth; memory_bytes: memory capacity as the datasheet states it;
    link_bytes_per_s: GPU-to-GPU bandwidth per direction (NVLink / Infinity Fabric / PCIe), None if unknown;
    compute_units: streaming multiprocessors (AMD: compute units), for wave quantization; source: where the
    figures come from; gemm_efficiency: the fraction of the dense peak a large GEMM was measured to reach on this
    GPU, where a measurement is published (it caps the stated Hopper-era fractions: gemm_fraction).
    """

    name: str
    peak_flops: dict[str, float]
    bandwidth_bytes_per_s: float
    memory_bytes: float
    source: str
    link_bytes_per_s: float | None = None
    compute_units: int | None = None
    gemm_efficiency: float | None = None

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype` (any alias; nvfp4 and mxfp4 run at the fp4 peak); BadInput if the datasheet
        gives none."""
        key = canonical_dtype(dtype)
        key = "fp4" if key in FP4_WEIGHTS else key
        if key not in self.peak_flops:
            what = "FP4 tensor cores (nvfp4/mxfp4 weights need Blackwell: b200, gb200)" if key == "fp4" else ""
            what = what or f"peak for {key}"
            raise BadInput(f"{self.name} has no {what}; choose one of {', '.join(self.peak_flops)}")
        return self.peak_flops[key]

    def gemm_fraction(self, stated: float) -> float:
        """The fraction of the dense peak a GEMM reaches here: `stated` (an engine's or a profile's figure, stated
        for Hopper), capped by this GPU's measured gemm_efficiency where one is published."""
        return min(stated, self.gemm_efficiency) if self.gemm_efficiency else stated


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
    fp4: float | None = None,
    gemm_efficiency: float | None = None,
) -> Hardware:
    peaks = {"float32": fp32 * TFLOPS, "bfloat16": bf16 * TFLOPS, "float16": bf16 * TFLOPS}
    if fp8 is not None:
        peaks["fp8"] = fp8 * TFLOPS
    if fp4 is not None:
        peaks["fp4"] = fp4 * TFLOPS
    return Hardware(name, peaks, bw_gb * GB, mem_gb * GB, source, link_gb * GB, units, gemm_efficiency)


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
    # H20: NVIDIA posts no public datasheet page; the figures are its product brief's as the trade press and
    # NVIDIA's own planner report them (ai-dynamo/aiconfigurator src/aiconfigurator/systems/h20_sxm.yaml: 4.0 TB/s,
    # FP16 148 TFLOPS, 450 GB/s a direction); 78 SMs (Geekbench 6 listing).
    "h20": _gpu("NVIDIA H20", 44, 148, 296, 4000, 96, 450, 78,
                "NVIDIA H20 datasheet (product brief, 2024): BF16 148 TFLOPS, FP8 296 dense, 96 GB HBM3, 4.0 TB/s, "
                "NVLink 900 GB/s, 400 W"),
    # Blackwell: the tensor-core figures are "with sparsity" on NVIDIA's pages, halved here. GB200 before B200: a
    # device named "NVIDIA GB200" must not match the b200 entry first (prefill.bench.gpu matches by name).
    # GEMMs: Microsoft measured 2,744 dense FP8 TFLOP/s in a GEMM benchmark on a GB200 (ND GB200 v6), 55% of its
    # 5,000 (techcommunity.microsoft.com, "Azure's ND GB200 v6 delivers record performance for inference
    # workloads", 2025-04; 7.35 TB/s of HBM, 92%, in the same study), where Hopper's reach 70% (engines.HOPPER).
    # The same fraction is taken for B200 (the same silicon at 1,000 W) and for FP4. Added after the Blackwell
    # validation rows ran 8-29% above their published throughput with 0.70: the value is Microsoft's measurement,
    # not fitted to those rows (docs/planner.md).
    "gb200": _gpu("NVIDIA GB200 (NVL72)", 80, 2500, 5000, 8000, 186, 900, 148,
                  "NVIDIA GB200 NVL72 datasheet (nvidia.com/en-us/data-center/gb200-nvl72, per rack of 72 GPUs): FP4 "
                  "1,440 PFLOPS sparse (10 PFLOPS dense a GPU), FP8 720, BF16 360, FP32 5,760 TFLOPS, 13.4 TB HBM3e "
                  "(186 GB a GPU), 576 TB/s (8 TB/s a GPU), NVLink 130 TB/s (1.8 TB/s a GPU), 1,200 W",
                  fp4=10000, gemm_efficiency=0.55),
    "b200": _gpu("NVIDIA B200 SXM", 75, 2250, 4500, 8000, 180, 900, 148,
                 "NVIDIA HGX B200 datasheet (nvidia.com/en-us/data-center/hgx, per 8 GPUs): FP4 144 PFLOPS sparse "
                 "(9 PFLOPS dense a GPU), FP8 72, BF16 36 PFLOPS, FP32 600 TFLOPS, 1.4 TB HBM3e (180 GB a GPU, "
                 "MLPerf v5.1's B200-SXM-180GB), 64 TB/s (8 TB/s a GPU), NVLink 1.8 TB/s a GPU, 1,000 W",
                 fp4=9000, gemm_efficiency=0.55),
    "mi300x": _gpu("AMD Instinct MI300X", 163.4, 1307.4, 2614.9, 5300, 192, 448, 304,
                   "AMD MI300X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html): BF16 1,307.4 "
                   "TFLOPS dense, FP8 2,614.9, 192 GB HBM3, 5.3 TB/s, Infinity Fabric 896 GB/s, 750 W; no FP4"),
    "mi325x": _gpu("AMD Instinct MI325X", 163.4, 1307.4, 2614.9, 6000, 256, 448, 304,
                   "AMD MI325X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi325x.html): BF16 1,307.4 "
                   "TFLOPS dense, FP8 2,614.9, 256 GB HBM3E, 6 TB/s, Infinity Fabric 896 GB/s, 1,000 W; no FP4"),
}
# fmt: on

ALIASES = {
    "a100": "a100-80gb",
    "h100": "h100-sxm",
    "h200-sxm": "h200",
    "4090": "rtx-4090",
    "mi300": "mi300x",
    "mi325": "mi325x",
    "b200-sxm": "b200",
    "gb200-nvl72": "gb200",
}


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
