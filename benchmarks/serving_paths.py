"""Every serving path this CPU runs natively, measured in one run beside its prediction, and the path `auto` picks:
does the default take the fastest one here? (issue 42: on a Zen 4 the old default, dense bfloat16, took 32 ms a
decode step where native blocks took 6 ms.)

Each path's engine is loaded once; then, in rounds that run every path in turn (this machine's speed drifts over
minutes), a warm prefill of P tokens and a greedy request of n tokens out (its ITL: the median step). Predicted:
the time model on each path's own profile (prefill.machine.paths.predict_path, the numbers auto decides by).
Our engine only; ratios between paths in one run are what it shows, the machine being shared or not.

    .venv/bin/python benchmarks/serving_paths.py [--workload 256,128] [--rounds 3] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from prefill.bench.warm import prefill_once, spread_ids
from prefill.device.capability import capability
from prefill.engine.llm import Engine
from prefill.engine.sampling import SamplingParams
from prefill.engine.weights import auto_path, native_weight_types, quantized_types
from prefill.machine.paths import Workload, candidates, predict_path
from prefill.model.quant import ops


def itl_once(engine: Engine, P: int, n: int):
    """A callable: one greedy request of P prompt tokens and n out (EOS banned), its median ITL in seconds."""
    ids = spread_ids(P, engine.spec.vocab_size, offset=3)[0].tolist()
    ban = tuple((e, -100.0) for e in engine.tokenizer.eos_ids)

    def once() -> float:
        gen = engine.complete(ids, max_new_tokens=n, sampling=SamplingParams(logit_bias=ban), chat=False)
        return statistics.median(gen.itl_s)

    return once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default=None, help="P,n (default 256,128)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    w = Workload.parse(args.workload)
    quantized = quantized_types(None)
    open_paths = candidates("auto", "auto", quantized, capability("cpu"), ops.available())
    chosen = auto_path(None, "auto", "auto", threads=args.threads, workload=w, echo=print)
    print(chosen[2] if chosen else "auto: one path open")
    engines = {
        p: Engine.load(None, dtype=p.dtype, weights=p.weights, progress=False, activations=p.activations)
        for p in open_paths
    }
    for e in engines.values():
        e.warmup()
    times: dict = {p: {"prefill": [], "itl": []} for p in open_paths}
    work = {p: (prefill_once(e, w.P), itl_once(e, w.P, w.n)) for p, e in engines.items()}
    for _ in range(args.rounds):
        for p, (prefill, itl) in work.items():
            times[p]["prefill"].append(prefill())
            times[p]["itl"].append(itl())
    rows = []
    spec = next(iter(engines.values())).spec
    qtypes = native_weight_types(None, spec) if quantized else {}
    for p in open_paths:
        pred = predict_path(spec, p, w, qtypes, threads=args.threads)
        measured = {k: statistics.median(v) for k, v in times[p].items()}
        rows.append(
            {
                "path": pred.label,
                "weights": p.weights,
                "dtype": p.dtype,
                "activations": p.activations,
                "auto": (chosen[0], chosen[1], chosen[3]) == (p.dtype, p.weights, p.activations) if chosen else None,
                "prefill_s": measured["prefill"],
                "itl_s": measured["itl"],
                "pred_prefill_s": pred.ttft_s,
                "pred_itl_s": pred.itl_s,
            }
        )
    best_itl = min(r["itl_s"] for r in rows)
    print(f"{capability('cpu').name}, {torch.get_num_threads()} threads, {w}, median of {args.rounds} rounds")
    print(f"{'path':44} {'prefill ms':>10} {'pred':>7} {'ITL ms':>7} {'pred':>6} {'ITL / best':>10}")
    for r in rows:
        mark = " <- auto" if r["auto"] else ""
        print(
            f"{r['path']:44} {r['prefill_s'] * 1e3:10.1f} {r['pred_prefill_s'] * 1e3:7.1f} {r['itl_s'] * 1e3:7.2f}"
            f" {r['pred_itl_s'] * 1e3:6.2f} {r['itl_s'] / best_itl:10.2f}{mark}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpu": capability("cpu").name, "threads": torch.get_num_threads(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
