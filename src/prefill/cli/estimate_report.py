"""What `prefill estimate` prints: the setting, FLOPs, time, TTFT, KV cache and roofline of one estimate.

Rendering only: every number comes from `prefill.costmodel.estimate` (and so from `prefill.costmodel.costs`).
"""

from __future__ import annotations

from prefill.cli.common import eng, print_sections, secs
from prefill.costmodel import costs
from prefill.costmodel.estimate import Estimate

FLOPS_CAPTION = (
    "2*N*P also counts the (un)embedding for every token and no attention; exact counts attention over the causal "
    "triangle and logits for the last position only."
)


def print_estimate(est: Estimate, on_cpu: bool = False) -> None:
    """The estimate as tables; on_cpu adds the calibrated prediction (or where a calibration would be)."""
    T = est.setting.T
    sections = {
        "Setup": setup_rows(est),
        "Prefill FLOPs": flop_rows(est),
        "Prefill time": time_rows(est, on_cpu),
        "TTFT": [
            ("network", secs(est.ttft.network_s)),
            ("tokenization", secs(est.ttft.tokenize_s)),
            ("prefill", secs(est.ttft.prefill_s)),
            ("TTFT", secs(est.ttft.ttft_s)),
        ],
    }
    if est.kv:
        sections["KV cache"] = kv_rows(est)
    if est.weights:
        sections["Weights"] = weight_rows(est)
    sections["Roofline"] = roofline_rows(est)
    captions = {"Prefill FLOPs": FLOPS_CAPTION} if est.exact else {}
    if T > 1:
        captions["Prefill time"] = (
            f"On {T} GPUs: FLOPs per GPU at peak x MFU, plus the ring all-reduces (2 per layer) at the link "
            "bandwidth, not overlapped."
        )
    print_sections(sections, captions)


def setup_rows(est: Estimate) -> list[tuple[str, str]]:
    s, spec = est.setting, est.setting.spec
    return [
        ("model", f"{spec.name} ({spec.arch})" if spec else "only N given (no shapes)"),
        ("N parameters", f"{est.N:,.0f}" + (f" ({spec.N_non_embedding:,} non-embedding)" if spec else "")),
        ("prompt", f"P = {s.P:,} tokens x B = {s.B}"),
        ("hardware", s.hardware + (f" x {s.T} (tensor parallel)" if s.T > 1 else "")),
        ("peak x MFU", f"{eng(s.peak_flops_per_s, 'FLOP/s')} x {s.mfu:g} ({est.dtype})"),
    ]


def flop_rows(est: Estimate) -> list[tuple[str, str]]:
    rows = [("2*N*P", eng(est.flops_2NP, "FLOP"))]
    if count := est.exact:
        diff = est.flops_exact_minus_2NP
        windowed = "windowed " if est.setting.spec.windowed else ""
        rows += [
            ("exact: linear (2*N_non_emb*P)", eng(count.linear, "FLOP")),
            (f"exact: attention ({windowed}causal pairs)", eng(count.attention, "FLOP")),
            ("exact: unembed (last position)", eng(count.unembed, "FLOP")),
            ("exact total", eng(count.total, "FLOP")),
            ("exact - 2*N*P", f"{diff:+.4g} FLOP ({diff / est.flops_2NP:+.2%})"),
        ]
    return rows


def time_rows(est: Estimate, on_cpu: bool) -> list[tuple[str, str]]:
    rows = [("prefill at peak x MFU (2*N*P)", secs(est.prefill_s_2NP))]
    if est.exact:
        rows.append(("prefill at peak x MFU (exact)", secs(est.prefill_s_exact)))
    if tp := est.tensor_parallel:
        rows += [
            (f"FLOPs per GPU (/{tp.T})", eng(tp.flops_per_gpu, "FLOP")),
            ("all-reduce bytes per GPU (ring)", eng(tp.allreduce_bytes_per_gpu, "B")),
            ("all-reduce time", secs(tp.allreduce_s) if tp.allreduce_s is not None else "no link bandwidth known"),
            (f"prefill on {tp.T} GPUs", secs(tp.prefill_s)),
        ]
    if on_cpu and est.exact:
        rows.append(("calibrated prediction", calibrated_text(est)))
    return rows


def calibrated_text(est: Estimate) -> str:
    """The calibrated prediction and where its rates come from, or where a calibration would be saved."""
    from prefill.costmodel.hardware import calibration_path

    cal = est.setting.calibration
    if cal is None:
        return f"none saved at {calibration_path()}"
    return f"{secs(est.calibrated_prefill_s)} ({cal.dtype}, {cal.threads} threads, {cal.source})"


def kv_rows(est: Estimate) -> list[tuple[str, str]]:
    kv, spec = est.kv, est.setting.spec
    rows = [("after prefill", costs.format_bytes(kv.bytes)), ("per token", f"{kv.bytes_per_token:,} B")]
    if tp := est.tensor_parallel:
        heads = f"{tp.kv_heads_per_gpu} of {spec.H_kv} KV heads"
        rows.append((f"per GPU ({heads})", costs.format_bytes(kv.bytes_per_gpu)))
    return rows


def weight_rows(est: Estimate) -> list[tuple[str, str]]:
    w = est.weights
    return [
        ("stored as", w.projections if w.projections == w.embedding else f"{w.projections} (embedding {w.embedding})"),
        ("bytes per weight", f"{w.bytes_per_weight:.4g}"),
        ("all weights", costs.format_bytes(w.weight_bytes)),
        ("read per decode step", costs.format_bytes(w.decode_weight_bytes)),
        ("decode floor (bytes / bandwidth)", secs(w.decode_weight_floor_s)),
    ]


def roofline_rows(est: Estimate) -> list[tuple[str, str]]:
    rf = est.roofline
    weights_only = "" if est.setting.spec else " (weight bytes only)"
    crossover = rf.compute_bound_from_P
    return [
        ("prefill intensity" + weights_only, f"{rf.prefill_intensity:,.1f} FLOP/B -> {rf.prefill_bound}"),
        ("decode step intensity (~2/b)", f"{rf.decode_intensity:,.1f} FLOP/B -> {rf.decode_bound}"),
        ("ridge point (peak / bandwidth)", f"{rf.ridge_point:,.1f} FLOP/B"),
        ("prefill compute-bound from", f"P >= {crossover:,} tokens" if crossover else "never (below max P)"),
    ]
