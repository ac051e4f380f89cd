"""Decode ITL of the engine on the embedded SmolLM2's own blocks (--weights native) with each activation path
forced (prefill.model.quant.set_activations: f32, the float32 reference; q8, 8-bit activations), in one process
and interleaved rounds (a busy machine slows every path alike):

1. streams: 1 and 8 streams of 64-token prompts decoding 64 tokens each through one StepLoop (the serving
   core's, benchmarks/serving_core.py): tok/s and ITL p50, medians of `--rounds`, wall clock at `--threads`;
2. steps: one decode step (Engine.decode_step) of 1 and 8 rows at 72 tokens of context, on 1 thread, timed in
   the thread's CPU seconds (best of `--steps`): what the step costs, which other load on a shared machine
   barely moves (wall clock there moved 3x between runs).

    .venv/bin/python benchmarks/activations_itl.py [--rounds 3] [--threads 2] [--out bench-results/activations_itl.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from serving_core import median_of, prompt, run_streams  # benchmarks/: the same streams as the serving core's

from prefill.engine.llm import Engine
from prefill.model.quant import ACTIVATION_PATHS, ops, set_activations


def step_cpu_seconds(engine: Engine, B: int, steps: int) -> float:
    """Thread CPU seconds of one decode step of B rows at 72 tokens of context (1 thread), best of `steps`."""
    with torch.inference_mode():
        caches = [engine.new_cache(256) for _ in range(B)]
        for i, c in enumerate(caches):
            engine.prefill(prompt(engine, 72, 100 + i), c)
        tokens, best = torch.tensor([4] * B), float("inf")
        for _ in range(steps):
            t = time.thread_time()
            engine.decode_step(tokens, caches)
            best = min(best, time.thread_time() - t)
    return best


def stream_runs(engine: Engine, rounds: int) -> dict[str, list[dict]]:
    """Each path at 1 and 8 streams, rounds interleaved: case -> one run_streams record a round."""
    short = [prompt(engine, 64, i) for i in range(8)]
    runs: dict[str, list[dict]] = {f"{p} B={b}": [] for p in ACTIVATION_PATHS for b in (1, 8)}
    for r in range(rounds):
        for path in ACTIVATION_PATHS:
            set_activations(engine.model, path)
            for b in (1, 8):
                runs[f"{path} B={b}"].append(run_streams(engine, short[:b]))
        print(f"round {r + 1}/{rounds} done", flush=True)
    return runs


def step_runs(engine: Engine, steps: int) -> dict[str, float]:
    """Each path's decode step of 1 and 8 rows in thread CPU seconds on 1 thread, two interleaved passes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    step = {f"{p} B={b}": float("inf") for p in ACTIVATION_PATHS for b in (1, 8)}
    for _ in range(2):
        for k in step:
            set_activations(engine.model, k.split()[0])
            step[k] = min(step[k], step_cpu_seconds(engine, int(k.split("=")[1]), steps))
    torch.set_num_threads(threads)
    return step


def ratios_of(m: dict[str, dict], step: dict[str, float]) -> dict[str, float]:
    """The comparisons the run is for: 8 streams against 1 on each path, and the paths against each other."""
    ratios = {}
    for p in ACTIVATION_PATHS:
        ratios[f"{p}: step CPU 8 rows / 1 row"] = step[f"{p} B=8"] / step[f"{p} B=1"]
    for b in (1, 8):
        ratios[f"step CPU f32 / q8 at B={b}"] = step[f"f32 B={b}"] / step[f"q8 B={b}"]
    for p in ACTIVATION_PATHS:
        ratios[f"{p}: ITL p50 8 / 1 (target <= 1.5)"] = m[f"{p} B=8"]["itl_p50_s"] / m[f"{p} B=1"]["itl_p50_s"]
        ratios[f"{p}: decode tok/s 8 / 1 (target >= 4)"] = (
            m[f"{p} B=8"]["decode_tok_per_s"] / m[f"{p} B=1"]["decode_tok_per_s"]
        )
    for b in (1, 8):
        ratios[f"ITL p50 f32 / q8 at B={b}"] = m[f"f32 B={b}"]["itl_p50_s"] / m[f"q8 B={b}"]["itl_p50_s"]
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default="bench-results/activations_itl.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine.load(None, dtype="float32", weights="native", progress=False)
    engine.warmup()
    runs = stream_runs(engine, args.rounds)
    m = {k: median_of(v) for k, v in runs.items()}
    step = step_runs(engine, args.steps)
    cpu = f"{torch.backends.cpu.get_cpu_capability()}, kernels {ops.isa()}, {torch.get_num_threads()} threads"
    print(f"\nSmolLM2-135M on its GGUF blocks ({engine.weights}), {cpu}; a shared machine: read the ratios")
    print(f"{'case':<10} {'tok/s':>8} {'decode tok/s':>13} {'ITL p50 ms':>11} {'step CPU ms (1 thread)':>23}")
    for k, v in m.items():
        print(
            f"{k:<10} {v['tok_per_s']:>8.1f} {v['decode_tok_per_s']:>13.1f} {v['itl_p50_s'] * 1e3:>11.2f} "
            f"{step[k] * 1e3:>23.2f}"
        )
    ratios = ratios_of(m, step)
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu, "medians": m, "step_cpu_s": step, "ratios": ratios, "runs": runs}
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
