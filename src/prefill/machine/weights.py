"""Which storage the linear weights get: the GGUF's own blocks ("native") or dense float32 / bfloat16 / float16.

`--weights auto` chooses as `--dtype auto` does (prefill.machine.native): from what the file holds, what the
device runs, and a short measurement cached per machine, with a one-line reason. The measurement is a decode
GEMM (M = 1) over more weights than the caches hold, native blocks against float32: decode reads every weight
once per token, so the storage with fewer bytes wins wherever the kernels keep up with memory.

    choose_weights(requested, ...) -> Choice    the pure choice (prefill.machine.native.Choice)
    cached_probe(measure) -> seconds            the measurement, once per machine and torch version
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prefill.errors import BadInput
from prefill.machine.native import Choice, machine_key, read_json, write_json

NATIVE = "native"
DENSE = ("float32", "bfloat16", "float16")
CHOICES = ("auto", NATIVE, *DENSE)
_CACHE = "weights.json"


def check_weights(requested: str) -> str:
    """The canonical name of a --weights value, or a BadInput naming the choices."""
    name = requested.lower()
    aliases = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16"}
    name = aliases.get(name, name)
    if name not in CHOICES:
        raise BadInput(f"--weights must be one of {', '.join(CHOICES)}, got {requested!r}")
    return name


def choose_weights(
    requested: str,
    *,
    quantized: tuple[str, ...],
    dtype: str,
    device: str,
    kernels: bool,
    probe: dict[str, float] | None = None,
) -> Choice:
    """Pure choice. `quantized`: the GGUF types with a kernel among the file's matrices (() for a dense or HF
    file); `dtype`: the engine's activation dtype; `kernels`: the compiled kernels loaded; `probe`: seconds of
    the decode GEMM by storage ({"native": s, "float32": s}) or None when not measured.

    Native needs a quantized file, the CPU and float32 activations (the blocks are decoded to float32 in
    registers); auto takes it when the kernels are built and the probe found them faster. A dense choice sets
    the weights' dtype (the engine then runs in it)."""
    name = check_weights(requested)
    if name in DENSE:
        return Choice(name, f"weights: dense {name} as asked")
    blocker = _native_blocker(quantized, dtype, device)
    if name == NATIVE:
        if blocker:
            raise BadInput(f"--weights native: {blocker}")
        if not kernels:
            slow = "the quantized kernels are not built (no C++ compiler): the portable path is slow"
            return Choice(NATIVE, f"weights: native {'/'.join(quantized)} blocks as asked", slow)
        return Choice(NATIVE, f"weights: native {'/'.join(quantized)} blocks as asked")
    if blocker:
        return Choice(dtype, f"weights auto: dense {dtype} ({blocker})")
    if not kernels:
        return Choice(dtype, f"weights auto: dense {dtype} (the quantized kernels are not built: no C++ compiler)")
    if probe and probe["native"] >= probe["float32"]:
        return Choice("float32", f"weights auto: dense float32 (a decode GEMM measured {_ms(probe)} here)")
    return Choice(
        NATIVE,
        f"weights auto: native {'/'.join(quantized)} blocks" + (f" (a decode GEMM {_ms(probe)})" if probe else ""),
    )


def _native_blocker(quantized: tuple[str, ...], dtype: str, device: str) -> str:
    if not quantized:
        return "the model file holds no quantized matrix with a kernel here (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K)"
    if not device.startswith("cpu"):
        return f"the quantized kernels run on the CPU, not {device}"
    if dtype != "float32":
        return f"native blocks run with float32 activations, not {dtype}"
    return ""


def _ms(probe: dict[str, float]) -> str:
    return f"{probe['native'] * 1e3:.2f} ms native vs {probe['float32'] * 1e3:.2f} ms float32"


def cached_probe(measure: Callable[[], dict[str, float]], refresh: bool = False) -> dict[str, float]:
    """`measure()`'s seconds by storage (a one-thread measurement), from the disk cache when this machine and
    torch have them (cache_dir()/weights.json), else measured now and saved."""
    key = machine_key("cpu", 1)
    data = read_json(_CACHE)
    if not refresh and key in data:
        return {k: float(v) for k, v in data[key]["seconds"].items()}
    seconds = measure()
    data[key] = {"seconds": seconds, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json(_CACHE, data)
    return seconds
