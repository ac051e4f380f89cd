"""`--weights`: resolve auto / native / a dense dtype for one model file, and say what the loaded model holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prefill.machine.weights import Choice, cached_probe, choose_weights


def quantized_types(model: str | Path | None) -> tuple[str, ...]:
    """The GGUF types with a kernel among the model file's matrices, in file order (() for an HF folder)."""
    from prefill.costmodel.gguf_file import open_gguf
    from prefill.loading import default_model_path
    from prefill.model.quant import KERNEL_TYPES

    path = default_model_path() if model is None else Path(model)
    if path.suffix != ".gguf" or not path.is_file():
        return ()
    found: dict[str, None] = {}
    for t in open_gguf(path).tensors:
        if len(t.shape) == 2 and t.tensor_type.name in KERNEL_TYPES:
            found[t.tensor_type.name] = None
    return tuple(found)


def weights_choice(requested: str, model: str | Path | None, dtype: str, device: str = "cpu") -> Choice:
    """The storage for `requested` (auto, native, float32, bfloat16, float16) with its one-line reason; auto
    runs the decode-GEMM probe once per machine (prefill.model.quant.probe, cached)."""
    from prefill.model.quant import ops
    from prefill.model.quant.probe import measure_decode_gemm

    quantized = quantized_types(model)
    probe_useful = requested.lower() == "auto" and quantized and device.startswith("cpu") and dtype == "float32"
    kernels = ops.available() if quantized else False
    probe = cached_probe(measure_decode_gemm) if probe_useful and kernels else None
    return choose_weights(requested, quantized=quantized, dtype=dtype, device=device, kernels=kernels, probe=probe)


def resolve_weights(
    requested: str, model, dtype: str, device: str = "cpu", echo: Callable[[str], None] | None = print
) -> str:
    """weights_choice's storage ("native" or a dense dtype), its reason echoed for auto, its warning always."""
    choice = weights_choice(requested, model, dtype, device)
    if echo is not None:
        if requested.lower() == "auto":
            echo(choice.reason)
        if choice.warning:
            echo(f"warning: {choice.warning}")
    return choice.dtype


def resolve_storage(
    model, dtype: str, weights: str, device: str = "cpu", echo: Callable[[str], None] | None = print
) -> tuple[str, str]:
    """(dtype, weights) to load `model` with, as `prefill serve` and `prefill run` do: "auto" dtype becomes the
    fastest dtype native here (float32 under native blocks: their kernels take float32 activations) and "auto"
    weights the GGUF's blocks ("native") or a dense dtype, each choice said in one line to `echo`."""
    from prefill.machine.native import resolve_dtype

    if weights == "native" and dtype == "auto":
        if echo is not None:
            echo("dtype auto: float32 (--weights native runs float32 activations)")
        dtype = "float32"
    dtype = resolve_dtype(dtype, device, echo=echo)
    return dtype, resolve_weights(weights, model, dtype, device, echo=echo)


def storage_of(model) -> str:
    """What a loaded model's matrices are stored as: "Q4_1 + Q8_0" (their GGUF types), or the dense dtype."""
    from prefill.model.quant import QuantWeight

    types: dict[str, None] = {}
    for module in model.modules():
        w = getattr(module, "weight", None)
        if isinstance(w, QuantWeight):
            types[w.qtype] = None
    if types:
        return " + ".join(types)
    return str(next(model.parameters()).dtype).removeprefix("torch.")
