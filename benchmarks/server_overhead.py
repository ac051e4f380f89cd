"""The server's overhead per decode step (issue 18's target: at most 10% of the step): the ITL that streaming
clients of `prefill serve` see (HTTP, SSE, detokenizing, the event loop and the worker thread included) beside
the ITL of the same requests run in-process through a StepLoop (the engine alone), at 1 and at 8 streams.

The server runs as its own process (`prefill serve`, as a user starts it), with the same dtype, weights, threads
and chunk size as the in-process engine; both run the same token ids (64-token prompts, 64 tokens each,
ignore_eos). Rounds alternate engine and server so that a busy machine slows both alike; medians of `--rounds`.

    .venv/bin/python benchmarks/server_overhead.py [--dtype float32] [--weights float32] [--threads 2] [--rounds 3]
        [--publish]

`--dtype bfloat16 --weights bfloat16` runs what `prefill serve` picks on a CPU with AMX.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import torch
from serving_core import NEW, prompt, run_streams

from prefill.bench.published import publish, publish_option
from prefill.engine.llm import Engine

CHUNK = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int) -> subprocess.Popen:
    """`prefill serve` in its own process; returns once /health answers."""
    exe = Path(sys.executable).parent / "prefill"
    flags = f"--port {port} --dtype {args.dtype} --weights {args.weights} --threads {args.threads} --max-running 8"
    cmd = [str(exe), "serve", *flags.split(), "--chunk-size", str(CHUNK), "--kv-cache-mb", "512"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("prefill serve did not come up in 120 s")


def stream_gaps(url: str, model: str, ids: list[int], out: list[float]) -> None:
    """One streamed completion; the gaps between its SSE chunks after the first (the client's ITL)."""
    body = {"model": model, "prompt": ids, "max_tokens": NEW, "temperature": 0, "ignore_eos": True, "stream": True}
    times = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
    out.extend(b - a for a, b in zip(times, times[1:], strict=False))


def server_itl(url: str, model: str, prompts: list[list[int]]) -> float:
    """ITL p50 over every stream of `prompts` run at once through the server."""
    gaps: list[float] = []
    threads = [threading.Thread(target=stream_gaps, args=(url, model, p, gaps)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.median(gaps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", help="activations: float32 (the issue's) or bfloat16")
    ap.add_argument("--weights", default="float32", help="float32 (the issue's), bfloat16, native or auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench-results/server_overhead.json")
    ap.add_argument("--publish", **publish_option())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine.load(None, dtype=args.dtype, weights=args.weights, progress=False)
    engine.warmup()
    prompts = [prompt(engine, 64, i) for i in range(8)]
    port = free_port()
    proc = start_server(args, port)
    url = f"http://127.0.0.1:{port}"
    try:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        server_itl(url, model, prompts[:1])  # warm-up
        runs: dict[str, list[float]] = {f"{side} B={B}": [] for B in (1, 8) for side in ("engine", "server")}
        for r in range(args.rounds):
            for B in (1, 8):
                runs[f"engine B={B}"].append(run_streams(engine, prompts[:B])["itl_p50_s"])
                runs[f"server B={B}"].append(server_itl(url, model, prompts[:B]))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    m = {k: statistics.median(v) for k, v in runs.items()}
    cpu = torch.backends.cpu.get_cpu_capability()
    print(f"\nSmolLM2-135M, {args.dtype} activations, {engine.weights} weights, {args.threads} threads, {cpu}")
    print(f"{'streams':>8} {'engine ITL ms':>14} {'server ITL ms':>14} {'overhead':>9}  (target <= 10%)")
    overhead = {}
    for B in (1, 8):
        e, s = m[f"engine B={B}"], m[f"server B={B}"]
        overhead[B] = s / e - 1
        print(f"{B:>8} {e * 1e3:>14.1f} {s * 1e3:>14.1f} {overhead[B]:>+9.1%}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu, "dtype": args.dtype, "weights": engine.weights, "threads": args.threads}
    record |= {"medians_s": m, "overhead": overhead}
    out.write_text(json.dumps({**record, "runs": runs, "load_average": os.getloadavg()}, indent=1) + "\n")
    print(f"wrote {out}")
    if args.publish is not None:
        table = published_table(record)
        print(f"wrote {publish(args.publish, 'server_overhead', TITLE, threads=args.threads, data=record, **table)}")


TITLE = "The server's overhead per decode step: prefill serve beside the step loop in-process"


def published_table(record: dict) -> dict:
    """The results file's table of a run's record: engine and server ITL at 1 and 8 streams, the overhead."""
    m, w = record["medians_s"], record["weights"]
    rows = [
        [w, str(B), f"{m[f'engine B={B}'] * 1e3:.1f} ms", f"{m[f'server B={B}'] * 1e3:.1f} ms", f"{o:+.1%}"]
        for B, o in record["overhead"].items()
    ]
    headline = [
        f"the server adds {' / '.join(f'{o:+.1%}' for o in record['overhead'].values())} to the engine's step at "
        f"1 / 8 streams ({w})"
    ]
    columns = ["weights", "streams", "engine ITL", "server ITL", "server's overhead"]
    return {"columns": columns, "rows": rows, "notes": "Target <= 10%.", "headline": headline}


if __name__ == "__main__":
    main()
