"""The KV store's write cost under load (issue 20's target: store writes add at most 5% to a request's E2E time
under a load test at 8 streams).

A closed-loop load through one StepLoop, as `prefill serve` runs it: 8 streams, each sending its next request
as soon as the last one finished, every prompt a new text (no prefix is shared and no stored block is ever hit,
so a run with the store pays every block's write and gains nothing). Each request's whole blocks are copied out
of the pool when it leaves and written by the store's background thread, which shares the machine's cores
with the loop. Rounds alternate "no store" and "store" so that a busy machine slows both alike; the table gives
each round's mean E2E and the ratio of the medians.

    nice -n 10 .venv/bin/python benchmarks/kv_store_load.py [--rounds 5] [--requests 24] [--prompt-tokens 512]
        [--publish]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from serving_core import prompt

from prefill.bench.published import publish, publish_option
from prefill.engine.llm import Engine
from prefill.engine.loop import StepLoop
from prefill.engine.request import Request
from prefill.engine.sampling import SamplingParams

STREAMS = 8
_salts = itertools.count()  # every request of a run gets its own text: no prefix shared, no stored block hit


def closed_loop(engine: Engine, requests: int, P: int, new: int, tier) -> list[float]:
    """`requests` requests through one StepLoop, STREAMS in flight at a time; each one's E2E seconds."""
    pool = engine.new_pool(STREAMS * (P + new) + 64)
    loop = StepLoop(engine.runner, pool, chunk_size=256, max_running=STREAMS, kv_tier=tier)
    sent, running, e2e = 0, [], []
    while sent < requests or running:
        while sent < requests and len(running) < STREAMS:
            req = Request(
                prompt(engine, P, next(_salts)), new, SamplingParams(), None, lambda ev: None, ignore_eos=True
            )
            loop.add(req)
            running.append(req)
            sent += 1
        loop.step()
        for req in [r for r in running if r.done]:
            running.remove(req)
            e2e.append(time.perf_counter() - req.arrival)
    return e2e


def timed_round(engine: Engine, r: int, label: str, tier, args: argparse.Namespace) -> dict:
    """One round of `args.requests` requests in a closed loop, with the store (`tier`) or without (None)."""
    before, t0, cpu0 = tier.store.stats(), time.perf_counter(), time.process_time()
    store = tier if label == "store" else None
    e2e = closed_loop(engine, args.requests, args.prompt_tokens, args.new_tokens, store)
    if store is not None:
        tier.flush()  # this round's writes end inside this round
    after, wall, cpu = tier.store.stats(), time.perf_counter() - t0, time.process_time() - cpu0
    row = {
        "round": r,
        "case": label,
        "mean_e2e_s": statistics.fmean(e2e),
        "wall_s": wall,
        "process_cpu_s": cpu,
        "written_blocks": after.written_blocks - before.written_blocks,
        "writer_cpu_s": after.writer_cpu_s - before.writer_cpu_s,
    }
    print(
        f"round {r} {label:<9} mean E2E {row['mean_e2e_s']:6.3f} s  wall {wall:6.1f} s  "
        f"CPU {cpu:6.1f} s  writer CPU {row['writer_cpu_s']:5.2f} s  blocks {row['written_blocks']}"
    )
    return row


def summarized(rows: list[dict], stats, args: argparse.Namespace) -> dict:
    """The rounds' medians, the store's cost as a ratio and the writer's share of the CPU, printed and returned
    as the results record."""
    med = {c: statistics.median(x["mean_e2e_s"] for x in rows if x["case"] == c) for c in ("no store", "store")}
    ratio = med["store"] / med["no store"]
    print(f"\nmedian of the rounds' mean E2E: no store {med['no store']:.3f} s, store {med['store']:.3f} s")
    print(
        f"store writes add {ratio - 1:+.1%} to a request's E2E ({stats.written_blocks} blocks, "
        f"{stats.written_bytes / 1e6:.0f} MB written, {stats.dropped_blocks} dropped)"
    )
    store_rounds = [x for x in rows if x["case"] == "store"]
    share = sum(x["writer_cpu_s"] for x in store_rounds) / sum(x["process_cpu_s"] for x in store_rounds)
    print(f"the writer thread took {share:.2%} of the process's CPU time in the store rounds")
    return {
        "cpu": platform.processor() or platform.machine(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "streams": STREAMS,
        "args": {k: str(v) for k, v in vars(args).items()},
        "rounds": rows,
        "median_mean_e2e_s": med,
        "store_vs_none": ratio,
        "writer_cpu_share": share,
        "written_bytes": stats.written_bytes,
        "dropped_blocks": stats.dropped_blocks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=24, help="requests per round (STREAMS in flight)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--weights", default="float32")
    ap.add_argument("--out", type=Path, default=Path("bench-results/kv_store_load.json"))
    ap.add_argument("--publish", **publish_option())
    args = ap.parse_args()
    engine = Engine.load(None, dtype="float32", weights=args.weights, progress=False)
    engine.warmup()
    with tempfile.TemporaryDirectory() as tmp:
        with_store = Engine(engine.runner, engine.tokenizer, engine.source)
        tier = with_store.attach_kv_store(Path(tmp), 4096.0)
        closed_loop(engine, STREAMS, args.prompt_tokens, args.new_tokens, None)  # warm-up: the pool's pages, threads
        order = (("no store", "store"), ("store", "no store"))  # interleaved: each case first every other round
        rows = [timed_round(engine, r, label, tier, args) for r in range(args.rounds) for label in order[r % 2]]
        out = summarized(rows, tier.store.stats(), args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    if args.publish is not None:
        print(f"wrote {publish(args.publish, 'kv_store_load', TITLE, **published_table(out), data=out)}")


TITLE = "The KV store's write cost under a load of 8 streams"


def published_table(record: dict) -> dict:
    """The results file's table of a run's record: each round's mean E2E with and without the store."""
    columns = ["round", "case", "mean E2E s", "process CPU s", "writer CPU s", "blocks written"]
    rows = [
        [r["round"], r["case"], f"{r['mean_e2e_s']:.3f}", f"{r['process_cpu_s']:.1f}", f"{r['writer_cpu_s']:.2f}",
         r["written_blocks"]]
        for r in record["rounds"]
    ]  # fmt: skip
    med, ratio = record["median_mean_e2e_s"], record["store_vs_none"]
    a = record["args"]
    notes = (
        f"{record['streams']} streams, {a['prompt_tokens']}-token prompts of new text, {a['new_tokens']} tokens each, "
        f"{a['requests']} requests a round. The median of the rounds' mean E2E: {med['no store']:.2f} s without the "
        f"store, {med['store']:.2f} s with it ({ratio - 1:+.1%}; target at most +5%). The writer thread took "
        f"{record['writer_cpu_share']:.1%} of the process's CPU; {record['written_bytes'] / 1e6:,.0f} MB written, "
        f"{record['dropped_blocks']} blocks dropped."
    )
    headline = [f"store writes add {ratio - 1:+.1%} to a request's E2E under {record['streams']} streams"]
    return {"columns": columns, "rows": rows, "notes": notes, "headline": headline}


if __name__ == "__main__":
    main()
