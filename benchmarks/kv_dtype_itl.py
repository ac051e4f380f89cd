"""Decode ITL at 64 and 4,096 tokens of context with K/V stored as each K/V dtype (Engine.load(kv_dtype=...),
`--kv-dtype`), on the embedded SmolLM2's own blocks (--weights native, float32 activations), in one process and
interleaved rounds (a busy machine slows every dtype alike): one stream through the serving core's StepLoop
(benchmarks/serving_core.py), ITL p50, medians of `--rounds`, beside the time model's ITL (Engine.predict_decode,
whose K/V bytes follow the dtype). The issue's target: ITL at 4,096 / ITL at 64 <= 1.25.

    .venv/bin/python benchmarks/kv_dtype_itl.py [--rounds 3] [--weights native] [--out bench-results/kv_dtype_itl.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from serving_core import median_of, prompt, run_streams  # benchmarks/: the same streams as the serving core's

from prefill.costmodel.costs import KV_DTYPES
from prefill.engine.llm import Engine

CONTEXTS = (64, 4096)
NEW = 32  # tokens decoded per run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="native")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv", default=",".join(KV_DTYPES), help="comma-separated K/V dtypes")
    ap.add_argument("--out", default="bench-results/kv_dtype_itl.json")
    args = ap.parse_args()
    engine = Engine.load(None, dtype="float32", weights=args.weights, progress=False)
    engine.warmup()
    kvs = args.kv.split(",")
    prompts = {n: prompt(engine, n, 7) for n in CONTEXTS}
    runs: dict[str, list[dict]] = {f"{kv} ctx {n}": [] for kv in kvs for n in CONTEXTS}
    for r in range(args.rounds):
        for kv in kvs:
            engine.runner.set_kv_dtype(kv)
            for n in CONTEXTS:
                runs[f"{kv} ctx {n}"].append(run_streams(engine, [prompts[n]], NEW))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    m = {k: median_of(v) for k, v in runs.items()}
    cpu = torch.backends.cpu.get_cpu_capability()
    print(f"\nSmolLM2-135M, {engine.weights} weights, float32 activations, {torch.get_num_threads()} threads, {cpu}")
    print(
        f"{'K/V':<10} {'ITL@64 ms':>10} {'ITL@4096 ms':>12} {'ratio':>6} {'pred@64':>8} {'pred@4096':>10} {'ratio':>6}"
    )
    record = {"cpu": cpu, "weights": engine.weights, "threads": torch.get_num_threads(), "rows": {}}
    for kv in kvs:
        engine.runner.set_kv_dtype(kv)
        itl = [m[f"{kv} ctx {n}"]["itl_p50_s"] for n in CONTEXTS]
        pred = [engine.predict_decode([n + NEW // 2]).seconds for n in CONTEXTS]
        record["rows"][kv] = {"itl_s": itl, "predicted_itl_s": pred, "ratio": itl[1] / itl[0]}
        print(
            f"{kv:<10} {itl[0] * 1e3:>10.2f} {itl[1] * 1e3:>12.2f} {itl[1] / itl[0]:>6.2f} "
            f"{pred[0] * 1e3:>8.2f} {pred[1] * 1e3:>10.2f} {pred[1] / pred[0]:>6.2f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**record, "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
