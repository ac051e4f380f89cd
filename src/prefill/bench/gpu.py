"""The GPU check behind benchmarks/gpu.sh: Llama-3-8B shapes, random bf16 weights, ours beside transformers.

Nothing is downloaded: transformers' LlamaForCausalLM is built with random weights directly on the device,
and our engine is built from that same state dict, so both run the same weights on the same token ids.
MFU is against the bf16 GEMM rate measured on the same device in the same run.

    python -m prefill.bench.gpu                                # CUDA, llama-3-8b, P = 512, 2048, 8192
    python -m prefill.bench.gpu --device cpu --preset tiny     # the same script on tiny shapes (tests, CI)
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from prefill.bench import published
from prefill.bench.timing import measure_peak_memory, time_call
from prefill.costmodel.costs import bytes_to_mib, mfu, prefill_flops_exact
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput

# Llama-3-8B's layout shrunk to two layers, for CPU runs of this script: GQA (H_q = 2 H_kv), SwiGLU, untied.
TINY = ModelSpec(
    name="tiny-llama",
    arch="llama",
    L=2,
    d_model=128,
    H_q=4,
    H_kv=2,
    d_head=32,
    d_ff=256,
    vocab_size=512,
    context_length=8192,
    tied_embeddings=False,
    rope_theta=500000.0,
    norm_eps=1e-5,
)
DEFAULT_LENGTHS = {"llama-3-8b": (512, 2048, 8192), "tiny": (64, 256, 1024)}


@dataclass(frozen=True)
class GpuPoint:
    """One engine at one P: seconds, tokens/s, FLOP/s, MFU against the measured bf16 GEMM rate, memory."""

    engine: str
    P: int
    cold_s: float
    median_s: float
    p90_s: float
    tokens_per_s: float
    flops_per_s: float
    mfu: float
    peak_bytes: int


def hf_config(spec: ModelSpec):
    """A transformers LlamaConfig with `spec`'s shapes and SDPA attention."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.d_model,
        intermediate_size=spec.d_ff,
        num_hidden_layers=spec.L,
        num_attention_heads=spec.H_q,
        num_key_value_heads=spec.H_kv,
        head_dim=spec.d_head,
        max_position_embeddings=spec.context_length,
        rope_theta=spec.rope_theta,
        rms_norm_eps=spec.norm_eps,
        tie_word_embeddings=spec.tied_embeddings,
        attn_implementation="sdpa",
    )


def build_pair(spec: ModelSpec, device: str, dtype: str = "bfloat16", seed: int = 0):
    """(our Engine, transformers model) sharing one set of random weights on `device`."""
    import torch
    from transformers import LlamaForCausalLM

    from prefill.bench.peers import TransformersPeer
    from prefill.engine.llm import Engine
    from prefill.engine.runner import torch_dtype

    torch.manual_seed(seed)
    dt = torch_dtype(dtype)
    with torch.device(device):
        hf = LlamaForCausalLM._from_config(hf_config(spec), dtype=dt)
    ours = Engine.from_state_dict(spec, hf.state_dict(), None, dtype, device, f"random {spec.name}")
    return ours, TransformersPeer(model=hf, dtype=dtype, device=device)


def logits_gap(ours, peer, P: int = 16) -> tuple[float, bool]:
    """Max |logit difference| between ours and transformers at one short prompt, relative to max |logit|,
    and whether both pick the same top token (random weights give flat logits, so the ratio alone is harsh)."""
    import torch

    ids = torch.arange(P, device=ours.device)[None] % ours.spec.vocab_size  # [1, P]
    a, _ = ours.prefill(ids)
    b = peer.prefill(ids).float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)), bool((a.argmax(-1) == b.argmax(-1)).all())


def run(spec: ModelSpec, lengths: tuple[int, ...], device: str, repeats: int, peer_too: bool = True) -> dict:
    """Time ours (and transformers) at each P; returns a JSON-ready dict with the GEMM rate and every point."""
    import torch

    from prefill.machine.probe import measure_gemm_rate

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BadInput("no CUDA device here: run with --device cpu --preset tiny for the CPU variant")
    too_long = [P for P in lengths if spec.context_length < P]
    if too_long:
        raise BadInput(f"prompt lengths {too_long} exceed {spec.name}'s context length {spec.context_length}")
    t0 = time.perf_counter()
    gemm = measure_gemm_rate("bfloat16", device=device)
    ours, peer = build_pair(spec, device)
    gap, same_top1 = logits_gap(ours, peer)
    if not peer_too:
        peer = None
    points: list[GpuPoint] = []
    for P in lengths:
        ids = torch.randint(0, spec.vocab_size, (1, P), device=device)  # [1, P]
        flops = prefill_flops_exact(spec, P).total
        runs = [("prefill", lambda ids=ids: ours.prefill(ids))]
        if peer is not None:
            runs.append(("transformers", lambda ids=ids: peer.prefill(ids)))
        for name, fn in runs:
            with torch.inference_mode():
                tm = time_call(fn, repeats=repeats, warmup=2, device=device)
                mem = measure_peak_memory(fn, device=device)
            points.append(
                GpuPoint(
                    engine=name,
                    P=P,
                    cold_s=tm.cold_s,
                    median_s=tm.median_s,
                    p90_s=tm.p90_s,
                    tokens_per_s=P / tm.median_s,
                    flops_per_s=flops / tm.median_s,
                    mfu=mfu(flops, tm.median_s, gemm),
                    peak_bytes=mem.peak_bytes,
                )
            )
    return {
        "spec": asdict(spec),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "transformers": _transformers_version(),
        "bf16_gemm_flops_per_s": gemm,
        "logits_rel_gap_vs_transformers": gap,
        "same_top1_as_transformers": same_top1,
        "points": [asdict(p) for p in points],
        "wall_s": time.perf_counter() - t0,
    }


def table(result: dict):
    """A rich table of the run: ours and transformers per P, with MFU and our speed-up."""
    from rich.table import Table

    gemm_tflops = result["bf16_gemm_flops_per_s"] / 1e12
    t = Table(
        title=(
            f"{result['spec']['name']} bf16 on {result['device']}: bf16 GEMM {gemm_tflops:.1f} TFLOP/s measured; "
            f"logits vs transformers: rel. gap {result['logits_rel_gap_vs_transformers']:.1e}, "
            f"same top token: {result.get('same_top1_as_transformers')}"
        )
    )
    for col in COLUMNS:
        t.add_column(col, justify="right")
    for row in gpu_rows(result):
        t.add_row(*row)
    return t


COLUMNS = ("P", "engine", "median ms", "p90 ms", "tok/s", "TFLOP/s", "MFU", "peak MiB", "speed-up")


def gpu_rows(result: dict) -> list[list[str]]:
    """The table's cells: ours and transformers per P, MFU against the measured GEMM rate, our speed-up."""
    pts, rows = result["points"], []
    for p in pts:
        hf = next((q for q in pts if q["engine"] == "transformers" and q["P"] == p["P"]), None)
        speedup = hf["median_s"] / p["median_s"] if hf and p["engine"] == "prefill" else None
        rows.append(
            [
                str(p["P"]),
                p["engine"],
                f"{p['median_s'] * 1e3:.2f}",
                f"{p['p90_s'] * 1e3:.2f}",
                f"{p['tokens_per_s']:,.0f}",
                f"{p['flops_per_s'] / 1e12:.2f}",
                f"{p['mfu']:.1%}",
                f"{bytes_to_mib(p['peak_bytes']):,.0f}",
                "" if speedup is None else f"{speedup:.2f}x",
            ]
        )
    return rows


def publish(result: dict, root: str | Path, **fields) -> Path:
    """A gpu.json (as loaded) as the results file root/<GPU>/gpu.json, with the GPU and torch it names (a CPU
    run of the tiny preset: this CPU's kind). fields: command, date, commit, conditions, notes, headline."""
    import datetime

    conditions = fields.pop("conditions", "")
    if result["device"] == "cpu":
        kind, machine = published.this_machine("cpu", conditions=conditions)
    else:
        kind = published.kind_slug(result["device"], "CUDA")
        machine = published.Machine(name=result["device"], kind="CUDA", torch=result["torch"], conditions=conditions)
    gemm = result["bf16_gemm_flops_per_s"] / 1e12
    said = (
        f"bf16 GEMM rate measured in the same run: {gemm:.1f} TFLOP/s; logits against transformers: max |difference| "
        f"{result['logits_rel_gap_vs_transformers']:.1%} of max |logit|, same top token: "
        f"{result.get('same_top1_as_transformers')}."
    )
    out = published.Result(
        benchmark="gpu",
        kind=kind,
        title=f"{result['spec']['name'].split('/')[-1]} shapes, random bf16 weights: ours beside transformers",
        machine=machine,
        command=fields.pop("command", None) or published.command_line(program="benchmarks/gpu.sh"),
        date=fields.pop("date", None) or datetime.date.today().isoformat(),
        commit=fields.pop("commit", None) or published.git_commit(),
        columns=COLUMNS,
        rows=tuple(map(tuple, gpu_rows(result))),
        notes=fields.pop("notes", said),
        plot={"x": "P", "y": ["MFU"], "series": "engine", "ylabel": "MFU (%)", "labels": {"prefill": "ours"}},
        **fields,
    )
    return published.write(out, root)


def load_result(path: str | Path) -> dict:
    """A gpu.json this script wrote (docs/gpu-h200.json is one)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"cannot read {path}: {e}") from None


def catalog_rows(result: dict, hardware: str | None = None) -> list[dict]:
    """Our measured points of a gpu.json beside the time model's prediction from the catalog entry of the GPU it
    ran on (datasheet peak and bandwidth, stated efficiencies: prefill.costmodel.profile.GPU_EFFICIENCY)."""
    from prefill.costmodel.hardware import HARDWARE, get_hardware
    from prefill.costmodel.profile import catalog_profile
    from prefill.costmodel.timemodel import layout_for, predict_prefill

    device = result["device"].lower()
    name = hardware or next((key for key in HARDWARE if key.split("-")[0] in device), None)
    if name is None:
        raise BadInput(f"{result['device']} is not in the hardware catalog; name one of {', '.join(HARDWARE)}")
    spec = ModelSpec(**result["spec"])
    profile = catalog_profile(get_hardware(name), "bfloat16")
    layout = layout_for("bfloat16", gathers_kv=False)  # fresh prefills read no cached context
    rows = []
    for p in (p for p in result["points"] if p["engine"] == "prefill"):
        pred = predict_prefill(spec, p["P"], profile, layout)
        rows.append(
            {
                "P": p["P"],
                "measured_s": p["median_s"],
                "predicted_s": pred.seconds,
                "error": pred.seconds / p["median_s"] - 1,
                "dominant": pred.dominant,
                "explain": pred.explain(),
                "profile": profile.source,
            }
        )
    return rows


def catalog_table(rows: list[dict]):
    """A rich table of catalog_rows: measured, predicted from the datasheet, error, what dominates."""
    from rich.table import Table

    t = Table(title="predicted from the hardware catalog beside measured", caption=rows[0]["profile"] if rows else "")
    for col in ("P", "measured ms", "predicted ms", "error", "dominant"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            str(r["P"]),
            f"{r['measured_s'] * 1e3:.2f}",
            f"{r['predicted_s'] * 1e3:.2f}",
            f"{r['error']:+.1%}",
            r["dominant"],
        )
    return t


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print the table, write gpu.json; returns the exit code."""
    from rich.console import Console

    from prefill.bench.results import parse_ints

    ap = argparse.ArgumentParser(prog="benchmarks/gpu.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--preset", default="llama-3-8b", choices=sorted(DEFAULT_LENGTHS), help="model shapes")
    ap.add_argument("--prompt-lengths", default=None, help="comma-separated P (default per preset)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-transformers", action="store_true", help="time ours only")
    ap.add_argument("--out", default="bench-results", help="folder for gpu.json")
    ap.add_argument("--publish", **published.publish_option())
    args = ap.parse_args(argv)
    console = Console()
    try:
        spec = TINY if args.preset == "tiny" else ModelSpec.from_preset(args.preset)
        lengths = parse_ints(args.prompt_lengths, "--prompt-lengths") if args.prompt_lengths else None
        result = run(spec, lengths or DEFAULT_LENGTHS[args.preset], args.device, args.repeats, not args.no_transformers)
    except BadInput as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        return 2
    console.print(table(result))
    if args.device.startswith("cuda"):
        try:
            console.print(catalog_table(catalog_rows(result)))
        except BadInput as e:  # a GPU outside the catalog has no datasheet prediction
            console.print(f"no catalog prediction: {e}", highlight=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {out / 'gpu.json'} in {result['wall_s']:.0f} s", highlight=False)
    if args.publish is not None:
        console.print(f"wrote {publish(result, args.publish)}", highlight=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
