"""The KV store: TTFT of a long prompt cold, after a restart with a warm store (disk tier and page-cache tier), and
the compute-or-load decision at several prompt lengths, measured both ways beside the cost model's prediction.

Part 1 (TTFT, P = --prompt-tokens): each run is the first request of a freshly built server state (the KV pool,
made resident at start, an empty prefix cache and the step loop that `prefill serve` builds). The prompt once
without a store (cold), once more with an empty store (cold, and the store's write cost in its E2E), then through
fresh engine objects on the same directory (a restart: no store state in memory): once with every block file
dropped from the page cache (fsync + POSIX_FADV_DONTNEED, as the probe does: the disk tier), once with the files
in the page cache (the RAM tier). Greedy tokens must equal the cold run's.
Part 2 (the decision): for each P, the measured prefill of P tokens, the measured load of their stored blocks
(disk tier and RAM tier: read, verify, copy into a pool), and compute_or_load's prediction; "agree" when the
predicted choice is the measured faster one, or the predicted times are within 15% of the measured.

    nice -n 10 .venv/bin/python benchmarks/kv_store.py [--prompt-tokens 2048] [--sizes 16,64,256,1024,4096] [--publish]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from prefill.bench.published import publish, publish_option
from prefill.costmodel.kv_store import compute_or_load
from prefill.engine.kv_store.probe import drop_from_page_cache
from prefill.engine.llm import Engine
from prefill.engine.request import Generation, Request
from prefill.engine.sampling import SamplingParams
from prefill.server.config import ServeConfig, model_id_of
from prefill.server.state import ServerState

N_NEW = 4  # generated tokens per run: enough to compare answers
POOL_MB = 512  # the served runs' KV pool: 10 sequences of 2,048 tokens


def long_ids(engine: Engine, n: int) -> list[int]:
    """At least n token ids of a varied text (numbered lines, so no block repeats another)."""
    text = " ".join(f"Line {i}: the shelf {i * 37 % 101} holds {i * 13 % 17} books on history." for i in range(n))
    ids = engine.tokenizer.encode(text, add_special_tokens=True)
    assert len(ids) >= n, "the text is too short"
    return ids[:n]


def restarted(engine: Engine, directory: Path, mb: float) -> Engine:
    """A fresh engine object on the same weights with its own store on `directory` (a restarted process's state)."""
    fresh = Engine(engine.runner, engine.tokenizer, engine.source)
    fresh.attach_kv_store(directory, mb)  # measures the GEMM rate now, as a server does at its start
    return fresh


def serve_once(engine: Engine, ids: list[int]) -> Generation:
    """`ids` through the step loop `prefill serve` builds when it starts (ServerState.build: its KV pool, made
    resident, an empty prefix cache, the engine's store), as the first request after that start."""
    cfg = ServeConfig(model_id_of(engine), kv_cache_mb=POOL_MB, populate_kv=True)
    loop = ServerState.build(engine, cfg).worker.loop
    req = Request(ids, N_NEW, SamplingParams(), engine.tokenizer, lambda event: None)  # greedy
    loop.add(req)
    while not req.done:
        loop.step()
    return req.gen


def drop_store(directory: Path) -> None:
    """Every block file written to disk and dropped from the page cache."""
    paths = [str(p) for p in Path(directory).rglob("*.kv")]
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    drop_from_page_cache(paths)


def ttft_part(engine: Engine, directory: Path, P: int, mb: float) -> dict:
    ids = long_ids(engine, P)
    runs = {}

    def run(label: str, eng: Engine) -> None:
        gen = serve_once(eng, ids)
        if eng.kv_store is not None:
            eng.kv_store.flush()
        use = gen.kv_store.as_dict() if gen.kv_store else None
        runs[label] = {
            "ttft_s": gen.ttft_s,
            "total_s": gen.total_s,
            "prefill_s": gen.prefill_s,
            "cached_tokens": gen.cached_tokens,
            "tokens": gen.token_ids,
            "kv_store": use,
        }
        print(f"  {label:<22} TTFT {gen.ttft_s * 1e3:9.1f} ms  cached {gen.cached_tokens:5}  E2E {gen.total_s:.2f} s")

    run("cold, no store", engine)
    run("cold, empty store", restarted(engine, directory, mb))
    drop_store(directory)
    run("restart, disk tier", restarted(engine, directory, mb))
    run("restart, RAM tier", restarted(engine, directory, mb))
    cold = runs["cold, no store"]["ttft_s"]
    for r in runs.values():
        r["ttft_vs_cold"] = r["ttft_s"] / cold
        r["same_tokens"] = r["tokens"] == runs["cold, no store"]["tokens"]
    return {"P": P, "runs": runs}


def decision_part(engine: Engine, directory: Path, sizes: list[int], mb: float) -> list[dict]:
    ids = long_ids(engine, max(sizes) + 1)
    filler = restarted(engine, directory, mb)
    filler.complete(ids, max_new_tokens=1)  # stores every whole block of the longest prompt
    filler.kv_store.flush()
    tier = restarted(engine, directory, mb).kv_store
    rows = []
    for P in sizes:
        t0 = time.perf_counter()
        with torch.inference_mode():
            engine.prefill(ids[:P])
        compute_s = time.perf_counter() - t0
        keys = tier.store.keys(ids[:P])
        match = tier.store.longest_prefix(ids[:P])
        assert match.n_tokens == P, f"only {match.n_tokens} of {P} tokens stored"
        measured = {}
        for label in ("disk", "ram"):
            if label == "disk":
                drop_store(directory)
            seq = engine.new_cache(P)
            t0 = time.perf_counter()
            seq.reserve(P)
            tier.load_blocks(keys, seq, 0)
            measured[label] = time.perf_counter() - t0
        d = compute_or_load(
            P, 0, match.nbytes, tier.load_bytes_per_s, lambda n, past: engine.predict_prefill_seconds(n, past)[0]
        )
        faster = "load" if measured["disk"] < compute_s else "compute"
        within = (
            abs(d.load_s - measured["disk"]) <= 0.15 * measured["disk"]
            and abs(d.compute_s - compute_s) <= 0.15 * compute_s
        )
        rows.append(
            {
                "P": P,
                "bytes": match.nbytes,
                "compute_s": compute_s,
                "load_disk_s": measured["disk"],
                "load_ram_s": measured["ram"],
                "predicted": d.as_dict(),
                "measured_faster": faster,
                "agree": d.choice == faster or within,
            }
        )
    return rows


def print_tables(ttft: dict, rows: list[dict]) -> None:
    print(f"\nTTFT of a {ttft['P']:,}-token prompt ({N_NEW} tokens generated)")
    print(f"{'run':<22} {'TTFT ms':>10} {'vs cold':>8} {'cached':>7} {'E2E s':>7} {'same':>5}")
    for label, r in ttft["runs"].items():
        print(
            f"{label:<22} {r['ttft_s'] * 1e3:10.1f} {r['ttft_vs_cold']:8.1%} {r['cached_tokens']:7} "
            f"{r['total_s']:7.2f} {str(r['same_tokens']):>5}"
        )
    print("\ncompute or load (measured: prefill of P tokens; load = read + verify + copy into the pool)")
    print(
        f"{'P':>5} {'MB':>7} {'compute s':>10} {'pred':>8} {'disk s':>8} {'RAM s':>8} {'pred':>8} "
        f"{'choice':>8} {'faster':>8} {'agree':>6}"
    )
    for r in rows:
        p = r["predicted"]
        print(
            f"{r['P']:5} {r['bytes'] / 1e6:7.1f} {r['compute_s']:10.4f} {p['predicted_compute_s']:8.4f} "
            f"{r['load_disk_s']:8.4f} {r['load_ram_s']:8.4f} {p['predicted_load_s']:8.4f} {p['choice']:>8} "
            f"{r['measured_faster']:>8} {str(r['agree']):>6}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--sizes", default="16,64,256,1024,4096")
    ap.add_argument("--dir", type=Path, default=None, help="the store's directory (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=Path("bench-results/kv_store.json"))
    ap.add_argument("--publish", **publish_option())
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    mb = 4096.0
    engine = Engine.load(None, dtype="float32", weights="float32", progress=False)
    engine.warmup()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        print(f"store in {directory}")
        ttft = ttft_part(engine, directory / "ttft", args.prompt_tokens, mb)
        bw = restarted(engine, directory / "ttft", mb).kv_store.bandwidth
        rows = decision_part(engine, directory / "decide", sizes, mb)
    print_tables(ttft, rows)
    bandwidth = {"disk_bytes_per_s": bw.disk_bytes_per_s, "ram_bytes_per_s": bw.ram_bytes_per_s}
    record = write_result(args.out, {"bandwidth": bandwidth, "ttft": ttft, "decision": rows})
    if args.publish is not None:
        print(f"wrote {publish(args.publish, 'kv_store', TITLE, **published_table(record), data=record)}")


TITLE = "The KV store: TTFT after a restart, and compute or load"


def published_table(record: dict) -> dict:
    """The results file's table of a run's record: each TTFT run beside the cold one, the decision's agreement."""
    ttft, runs = record["ttft"], record["ttft"]["runs"]
    rows = [
        [label, f"{r['ttft_s'] * 1e3:,.1f}", f"{r['ttft_vs_cold']:.1%}", r["cached_tokens"], str(r["same_tokens"])]
        for label, r in runs.items()
    ]
    agree = [f"{d['P']:,}" for d in record["decision"] if d["agree"]]
    wrong = [f"{d['P']:,}" for d in record["decision"] if not d["agree"]]
    notes = (
        f"A {ttft['P']:,}-token prompt. Compute or load: the cost model's choice agrees with the faster measured "
        f"path at P = {', '.join(agree) or 'none'}" + (f"; not at P = {', '.join(wrong)}." if wrong else ".")
    )
    disk, ram = runs["restart, disk tier"]["ttft_vs_cold"], runs["restart, RAM tier"]["ttft_vs_cold"]
    headline = [
        f"a {ttft['P']:,}-token prompt's TTFT after a restart: {disk:.1%} of its cold TTFT from the disk, "
        f"{ram:.1%} from the page cache"
    ]
    columns = ["run", "TTFT ms", "of cold TTFT", "cached tokens", "same tokens as cold"]
    return {"columns": columns, "rows": rows, "notes": notes, "headline": headline}


def write_result(path: Path, fields: dict) -> dict:
    """`fields` as JSON at `path`, after the machine it was measured on; returns the record."""
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(machine | fields, indent=2))
    print(f"\nwrote {path}")
    return machine | fields


if __name__ == "__main__":
    main()
