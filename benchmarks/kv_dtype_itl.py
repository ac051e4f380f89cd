"""Decode ITL at 64 and 4,096 tokens of context with K/V stored as each K/V dtype (Engine.load(kv_dtype=...),
`--kv-dtype`), on the embedded SmolLM2's own blocks (--weights native, float32 activations), in one process.

Each context is prefilled once, in float32; its K/V are then copied into a pool of each K/V dtype (rounded or
quantized as the pool's store does), since a decode step's time depends on the bytes it reads, not on their
values. One decode step (Engine.decode_step, the fused decode_block and the paged kernel) is then timed again
and again at the same position, rounds interleaving the dtypes so a busy machine slows all of them alike:
median ITL of `--steps` steps a round, median of `--rounds`, beside the time model's (Engine.predict_decode,
whose K/V bytes follow the dtype). The issue's target: ITL at 4,096 / ITL at 64 <= 1.25.

    .venv/bin/python benchmarks/kv_dtype_itl.py [--rounds 3] [--steps 15] [--out bench-results/kv_dtype_itl.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from serving_core import prompt  # benchmarks/: the serving core's plain-words prompts

from prefill.costmodel.costs import KV_DTYPES
from prefill.engine.kvcache import SeqKV
from prefill.engine.llm import Engine
from prefill.model import kv_quant

CONTEXTS = (64, 4096)


def copy_into(engine: Engine, cold: SeqKV, kv: str) -> SeqKV:
    """A cache of `cold`'s positions in a fresh pool of K/V dtype `kv`, its K/V copied as that pool stores them."""
    n = cold.length
    seq = engine.new_pool(n + 16, kv).new_seq()
    seq.reserve(n + 1)
    slots = seq.slots(0, 0, n)
    for layer in range(engine.spec.L):
        for src, dst in ((cold.k(layer)[0], seq.pool.k[layer]), (cold.v(layer)[0], seq.pool.v[layer])):
            rows = kv_quant.quantize(src) if dst.dtype == torch.uint8 else src.to(dst.dtype)  # [H_kv, n, width]
            dst.index_copy_(1, slots, rows)
    seq.length = n
    return seq


def step_seconds(engine: Engine, seq: SeqKV, steps: int) -> tuple[float, float]:
    """Median wall seconds and median process CPU seconds (all threads: what other load on a shared machine moves
    less) of one decode step at position seq.length (the step's K/V write undone each time)."""
    n, token, wall, cpu = seq.length, torch.tensor([42]), [], []
    with torch.inference_mode():
        for _ in range(steps):
            seq.truncate(n)
            t, c = time.perf_counter(), time.process_time()
            engine.decode_step(token, seq)
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    seq.truncate(n)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="native")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--out", default="bench-results/kv_dtype_itl.json")
    args = ap.parse_args()
    engine = Engine.load(None, dtype="float32", weights=args.weights, progress=False)
    engine.warmup()
    caches = {}
    for n in CONTEXTS:
        with torch.inference_mode():
            _, cold = engine.prefill(prompt(engine, n, 7), engine.new_pool(n + 16, "float32").new_seq())
        caches |= {(kv, n): copy_into(engine, cold, kv) for kv in KV_DTYPES}
    runs: dict[str, list[tuple[float, float]]] = {f"{kv} ctx {n}": [] for kv in KV_DTYPES for n in CONTEXTS}
    for r in range(args.rounds):
        order = KV_DTYPES[r % len(KV_DTYPES) :] + KV_DTYPES[: r % len(KV_DTYPES)]  # each dtype first once
        for kv in order:
            for n in CONTEXTS:
                runs[f"{kv} ctx {n}"].append(step_seconds(engine, caches[kv, n], args.steps))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    report(engine, runs, Path(args.out))


def report(engine: Engine, runs: dict[str, list[tuple[float, float]]], out: Path) -> None:
    """The table (ITL at each context in wall and CPU seconds, their ratios, the time model's beside) and the
    JSON record."""
    cpu = torch.backends.cpu.get_cpu_capability()
    print(f"\nSmolLM2-135M, {engine.weights} weights, float32 activations, {torch.get_num_threads()} threads, {cpu}")
    widths = {"K/V": -10, "ITL@64 ms": 10, "ITL@4096 ms": 12, "ratio": 6, "CPU ratio": 9, "pred@64": 8, "pred@4096": 10}
    print(" ".join(f"{h:<{-w}}" if w < 0 else f"{h:>{w}}" for h, w in [*widths.items(), ("ratio", 6)]))
    record = {"cpu": cpu, "weights": engine.weights, "threads": torch.get_num_threads(), "rows": {}, "runs": runs}
    for kv in KV_DTYPES:
        engine.runner.set_kv_dtype(kv)
        itl = [statistics.median(w for w, _ in runs[f"{kv} ctx {n}"]) for n in CONTEXTS]
        cpu_s = [statistics.median(c for _, c in runs[f"{kv} ctx {n}"]) for n in CONTEXTS]
        pred = [engine.predict_decode([n]).seconds for n in CONTEXTS]
        row = {"itl_s": itl, "cpu_s": cpu_s, "predicted_itl_s": pred, "ratio": itl[1] / itl[0]}
        record["rows"][kv] = row | {"cpu_ratio": cpu_s[1] / cpu_s[0]}
        print(
            f"{kv:<10} {itl[0] * 1e3:>10.2f} {itl[1] * 1e3:>12.2f} {itl[1] / itl[0]:>6.2f} {cpu_s[1] / cpu_s[0]:>9.2f} "
            f"{pred[0] * 1e3:>8.2f} {pred[1] * 1e3:>10.2f} {pred[1] / pred[0]:>6.2f}"
        )
    engine.runner.set_kv_dtype(None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
