"""The calculator: `prefill estimate`, `prefill kv` and `prefill mask`. The cost model only, so no torch unless
--hardware cpu measures this machine."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from prefill.cli.common import console, err_console, fail, note, print_sections

Model = Annotated[str | None, typer.Option("--model", "-m", help="Preset (e.g. llama-3-8b) or .gguf/config.json.")]
Params = Annotated[float | None, typer.Option("--params", help="Only a parameter count N, e.g. 7e9 (no shapes).")]
Config = Annotated[str | None, typer.Option("--config", help="A Hugging Face config.json or its folder.")]
Gguf = Annotated[str | None, typer.Option("--gguf", help="A GGUF file (metadata only).")]
HARDWARE_HELP = (
    "h100, h200, h20, b200, gb200, a100-40gb, a100-80gb, l4, rtx-4090, mi300x, mi325x, or cpu (measured now)."
)
HardwareName = Annotated[str, typer.Option("--hardware", help=HARDWARE_HELP)]
PeakFlops = Annotated[float | None, typer.Option("--peak-flops", help="Override the hardware's peak FLOP/s.")]
MFU_HELP = "Fraction of peak achieved, in (0, 1]. Default 0.5; 1.0 on cpu, whose peak is a measured GEMM."
Mfu = Annotated[float | None, typer.Option("--mfu", help=MFU_HELP)]
Tp = Annotated[int, typer.Option("--tp", help="T, tensor-parallel GPUs.")]
NetworkMs = Annotated[float, typer.Option("--network-ms", help="Network latency added to TTFT (ms).")]
TokenizeMs = Annotated[float, typer.Option("--tokenize-ms", help="Tokenization time added to TTFT (ms).")]

WEIGHTS_HELP = "How the weights are stored: a dtype or a GGUF type (Q4_1, ...); default: --dtype or the GGUF's."
MASK_GRID_CAP = 32  # positions drawn; the pair count and the last position are reported for any P


def spec_from(model: str | None, config: str | None, gguf: str | None, params: float | None = None):
    """The ModelSpec named by exactly one of --model / --config / --gguf (None when only --params is given)."""
    from prefill.costmodel.specs import ModelSpec, load_spec
    from prefill.errors import BadInput

    named = (("--model", model), ("--config", config), ("--gguf", gguf), ("--params", params))
    given = [name for name, v in named if v is not None]
    if len(given) != 1:
        raise BadInput(f"give exactly one of --model, --config, --gguf, --params (got {', '.join(given) or 'none'})")
    if model is not None:
        return load_spec(model)
    if config is not None:
        return ModelSpec.from_hf_config(config)
    return ModelSpec.from_gguf(gguf) if gguf is not None else None


# ---- estimate ----------------------------------------------------------------------------------------


def estimate(
    model: Model = None,
    params: Params = None,
    config: Config = None,
    gguf: Gguf = None,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", "-p", help="P, prompt tokens per sequence.")] = 1000,
    hardware: HardwareName = "h100",
    peak_flops: PeakFlops = None,
    mfu: Mfu = None,
    dtype: Annotated[
        str, typer.Option("--dtype", help="float32, bf16, fp16, fp8, nvfp4 or mxfp4: peak and bytes per element.")
    ] = "bf16",
    weights: Annotated[str | None, typer.Option("--weights", help=WEIGHTS_HELP)] = None,
    batch: Annotated[int, typer.Option("--batch", "-b", help="B, sequences prefilled together.")] = 1,
    tp: Tp = 1,
    network_ms: NetworkMs = 0.0,
    tokenize_ms: TokenizeMs = 0.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    """Predict a prefill: FLOPs (2*N*P and exact), seconds, TTFT, KV cache, compute- or memory-bound."""
    from prefill.cli.estimate_report import print_estimate
    from prefill.costmodel.estimate import Setting, build_estimate

    spec, stored = shapes_and_storage(model, config, gguf, params, weights)
    if prompt_tokens < 1 or batch < 1 or tp < 1:
        fail("--prompt-tokens, --batch and --tp must be >= 1")
    on_cpu = hardware.lower() == "cpu"
    machine = hardware_fields(hardware, dtype, peak_flops, mfu, quiet=json_out, calibrated=spec is not None)
    ttft = {"network_s": network_ms / 1e3, "tokenize_s": tokenize_ms / 1e3}  # the rest of TTFT, in seconds
    shape = {"P": prompt_tokens, "spec": spec, "N": params, "B": batch, "T": tp, "dtype": dtype, "weights": stored}
    est = build_estimate(Setting(**shape, **machine, **ttft))
    for warning in est.setting.warnings():
        note(f"warning: {warning}")
    if json_out:
        typer.echo(json.dumps(est.to_dict(), indent=2))
    else:
        print_estimate(est, on_cpu)


def shapes_and_storage(model, config, gguf, params, weights: str | None):
    """spec_from's spec, and how the weights are stored (--weights, else the GGUF's own types), the GGUF parsed
    once for both."""
    from prefill.costmodel import storage
    from prefill.costmodel.gguf_file import reading_once

    with reading_once():
        spec = spec_from(model, config, gguf, params)
        return spec, (weights, weights) if weights else storage.gguf_file_storage(gguf) if gguf else None


def hardware_fields(name: str, dtype: str, peak: float | None, mfu: float | None, quiet: bool, calibrated: bool):
    """The Setting fields of --hardware NAME: its peak in `dtype` (unless --peak-flops), bandwidth and link, and on
    cpu the saved calibration (when `calibrated`). MFU defaults to 0.5, and to 1.0 on cpu, whose peak is a GEMM
    measured now. `quiet`: no line on stderr while the CPU is measured."""
    from prefill.costmodel.costs import canonical_dtype
    from prefill.costmodel.hardware import load_calibration
    from prefill.machine.profiles import get_hardware

    dtype = canonical_dtype(dtype)  # an unknown dtype fails before the CPU is measured
    on_cpu = name.lower() == "cpu"
    if on_cpu and not quiet:
        err_console.print("measuring this CPU's GEMM rate and memory bandwidth ...")
    hw = get_hardware(name)
    return {
        "hardware": hw.name,
        "peak_flops_per_s": hw.peak(dtype) if peak is None else peak,
        "mfu": (1.0 if on_cpu else 0.5) if mfu is None else mfu,
        "bandwidth_bytes_per_s": hw.bandwidth_bytes_per_s,
        "link_bytes_per_s": hw.link_bytes_per_s,
        "calibration": load_calibration() if on_cpu and calibrated else None,
    }


# ---- kv ----------------------------------------------------------------------------------------------


def kv(
    model: Model = None,
    config: Config = None,
    gguf: Gguf = None,
    layers: Annotated[int | None, typer.Option("--layers", help="L, instead of a model.")] = None,
    kv_heads: Annotated[int | None, typer.Option("--kv-heads", help="H_kv, instead of a model.")] = None,
    head_dim: Annotated[int | None, typer.Option("--head-dim", help="d_head, instead of a model.")] = None,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", "-p", help="P, tokens cached per sequence.")] = 2048,
    dtype: Annotated[str, typer.Option("--dtype", help="Cache dtype: float32, bf16, fp16, fp8, q8_0.")] = "bf16",
    batch: Annotated[int, typer.Option("--batch", "-b", help="B, sequences.")] = 1,
    memory_gib: Annotated[
        float, typer.Option("--memory-gib", help="Memory for the cache (GiB): longest context.")
    ] = 24.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """KV-cache size after a prefill: bytes, MiB, MB, per token, and the longest context that fits."""
    shapes = (layers, kv_heads, head_dim)
    if any(v is not None for v in shapes):
        if None in shapes or any(v is not None for v in (model, config, gguf)):
            fail("give --layers, --kv-heads and --head-dim together, and no model")
        for flag, v in zip(("--layers", "--kv-heads", "--head-dim"), shapes, strict=True):
            if v < 1:
                fail(f"{flag} must be >= 1, got {v}")
        spec = shapes_spec(layers, kv_heads, head_dim)
    else:
        spec = spec_from(model, config, gguf)
    r = kv_result(spec, prompt_tokens, dtype, batch, memory_gib)
    if json_out:
        typer.echo(json.dumps(r, indent=2))
    else:
        print_kv(spec, r)


def shapes_spec(L: int, H_kv: int, d_head: int):
    """A ModelSpec with only the shapes the KV cache depends on (the rest set to 1 so the spec is valid)."""
    from prefill.costmodel.specs import ModelSpec

    shapes = {"L": L, "d_model": H_kv * d_head, "H_q": H_kv, "H_kv": H_kv, "d_head": d_head}
    ones = {"d_ff": 1, "vocab_size": 1, "context_length": 1, "rope_theta": 1.0, "norm_eps": 1.0}
    return ModelSpec("custom shapes", "llama", tied_embeddings=True, **shapes, **ones)


def kv_result(spec, P: int, dtype: str, B: int, memory_gib: float) -> dict:
    """Everything `prefill kv --json` prints: the cache's bytes three ways, per token, and the longest context."""
    from prefill.costmodel import costs

    b = costs.kv_bytes_per_element(dtype)
    total = costs.kv_cache_bytes_for(spec, P, b, B)
    return {
        "model": spec.name,
        "L": spec.L,
        "H_kv": spec.H_kv,
        "d_head": spec.d_head,
        "windows": list(spec.windows) if spec.windowed else None,
        "P": P,
        "B": B,
        "dtype": costs.cache_dtype(dtype),
        "bytes": total,
        "MiB": costs.bytes_to_mib(total),
        "MB": costs.bytes_to_mb(total),
        "bytes_per_token": costs.kv_cache_bytes_for(spec, 1, b, B),
        "bytes_without_windows": costs.kv_cache_bytes(spec.L, spec.H_kv, spec.d_head, P, b, B),
        "memory_gib": memory_gib,
        "max_context_tokens": costs.max_context_tokens_for(spec, memory_gib * 2**30, b, B),
    }


def print_kv(spec, r: dict) -> None:
    """kv_result as one table, titled with the formula (the window-aware one for a windowed model)."""
    from prefill.costmodel import costs

    B, P, longest, b = r["B"], r["P"], r["max_context_tokens"], costs.kv_bytes_per_element(r["dtype"])
    fits = "any length (every layer is windowed)" if longest is None else f"{longest:,} tokens"
    per_layer = "min(P, W_l)" if spec.windowed else f"P={P:,}"
    rows = [
        ("model", r["model"]),
        ("shapes", f"L={spec.L}, H_kv={spec.H_kv}, d_head={spec.d_head}, {r['dtype']} ({b:g} B)"),
        ("K, V per layer", f"2 x [B={B}, H_kv={spec.H_kv}, {per_layer}, d_head={spec.d_head}]"),
    ]
    if spec.windowed:
        rows.append(("windows", windows_text(spec.windows)))
    rows += [
        ("bytes", f"{r['bytes']:,} B"),
        ("MiB (2^20 B)", f"{r['MiB']:,.1f} MiB"),
        ("MB (10^6 B)", f"{r['MB']:,.1f} MB"),
        ("per token" + (" (first W)" if spec.windowed else ""), f"{r['bytes_per_token']:,} B"),
        (f"longest context in {r['memory_gib']:g} GiB", fits + (f" x B={B}" if B > 1 and longest else "")),
    ]
    if spec.windowed:
        rows.append(("without windows", costs.format_bytes(r["bytes_without_windows"])))
        print_sections({"KV cache = sum over layers of 2*B*H_kv*min(P, W_l)*d_head*b": rows})
    else:
        print_sections({"KV cache = 2*L*B*H_kv*P*d_head*b": rows})


def windows_text(windows) -> str:
    """(512, 512, None, ...) -> '15 layers window 512, 3 layers full attention'."""
    from collections import Counter

    counts = Counter(windows)
    parts = [f"{n} layers window {w:,}" for w, n in sorted(counts.items(), key=lambda kv: kv[0] or 0) if w]
    return ", ".join(parts + ([f"{counts[None]} layers full attention"] if counts[None] else []))


# ---- mask --------------------------------------------------------------------------------------------


def mask(
    text: Annotated[str | None, typer.Argument(help='A prompt, e.g. "AI is fast".')] = None,
    tokens: Annotated[int | None, typer.Option("--tokens", "-n", help="P, instead of a prompt.")] = None,
    whitespace: Annotated[
        bool, typer.Option("--whitespace", help="Split on spaces instead of the model's tokenizer.")
    ] = False,
) -> None:
    """The causal mask of a prompt: which key positions each query position attends (1) or not (0)."""
    from prefill.costmodel.causal import causal_pairs
    from prefill.engine.prompt import check_text

    if (text is None) == (tokens is None):
        fail('give either a prompt ("AI is fast") or --tokens P')
    if text is not None:
        check_text(text)
    labels = [""] * tokens if text is None else (text.split() if whitespace else model_pieces(text))
    P = len(labels)
    if P < 1:
        fail("the prompt has no tokens; give some text or --tokens >= 1")
    print_mask_grid(labels[:MASK_GRID_CAP])
    if P > MASK_GRID_CAP:
        console.print(f"(showing positions 0-{MASK_GRID_CAP - 1} of {P}; the mask continues the same way)")
    last = f"{P - 1} ({labels[-1]!r})" if labels[-1] else f"{P - 1}"
    console.print(
        f"{causal_pairs(P):,} (query, key) pairs computed = P(P+1)/2 for P = {P:,}, of P^2 = {P * P:,}.\n"
        f"Position {last} is the last prompt position: it attends to all {P:,} positions, and its final-layer "
        "hidden state, through the unembedding, gives the logits of the first new token.",
        highlight=False,
    )


def model_pieces(text: str) -> list[str]:
    """The prompt as the embedded SmolLM2's tokenizer splits it."""
    from prefill.loading.resolve import default_tokenize

    return default_tokenize(text)


def print_mask_grid(labels: list[str]) -> None:
    """The top-left corner of the causal mask: rows are query positions, columns key positions."""
    from prefill.costmodel.causal import causal_mask

    shown = len(labels)
    grid = causal_mask(shown)  # [shown, shown]: the top-left corner of the full [P, P] mask
    heads = [f"{j}" + (f" {labels[j].strip()[:8]}" if labels[j].strip() else "") for j in range(shown)]
    widths = [len(h) + 2 for h in heads]
    rows = [f"{i} {labels[i].strip()[:8]}".rstrip() for i in range(shown)]
    pad = max(len("query \\ key"), *map(len, rows)) + 1
    console.print("causal mask: rows = query position, columns = key position (1 = attends)", highlight=False)
    header = "query \\ key".ljust(pad) + "".join(h.center(w) for h, w in zip(heads, widths, strict=True))
    console.print(header, style="bold", highlight=False, soft_wrap=True)
    for i in range(shown):
        cells = ("[bold green]1[/]" if grid[i, j] else "[dim]0[/]" for j in range(shown))
        line = "".join(
            " " * ((w - 1) // 2) + c + " " * (w - 1 - (w - 1) // 2) for c, w in zip(cells, widths, strict=True)
        )
        console.print(f"[cyan]{rows[i].ljust(pad)}[/]" + line, highlight=False, soft_wrap=True)
