"""Predicted beside measured: warm prefill and decode steps of the embedded SmolLM2-135M, with this machine's quick
probe alone and with the profile fitted to these measurements (issue 17's targets: <= 25% and <= 10%).

Prefill: a fresh request's forward (its own blocks of a KV pool allocated once, so no page is faulted in after
the warm-up) at every P. Decode: one step of B rows, each row with S tokens of its own context (prefilled for
real; each row cut back to S after every step). Every workload is timed once per round, in turn, for --repeats
rounds after one untimed call of each, and its median taken: this machine's speed drifts over minutes, and
measuring each workload's repeats back to back biased the ones measured in a slow minute. For the same reason
the quick probe (its few seconds of GEMMs, attention, bandwidth and overhead) runs again in every round, and the
prediction reads the median of its rounds (saved as this machine's probe): a probe of other minutes than the
measurements predicts the machine of those minutes (--cached-probe does that, to show it). The fit uses a
subset of the points (marked); the others are held out. The fitted profile is saved for this machine, dtype
and model, so `prefill run` and `prefill bench` then predict with it.

    .venv/bin/python benchmarks/predict.py [--threads 2] [--repeats 5] [--weights float32|bfloat16|native]
        [--cached-probe] [--out FILE] [--publish [DIR]]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console

from prefill.bench.gpu import catalog_rows, catalog_table, load_result
from prefill.bench.published import publish, publish_option
from prefill.bench.results import parse_ints
from prefill.bench.warm import interleaved_medians, prefill_once, spread_ids, timed
from prefill.costmodel.fit import Sample, fit_profile
from prefill.costmodel.ops import Row
from prefill.costmodel.timemodel import prefill_steps
from prefill.engine.llm import Engine

PROMPT_LENGTHS = (1, 4, 16, 64, 256, 1024, 4096)
BATCHES = (1, 4, 8)
CONTEXTS = (64, 1024, 4096)
FIT_PREFILL = (1, 16, 256, 4096)  # the fit's points; the rest are held out
FIT_DECODE = ((1, 64), (4, 1024), (8, 4096))


def decode_once(engine: Engine, seqs: list, S: int) -> Callable[[], float]:
    """A callable that times one decode step of len(seqs) rows at context S (each row cut back to S after it)."""
    ids = torch.full((len(seqs), 1), 42, device=engine.device)  # [B, 1]

    def once() -> float:
        try:
            return timed(engine, lambda: engine.forward(ids, seqs))
        finally:
            for s in seqs:
                s.truncate(S)

    return once


def decode_workloads(engine: Engine, contexts: tuple[int, ...]) -> dict:
    """(B, S) -> a timed decode step, for every batch and context; each context's rows are prefilled once, for
    real (each row its own tokens and its own blocks)."""
    out = {}
    for S in contexts:
        pool = engine.new_pool(max(BATCHES) * (S + 2 + 16))  # + a block of rounding per row
        seqs = [pool.new_seq() for _ in range(max(BATCHES))]
        for s in seqs:
            s.reserve(S + 2)
        for b, seq in enumerate(seqs):
            engine.prefill(spread_ids(S, engine.spec.vocab_size, offset=b * S).to(engine.device), seq, chunk_size=1024)
        out.update({(B, S): decode_once(engine, seqs[:B], S) for B in BATCHES})
    return out


def probe_once(engine: Engine, entries: list[dict]) -> Callable[[], float]:
    """A callable that runs the quick probe once (appending its measurements to `entries`) and returns its
    seconds: a workload of the interleaved rounds like the others."""
    from prefill.machine.profiles import measure_entry

    def once() -> float:
        t = time.perf_counter()
        how = {"qtypes": engine.weight_types(), "kv_dtype": engine.kv_dtype_name}
        entries.append(measure_entry(engine.spec, engine.dtype_name, str(engine.device), **how))
        return time.perf_counter() - t

    return once


def rounds_profile(engine: Engine, entries: list[dict], save: bool):
    """The profile of the rounds' probes (point-wise medians), saved as this machine's quick probe with `save`."""
    from prefill.machine.entries import median_entry
    from prefill.machine.profiles import profile_of, save_probe

    entry = median_entry(entries)
    entry["measured"] = f"{time.strftime('%Y-%m-%d %H:%M')} (median of {len(entries)}, one in each round)"
    if save:
        save_probe(entry, engine.dtype_name, str(engine.device))
    print(f"quick probe: the median of {len(entries)} probes, one in each round of the measurements")
    device, kv = str(engine.device), engine.kv_dtype_name
    return profile_of(entry, engine.spec, engine.dtype_name, device, engine.weight_types(), kv_dtype=kv)


def samples_of(prefills: dict[int, float], decodes: list[tuple[int, int, float]]) -> list[tuple[Sample, bool]]:
    """Each measurement as a fit Sample, and whether the fit uses it."""
    out = [
        (Sample(tuple(map(tuple, prefill_steps(P))), s, f"prefill P={P}"), P in FIT_PREFILL)
        for P, s in prefills.items()
    ]
    out += [(Sample(((Row(1, S),) * B,), s, f"decode B={B} S={S}"), (B, S) in FIT_DECODE) for B, S, s in decodes]
    return out


def predict(engine: Engine, sample: Sample, profile):
    rows = sample.steps[0]
    if rows[0].new == 1 and rows[0].past > 0:
        return engine.predict_decode([r.past for r in rows], profile)
    return engine.predict_prefill(rows[0].new, profile=profile)


def report(engine: Engine, samples, quick, fitted) -> list[dict]:
    from rich.table import Table

    t = Table(title=f"{engine.spec.name}, {engine.dtype_name}, {engine.threads()} threads: predicted beside measured")
    for col in ("workload", "measured ms", "quick probe ms", "error", "fitted ms", "error", "dominant (fitted)", "fit"):
        t.add_column(col, justify="right")
    rows = []
    for sample, used in samples:
        q, f = predict(engine, sample, quick), predict(engine, sample, fitted)
        eq, ef = q.seconds / sample.seconds - 1, f.seconds / sample.seconds - 1
        t.add_row(
            sample.label,
            f"{sample.seconds * 1e3:,.1f}",
            f"{q.seconds * 1e3:,.1f}",
            f"{eq:+.1%}",
            f"{f.seconds * 1e3:,.1f}",
            f"{ef:+.1%}",
            f.dominant,
            "yes" if used else "held out",
        )
        rows.append(
            {
                "workload": sample.label,
                "measured_s": sample.seconds,
                "quick_s": q.seconds,
                "fitted_s": f.seconds,
                "quick_error": eq,
                "fitted_error": ef,
                "dominant": f.dominant,
                "explain": f.explain(),
                "fit_point": used,
            }
        )
    Console(width=140).print(t)
    return rows


def largest_error(rows: list[dict], key: str) -> float | None:
    """The largest |error| of `key` over `rows` (None for no rows)."""
    return max((abs(r[key]) for r in rows), default=None)


def held_out(rows: list[dict]) -> list[dict]:
    """The points the fit did not use."""
    return [r for r in rows if not r["fit_point"]]


def summary(rows: list[dict]) -> str:
    def worst(key: str, subset) -> str:
        e = largest_error(subset, key)
        return "-" if e is None else f"{e:.1%}"

    return (
        f"largest |error|: quick probe alone {worst('quick_error', rows)}; fitted profile "
        f"{worst('fitted_error', rows)} over all points, {worst('fitted_error', held_out(rows))} over the held-out ones"
    )


def profile_line(name: str, p) -> str:
    return (
        f"{name}: GEMM x {p.gemm_efficiency:.3f}, attention x {p.attention_efficiency:.3f}, bandwidth "
        f"{p.bandwidth_bytes_per_s / 1e9:.1f} GB/s, {p.op_overhead_s * 1e6:.2f} us per launch, "
        f"{p.step_overhead_s * 1e3:.2f} ms per forward ({p.source})"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="benchmarks/predict.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt-lengths", default=",".join(map(str, PROMPT_LENGTHS)), help="P values to prefill")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="decode contexts S")
    ap.add_argument("--no-save", action="store_true", help="do not save the fitted profile")
    ap.add_argument(
        "--weights",
        default="float32",
        help="float32 (the default), bfloat16 (dense, as `prefill serve` runs on a CPU with AMX or AVX-512-BF16) or "
        "native (the GGUF's blocks, float32 activations, as `prefill serve` runs on other CPUs)",
    )
    ap.add_argument(
        "--cached-probe",
        action="store_true",
        help="predict from the machine's cached quick probe (default: the quick probe run again in every round)",
    )
    ap.add_argument("--out", default="bench-results/predict.json")
    ap.add_argument("--publish", **publish_option())
    return ap.parse_args(argv)


def measure(engine: Engine, args: argparse.Namespace, lengths: list[int], contexts: list[int]) -> tuple:
    """The interleaved rounds: every workload's median seconds, the quick probe of those rounds (or the cached one),
    the rows of measured beside predicted, and the fit."""
    cached = engine.profile(fitted=False, echo=print)
    pool = engine.new_pool(max(lengths) + 8)
    workloads = {("prefill", P): prefill_once(engine, P, pool) for P in lengths}
    workloads |= {("decode", *key): once for key, once in decode_workloads(engine, contexts).items()}
    probes: list[dict] = []
    if not args.cached_probe:
        workloads[("probe",)] = probe_once(engine, probes)
    medians = interleaved_medians(workloads, args.repeats)
    quick = cached if args.cached_probe else rounds_profile(engine, probes[1:], save=not args.no_save)
    prefills = {key[1]: s for key, s in medians.items() if key[0] == "prefill"}
    decodes = [(B, S, s) for (kind, *rest), s in medians.items() if kind == "decode" for B, S in [rest]]
    samples = samples_of(prefills, decodes)
    if sum(used for _, used in samples) < 5:  # other lengths than the default: fit on every point, and say so
        samples = [(s, True) for s, _ in samples]
    fit = fit_profile(engine.spec, quick, engine.layout(), [s for s, used in samples if used])
    return cached, quick, fit, report(engine, samples, quick, fit.profile)


def print_and_keep(engine: Engine, args: argparse.Namespace, cached, quick, fit, rows: list[dict], load: float) -> dict:
    """The summary and the profiles' lines printed, the fit saved where it predicts the held-out points better;
    returns the H200 rows from the catalog."""
    print(summary(rows))
    print(profile_line("quick probe", quick))
    print(profile_line("fitted", fit.profile))
    cold = engine.predict_prefill(16, profile=quick).seconds
    print(profile_line("cached probe (not used)" if not args.cached_probe else "cached probe", cached))
    print(
        f"cold (first prefill after load, P = 16): measured {engine.cold_prefill_s * 1e3:.1f} ms beside the warm "
        f"prediction {cold * 1e3:.1f} ms; never mixed into the warm figures above"
    )
    print(f"load average at the start {load:.2f}, at the end {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    h200 = catalog_rows(load_result(Path(__file__).resolve().parents[1] / "docs" / "gpu-h200.json"))
    Console(width=140).print(catalog_table(h200))
    judged = held_out(rows) or rows  # every point when the fit used them all
    better = largest_error(judged, "fitted_error") < largest_error(judged, "quick_error")
    if not args.no_save and better:  # kept per weights: a fit of the block kernels is not the dense one's
        from prefill.machine.fits import save_fitted

        save_fitted(engine.spec, fit.profile, str(engine.device), qtypes=engine.weight_types())
        print("saved the fitted profile: `prefill run` and `prefill bench` now predict with it on this machine")
    elif not better:
        print("the fit predicts the held-out points worse than the quick probe: not saved")
    return h200


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lengths, contexts = parse_ints(args.prompt_lengths, "--prompt-lengths"), parse_ints(args.contexts, "--contexts")
    dtype = "bfloat16" if args.weights == "bfloat16" else "float32"  # native blocks take float32 activations
    engine = Engine.load(None, dtype=dtype, weights=args.weights, threads=args.threads, progress=False)
    engine.warmup()
    load = os.getloadavg()[0]
    cached, quick, fit, rows = measure(engine, args, lengths, contexts)
    h200 = print_and_keep(engine, args, cached, quick, fit, rows, load)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "threads": engine.threads(),
                "rows": rows,
                "fit": fit.parameters,
                "h200_from_the_catalog": h200,
                "quick": quick.to_json(),
                "fitted": fit.profile.to_json(),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    if args.publish is not None:
        table = published_table(rows, args.weights)
        print(f"wrote {publish(args.publish, 'predict', TITLE, threads=engine.threads(), **table)}")
    return 0


TITLE = "The time model: warm prefill and decode steps, predicted beside measured"


def published_table(rows: list[dict], weights: str) -> dict:
    """The results file's table: each workload measured, the quick probe's and the fitted profile's prediction."""
    cells = [
        [
            r["workload"],
            f"{r['measured_s'] * 1e3:,.1f}",
            f"{r['quick_s'] * 1e3:,.1f} ({r['quick_error']:+.1%})",
            f"{r['fitted_s'] * 1e3:,.1f} ({r['fitted_error']:+.1%})",
            r["dominant"],
            "yes" if r["fit_point"] else "held out",
        ]
        for r in rows
    ]
    columns = ["workload", "measured ms", "quick probe ms (error)", "fitted ms (error)", "dominant (fitted)", "fit"]
    quick, fitted = largest_error(rows, "quick_error"), largest_error(rows, "fitted_error")
    held = largest_error(held_out(rows), "fitted_error")
    headline = [
        f"time model ({weights} weights): quick probe within {quick:.1%}, fitted within {fitted:.1%}"
        + ("" if held is None else f" ({held:.1%} held out)")
    ]
    return {"columns": columns, "rows": cells, "notes": summary(rows) + " (targets 25% and 10%).", "headline": headline}


if __name__ == "__main__":
    raise SystemExit(main())
