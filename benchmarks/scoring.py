"""Scoring prefill vs generation prefill on the embedded model: what the all-position unembedding costs.

For each P, times (median of --repeats, after a warm-up) a generation prefill (logits of the last position) and a
scoring prefill (every position unembedded and log-softmaxed in slices, prefill.engine.scoring) on the same tokens, and
prints both beside the cost model's FLOPs: the predicted extra cost is the unembedding of P - 1 more positions.

    .venv/bin/python benchmarks/scoring.py [--prompt-lengths 128,512,1024] [--dtype float32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from prefill.costmodel import costs
from prefill.engine.llm import Engine
from prefill.engine.scoring import score


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: kernel choice for this shape
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-lengths", default="128,512,1024")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    engine = Engine.load(dtype=args.dtype, progress=False)
    engine.warmup()
    rows = []
    print(f"{engine.source} {args.dtype}, {torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}")
    print(
        f"{'P':>6} {'generation s':>13} {'scoring s':>10} {'measured x':>11} {'predicted x':>12} {'unembed share':>14}"
    )
    for P in (int(p) for p in args.prompt_lengths.split(",")):
        ids = [(i * 7919) % (engine.spec.vocab_size - 1) + 1 for i in range(P)]  # fixed pseudo-random tokens
        gen_s = median_seconds(lambda ids=ids: (engine.prefill(ids), engine.sync()), args.repeats)
        score_s = median_seconds(lambda ids=ids: score(engine, ids), args.repeats)
        gen, scoring = costs.prefill_flops_exact(engine.spec, P), costs.scoring_flops_exact(engine.spec, P)
        row = {
            "P": P,
            "generation_s": gen_s,
            "scoring_s": score_s,
            "measured_ratio": score_s / gen_s,
            "predicted_ratio": scoring.total / gen.total,
            "unembed_share": scoring.unembed_share,
            "scoring_flops": scoring.total,
            "generation_flops": gen.total,
        }
        rows.append(row)
        print(
            f"{P:>6} {gen_s:>13.3f} {score_s:>10.3f} {row['measured_ratio']:>11.3f} {row['predicted_ratio']:>12.3f} "
            f"{row['unembed_share']:>14.1%}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
