"""Which storage the linear weights get: the GGUF's own blocks ("native") or dense float32 / bfloat16 / float16.

Where more than one path is open, `--weights auto` is decided with the dtype by the predicted time of a typical
request on each (prefill.machine.paths); this is the rest: an explicit storage checked, and auto where only one
storage can run (a dense file, a GPU, bfloat16 activations), with a one-line reason.

    check_weights(requested) -> name            the canonical --weights value
    choose_weights(requested, ...) -> Choice    the pure choice (prefill.machine.native.Choice)
"""

from __future__ import annotations

from prefill.errors import BadInput
from prefill.machine.native import Choice
from prefill.machine.paths import NATIVE, native_blocker

DENSE = ("float32", "bfloat16", "float16")
CHOICES = ("auto", NATIVE, *DENSE)


def check_weights(requested: str) -> str:
    """The canonical name of a --weights value, or a BadInput naming the choices."""
    name = requested.lower()
    aliases = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16"}
    name = aliases.get(name, name)
    if name not in CHOICES:
        raise BadInput(f"--weights must be one of {', '.join(CHOICES)}, got {requested!r}")
    return name


def choose_weights(requested: str, *, quantized: tuple[str, ...], dtype: str, device: str, kernels: bool) -> Choice:
    """Pure choice. `quantized`: the GGUF types with a kernel among the file's matrices (() for a dense or HF
    file); `dtype`: the engine's activation dtype; `kernels`: the compiled kernels loaded.

    Native needs a quantized file, the CPU and float32 activations (the blocks are decoded to float32 in
    registers); auto, asked here only where no two paths are open, takes the blocks when they can run. A dense
    choice sets the weights' dtype (the engine then runs in it)."""
    name = check_weights(requested)
    if name in DENSE:
        return Choice(name, f"weights: dense {name} as asked")
    if name == NATIVE:
        if blocker := _blocker(quantized, dtype, device, kernels=True):
            raise BadInput(f"--weights native: {blocker}")
        if not kernels:
            slow = "the quantized kernels are not built (no C++ compiler): the portable path is slow"
            return Choice(NATIVE, f"weights: native {'/'.join(quantized)} blocks as asked", slow)
        return Choice(NATIVE, f"weights: native {'/'.join(quantized)} blocks as asked")
    if blocker := _blocker(quantized, dtype, device, kernels):
        return Choice(dtype, f"weights auto: dense {dtype} ({blocker})")
    return Choice(NATIVE, f"weights auto: native {'/'.join(quantized)} blocks")


def _blocker(quantized: tuple[str, ...], dtype: str, device: str, kernels: bool) -> str:
    if dtype != "float32" and quantized and device.startswith("cpu"):
        return f"native blocks run with float32 activations, not {dtype}"
    return native_blocker(quantized, device, kernels)
