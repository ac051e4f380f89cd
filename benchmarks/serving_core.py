"""The serving core's targets, in-process (the engine's step loop, no HTTP), on the embedded SmolLM2:

1. B streams (B = 1 and 8) of 64-token prompts decoding 64 tokens each (ignore_eos) through one StepLoop:
   aggregate output tok/s (whole run, and decode phase only) and ITL p50, with the 8 / 1 ratios;
2. one stream's ITL p50 at 4,096 tokens of context beside at 64;
3. the batch-invariant mode (--deterministic) at 8 streams: its tok/s beside the default mode's;
each also predicted by the time model (Engine.predict_decode) with its error. Rounds interleave the modes so a
busy machine slows all of them alike; medians of `--rounds`.

    .venv/bin/python benchmarks/serving_core.py [--weights float32] [--rounds 3] [--out bench-results/serving_core.json]
        [--publish]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from prefill.bench.published import publish, publish_option
from prefill.engine.llm import Engine
from prefill.engine.loop import StepLoop
from prefill.engine.request import Request
from prefill.engine.sampling import SamplingParams

NEW = 64  # output tokens per stream


def prompt(engine: Engine, n: int, salt: int) -> list[int]:
    """n token ids of plain words (a different sentence per stream, so no prefix is shared)."""
    words = f"stream {salt} reads the river past the old mill under the stone bridge near town " * (n // 8 + 2)
    return engine.tokenizer.encode(words)[:n]


def run_streams(engine: Engine, prompts: list[list[int]], new: int = NEW) -> dict:
    """All prompts through one StepLoop at once; wall seconds, decode-phase seconds and every ITL."""
    pool = engine.new_pool(sum(len(p) + new for p in prompts) + 64)
    loop = StepLoop(engine.runner, pool, chunk_size=256, max_running=len(prompts))
    reqs = [Request(p, new, SamplingParams(), None, lambda ev: None, ignore_eos=True) for p in prompts]
    t0 = time.perf_counter()
    for r in reqs:
        loop.add(r)
    first_all = None
    while loop.busy:
        loop.step()
        if first_all is None and all(r.gen.token_ids for r in reqs):
            first_all = time.perf_counter()  # every stream has its first token: the decode phase starts
    wall = time.perf_counter() - t0
    decode_s = time.perf_counter() - first_all
    tokens = sum(len(r.gen.token_ids) for r in reqs)
    itls = [x for r in reqs for x in r.gen.itl_s]
    return {
        "wall_s": wall,
        "decode_s": decode_s,
        "tokens": tokens,
        "tok_per_s": tokens / wall,
        "decode_tok_per_s": (tokens - len(reqs)) / decode_s,
        "itl_p50_s": statistics.median(itls),
    }


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def print_table(m: dict[str, dict], pred: dict[str, float]) -> None:
    """Each case's throughput and ITL beside the time model's ITL and its error."""
    print(f"{'case':<20} {'tok/s':>8} {'decode tok/s':>13} {'ITL p50 ms':>11} {'pred. ITL ms':>13} {'err':>6}")
    for k, v in m.items():
        p = pred.get(k)
        err = f"{p / v['itl_p50_s'] - 1:+.0%}" if p else ""
        ptxt = f"{p * 1e3:.1f}" if p else ""
        print(
            f"{k:<20} {v['tok_per_s']:>8.1f} {v['decode_tok_per_s']:>13.1f} {v['itl_p50_s'] * 1e3:>11.1f} "
            f"{ptxt:>13} {err:>6}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="float32", help="float32 (the issue's), native or auto")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench-results/serving_core.json")
    ap.add_argument("--publish", **publish_option())
    args = ap.parse_args()
    default = Engine.load(None, dtype="float32", weights=args.weights, progress=False)
    invariant = Engine.load(None, dtype="float32", progress=False, deterministic=True)
    for e in (default, invariant):
        e.warmup()
    short = [prompt(default, 64, i) for i in range(8)]
    long = prompt(default, 4096, 99)
    runs: dict[str, list[dict]] = {"B=1": [], "B=8": [], "B=8 deterministic": [], "ctx 64": [], "ctx 4096": []}
    for r in range(args.rounds):
        runs["B=1"].append(run_streams(default, short[:1]))
        runs["B=8"].append(run_streams(default, short))
        runs["B=8 deterministic"].append(run_streams(invariant, short))
        runs["ctx 64"].append(run_streams(default, short[:1], 32))
        runs["ctx 4096"].append(run_streams(default, [long], 32))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    m = {k: median_of(v) for k, v in runs.items()}
    pred = {
        "B=1": default.predict_decode([64 + NEW // 2]).seconds,
        "B=8": default.predict_decode([64 + NEW // 2] * 8).seconds,
        "ctx 64": default.predict_decode([64 + 16]).seconds,
        "ctx 4096": default.predict_decode([4096 + 16]).seconds,
    }
    cpu = torch.backends.cpu.get_cpu_capability()
    print(f"\nSmolLM2-135M, float32 activations, {default.weights} weights, {torch.get_num_threads()} threads, {cpu}")
    print_table(m, pred)
    ratios = {
        "aggregate tok/s 8 / 1 (target >= 4)": m["B=8"]["tok_per_s"] / m["B=1"]["tok_per_s"],
        "decode tok/s 8 / 1": m["B=8"]["decode_tok_per_s"] / m["B=1"]["decode_tok_per_s"],
        "ITL p50 8 / 1 (target <= 1.5)": m["B=8"]["itl_p50_s"] / m["B=1"]["itl_p50_s"],
        "ITL p50 ctx 4096 / 64 (target <= 1.25)": m["ctx 4096"]["itl_p50_s"] / m["ctx 64"]["itl_p50_s"],
        "deterministic tok/s cost at 8 (target <= 25%)": 1
        - m["B=8 deterministic"]["tok_per_s"] / m["B=8"]["tok_per_s"],
    }
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu, "weights": default.weights, "medians": m, "predicted_itl_s": pred, "ratios": ratios}
    out.write_text(json.dumps({**record, "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")
    if args.publish is not None:
        print(f"wrote {publish(args.publish, 'serving_core', TITLE, **published_table(record), data=record)}")


TITLE = "The serving core: batched decode through one step loop, in-process"
CASES = {
    "B=1": "1 stream, 64-token prompt, 64 tokens",
    "B=8": "8 streams",
    "B=8 deterministic": "8 streams, `--deterministic`",
    "ctx 64": "1 stream at 64 tokens of context",
    "ctx 4096": "1 stream at 4,096 tokens of context",
}


def published_table(record: dict) -> dict:
    """The results file's table of a run's record: each case's tok/s and ITL beside the time model's ITL."""
    m, pred, ratios = record["medians"], record["predicted_itl_s"], record["ratios"]
    rows = []
    for key, label in CASES.items():
        p, itl = pred.get(key), m[key]["itl_p50_s"]
        predicted = "" if p is None else f"{p * 1e3:.1f} ms ({p / itl - 1:+.0%})"
        rows.append([label, f"{m[key]['tok_per_s']:.1f}", f"{itl * 1e3:.1f} ms", predicted])
    notes = "; ".join(f"{k}: {v:.2f}" for k, v in ratios.items()) + f" ({record['weights']} weights)."
    headline = [
        f"8 streams {ratios['aggregate tok/s 8 / 1 (target >= 4)']:.2f}x the output tok/s of one, at "
        f"{ratios['ITL p50 8 / 1 (target <= 1.5)']:.2f}x its ITL",
        f"ITL at 4,096 tokens of context {ratios['ITL p50 ctx 4096 / 64 (target <= 1.25)']:.2f}x that at 64",
    ]
    columns = ["case", "tok/s", "ITL p50", "predicted ITL"]
    return {"columns": columns, "rows": rows, "notes": notes, "headline": headline}


if __name__ == "__main__":
    main()
