"""`--weights`: resolve auto / native / a dense dtype for one model file, and say what the loaded model holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prefill.device.capability import capability
from prefill.machine.paths import (
    NATIVE,
    Workload,
    asked,
    candidates,
    choose_kv,
    choose_path,
    exact_line,
    gate_note,
    kv_candidates,
    predict_path,
)
from prefill.machine.quality_gate import record_of
from prefill.machine.weights import Choice, choose_weights


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


def native_weight_types(model: str | Path | None, spec) -> dict[str, str]:
    """ "KxN" -> GGUF type of each GEMM's weight the engine would keep as blocks, read off the file before loading
    it (Engine.weight_types says the same of a loaded engine): layer 0's Q (for the fused Q/K/V), output, gate
    (for the fused gate/up) and down projections, and the unembedding (the tied embedding where there is none).
    Their blocks go to the probe (give_blocks): it times the kernels on them where gguf-py cannot make the type."""
    from prefill.costmodel.gguf_file import open_gguf
    from prefill.costmodel.profile import shape_key
    from prefill.loading import default_model_path
    from prefill.machine.probe import give_blocks
    from prefill.machine.profiles import gemm_shapes
    from prefill.model.quant import KERNEL_TYPES

    tensors = {t.name: t for t in open_gguf(default_model_path() if model is None else model).tensors}
    names = ("blk.0.attn_q", "blk.0.attn_output", "blk.0.ffn_gate", "blk.0.ffn_down", "output")
    found: dict[str, str] = {}
    for name, (K, N) in zip(names, gemm_shapes(spec), strict=True):
        t = tensors.get(f"{name}.weight") or (tensors.get("token_embd.weight") if name == "output" else None)
        if t is not None and t.tensor_type.name in KERNEL_TYPES:
            found.setdefault(shape_key(K, N), t.tensor_type.name)
            give_blocks(t.tensor_type.name, t.data)  # the probe times the kernels on the file's own blocks
    return found


def auto_path(
    model,
    dtype: str,
    weights: str,
    device: str = "cpu",
    threads: int | None = None,
    workload: Workload | None = None,
    echo: Callable[[str], None] | None = print,
    activations: str = "auto",
) -> tuple[str, str, str, str] | None:
    """(dtype, weights, why, activations) of the path `auto` serves `workload` (default: the typical request) on
    among those `dtype`, `weights` and `activations` (each "auto" or given; activations "auto" reads
    PREFILL_ACTIVATIONS) leave open on this CPU (prefill.machine.paths), or None where fewer than two are open
    (the per-part choices then decide). A reduced-precision path the options did not name is weighed only where
    the quality gate's record on this file passes (prefill.machine.quality_gate); the exact path is taken unless
    a weighed one is predicted MIN_GAIN faster (choose_path). A path weighed but not yet probed here is probed
    now (a few seconds each, once per machine; `echo` gets a note)."""
    from prefill.costmodel.specs import load_spec
    from prefill.loading import default_model_path
    from prefill.model.quant import ops
    from prefill.model.quant.activations import requested_activations

    if not device.startswith("cpu") or "auto" not in (dtype.lower(), weights.lower()):
        return None
    quantized = quantized_types(model)
    kernels = ops.available() if quantized else False
    acts = requested_activations() if activations == "auto" else activations
    open_paths = candidates(dtype, weights, quantized, capability("cpu"), kernels, acts)
    if len(open_paths) < 2:
        return None
    file = default_model_path() if model is None else Path(model)
    weighed, shut = [], []
    for p in open_paths:
        note = "" if asked(p, dtype, weights, acts) else gate_note(p.reduced, record_of(file, p.key()), p)
        (shut if note else weighed).append(note or p)
    spec = load_spec(file)
    qtypes = native_weight_types(model, spec) if quantized else {}
    if len(weighed) == 1:  # the exact path alone: nothing to predict
        p = weighed[0]
        label = p.label(tuple(dict.fromkeys(qtypes.values())) if p.weights == NATIVE else ())
        return p.dtype, p.weights, exact_line(label, shut), p.activations
    times = [predict_path(spec, p, workload or Workload(), qtypes, device, threads, echo) for p in weighed]
    best, why = choose_path(times, shut)
    return best.path.dtype, best.path.weights, why, best.path.activations


def choose_kv_dtype(engine, workload: Workload | None = None, echo: Callable[[str], None] | None = print) -> str:
    """Store `engine`'s K/V as the dtype choose_kv takes for `workload` (default: the typical request) among
    kv_candidates: the reference (the compute dtype), and each other the quality gate admits for the engine's
    path on its file; said in one line to `echo` where there were two or more; returns it. Each admitted one is
    predicted on the engine's profile for that K/V dtype (decode attention timed reading K/V as such a pool
    stores them: probed on first need, a second or so, once per machine)."""
    from prefill.costmodel.costs import request_seconds

    load = workload or Workload()
    options = kv_candidates(engine.dtype_name, capability("cpu" if engine.device.type == "cpu" else "cuda"))
    shut = []
    if len(options) > 1 and engine.model_file is not None:
        path = engine.serving_path
        notes = {kv: gate_note(f"{kv} K/V", record_of(engine.model_file, path.key(kv))) for kv in options[1:]}
        options, shut = (options[0], *(kv for kv in options[1:] if not notes[kv])), [n for n in notes.values() if n]
    elif len(options) > 1:  # weights from memory: no file the gate could have measured
        options = options[:1]
    if len(options) == 1:
        engine.runner.set_kv_dtype(options[0])
        if echo is not None and shut:
            echo(f"kv-dtype auto: {options[0]} K/V" + "".join(f" ({n})" for n in shut))
        return options[0]
    times = []
    for kv in options:
        engine.runner.set_kv_dtype(kv)
        engine.profile(echo=echo)
        ttft, itl = engine.predict_prefill(load.P).seconds, engine.predict_decode([load.P + load.n // 2]).seconds
        times.append((kv, request_seconds(ttft, load.n, itl)))
    kv, line = choose_kv(times, load, shut)
    engine.runner.set_kv_dtype(kv)
    if echo is not None:
        echo(line)
    return kv


def weights_choice(requested: str, model: str | Path | None, dtype: str, device: str = "cpu") -> Choice:
    """The storage for `requested` (auto, native, float32, bfloat16, float16) in activation `dtype`, with its
    one-line reason, where the storage alone decides (auto_path decides where two paths are open)."""
    from prefill.model.quant import ops

    quantized = quantized_types(model)
    kernels = ops.available() if quantized else False
    return choose_weights(requested, quantized=quantized, dtype=dtype, device=device, kernels=kernels)


def resolve_weights(
    requested: str, model, dtype: str, device: str = "cpu", echo: Callable[[str], None] | None = print
) -> str:
    """The storage ("native" or a dense dtype) of weights_path."""
    return weights_path(requested, model, dtype, device, echo)[0]


def weights_path(
    requested: str,
    model,
    dtype: str,
    device: str = "cpu",
    echo: Callable[[str], None] | None = print,
    activations: str = "auto",
) -> tuple[str, str | None]:
    """(storage, activations) for `requested` in activation `dtype` (and `activations`, as auto_path): auto_path's
    (storage "native" or a dense dtype, the blocks' "f32" or "q8") where it decides, else weights_choice's
    storage and None; the reason echoed for auto, a warning always."""
    if (path := auto_path(model, dtype, requested, device, echo=echo, activations=activations)) is not None:
        if echo is not None:
            echo(path[2])
        return path[1], path[3]
    choice = weights_choice(requested, model, dtype, device)
    if echo is not None:
        if requested.lower() == "auto":
            echo(choice.reason)
        if choice.warning:
            echo(f"warning: {choice.warning}")
    return choice.dtype, None


def resolve_path(
    model,
    dtype: str,
    weights: str,
    device: str = "cpu",
    echo: Callable[[str], None] | None = print,
    threads: int | None = None,
    workload: Workload | None = None,
    activations: str = "auto",
) -> tuple[str, str, str | None]:
    """(dtype, weights, activations) to load `model` with, as `prefill serve` and `prefill run` do: where "auto"
    leaves two paths or more open, the one auto_path takes for `workload` (its line to `echo`; activations the
    path's "f32" or "q8"); else `activations` where given, else None (Engine.load's default) and
    "auto" dtype the fastest dtype native here (float32 under native blocks: their kernels take float32
    activations) and "auto" weights the GGUF's blocks or a dense dtype, each choice said in one line."""
    from prefill.machine.native import resolve_dtype

    if (path := auto_path(model, dtype, weights, device, threads, workload, echo, activations)) is not None:
        if echo is not None:
            echo(path[2])
        return path[0], path[1], path[3]
    if weights == "native" and dtype == "auto":
        if echo is not None:
            echo("dtype auto: float32 (--weights native runs float32 activations)")
        dtype = "float32"
    dtype = resolve_dtype(dtype, device, echo=echo)
    storage = weights_path(weights, model, dtype, device, echo, activations)[0]
    return dtype, storage, None if activations == "auto" else activations


def storage_of(model) -> str:
    """What a loaded model's matrices are stored as: "Q4_1 + Q8_0" (their GGUF types), or the dense dtype."""
    from prefill.model.quant import QuantRows, QuantWeight

    types: dict[str, None] = {}
    for module in model.modules():
        w = getattr(module, "weight", None)
        for part in w.parts if isinstance(w, QuantRows) else (w,):
            if isinstance(part, QuantWeight):
                types[part.qtype] = None
    if types:
        return " + ".join(types)
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def stored_bytes_per_weight(model) -> float | None:
    """Bytes a decode step reads per weight of the matrices it multiplies (every block's projections and the
    unembedding), as stored: a Q4_K_M file mixes Q4_K, Q5_0, Q6_K and a Q8_0 unembedding, so the mean over
    their bytes, not one type's. None when no matrix is quantized (the weights are the engine's dtype)."""
    from prefill.model.quant import QuantRows, QuantWeight

    mats = [m.weight for blk in model.layers for m in (blk.wqkv, blk.wo, blk.w_gate_up, blk.w_down)]
    mats.append(model.unembed_weight())
    if not any(isinstance(w, QuantWeight | QuantRows) for w in mats):
        return None
    nbytes = sum(w.nbytes if isinstance(w, QuantWeight | QuantRows) else w.numel() * w.element_size() for w in mats)
    return nbytes / sum(w.shape[0] * w.shape[1] for w in mats)


def main_type(w) -> str | None:
    """The GGUF type whose kernel times a weight's product in the profile: a QuantWeight's own; QuantRows' type
    of the most rows (a Q4_K_M file's Q/K/V: Q5_0 for Q and K, 1,280 of 1,536 rows, beside a Q8_0 V); None for a
    dense weight."""
    rows: dict[str, int] = {}
    for part in getattr(w, "parts", (w,)):
        if (qtype := getattr(part, "qtype", None)) is not None:
            rows[qtype] = rows.get(qtype, 0) + part.N
    return max(rows, key=rows.__getitem__) if rows else None
