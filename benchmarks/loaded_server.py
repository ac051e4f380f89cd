"""A loaded server predicted beside measured: `prefill serve` on this machine, its capacity from closed-loop streams,
then Poisson loads at 30%, 60% and 90% of it, each with `prefill loadtest --predict`. Prints each rate's TTFT p50,
TTFT p99 and ITL p50, measured and predicted, their errors against the targets (15% at the two lower rates, 25% at
the highest), and whether all nine met them. Every run starts a fresh server.

    .venv/bin/python benchmarks/loaded_server.py                 # one run, about 4 minutes on 2 cores
    .venv/bin/python benchmarks/loaded_server.py --runs 3 --out bench-results/loaded [--publish]

The commands it runs are the ones a user runs (printed as it goes); their JSON reports, kept under --out, hold what
each prediction read (`predicted.serving`, `predicted.machine_profile`) to simulate it again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from batching import wait_healthy

from prefill.bench.published import publish, publish_option
from prefill.server.server import free_port

FRACTIONS, TARGETS = (0.3, 0.6, 0.9), (0.15, 0.15, 0.25)  # of capacity; |predicted / measured - 1| allowed
METRICS = (("ttft_s", "p50"), ("ttft_s", "p99"), ("itl_s", "p50"))
LOAD = ["--prompt-len", "32:256", "--max-tokens", "48", "--ignore-eos", "--concurrency", "16"]
CLI = [sys.executable, "-c", "from prefill.cli.main import main; main()"]


def start_server(log: Path) -> tuple[subprocess.Popen, str]:
    """`prefill serve` with its defaults in its own process, its log in `log`; returns once /health answers."""
    port = free_port()
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port)], stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, lambda: f"prefill serve exited (its log: {log})")
    except RuntimeError as e:
        sys.exit(f"error: {e}")
    return proc, url


def loadtest(url: str, out: Path, extra: list[str]) -> dict:
    """`prefill loadtest` against `url`, its JSON report at `out`; returns the report."""
    cmd = [*CLI, "loadtest", "--url", url, *LOAD, *extra]
    print("  prefill " + " ".join(cmd[3:] + ["--out", str(out)]), flush=True)
    done = subprocess.run([*cmd, "--out", str(out), "--plot", str(out.with_suffix(".png"))], capture_output=True)
    if done.returncode:
        sys.exit(f"error: prefill loadtest failed: {(done.stderr or done.stdout).decode().strip()[-500:]}")
    return json.loads(out.read_text())


def one_run(run: int, seed: int, requests: int, out: Path) -> list[list[float]]:
    """A fresh server: its capacity, then the three rates predicted; each rate's three errors."""
    proc, url = start_server(out / f"run{run}-serve.log")
    try:
        cap = loadtest(url, out / f"run{run}-capacity.json", ["--requests", "32", "--seed", str(seed + 50)])
        capacity = cap["summary"]["throughput_req_per_s"]
        print(f"run {run}: capacity {capacity:.2f} req/s (16 closed-loop streams)", flush=True)
        errors = []
        for i, f in enumerate(FRACTIONS):
            rate = round(capacity * f, 2)
            extra = ["--rate", str(rate), "--requests", str(requests), "--seed", str(seed + i), "--predict"]
            report = loadtest(url, out / f"run{run}-{f:.1f}.json", extra)
            measured, predicted = report["summary"]["latency"], report["predicted"]["summary"]["latency"]
            errors.append([predicted[k][q] / measured[k][q] - 1 for k, q in METRICS])
            cells = ", ".join(
                f"{k[:-2].upper()} {q} {1e3 * measured[k][q]:.1f} / {1e3 * predicted[k][q]:.1f} ms ({e:+.0%})"
                for (k, q), e in zip(METRICS, errors[-1], strict=True)
            )
            print(f"  {f:.0%} ({rate} req/s): measured / predicted {cells}", flush=True)
        return errors
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="fresh servers, one after another")
    ap.add_argument("--requests", type=int, default=30, help="requests at each rate")
    ap.add_argument("--seed", type=int, default=800)
    ap.add_argument("--out", type=Path, default=Path("bench-results/loaded"))
    ap.add_argument("--publish", **publish_option())
    args = ap.parse_args()
    if args.runs < 1 or args.requests < 2:
        sys.exit("error: --runs must be >= 1 and --requests >= 2")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in range(args.runs):
        errors = one_run(run, args.seed + 100 * run, args.requests, args.out)
        met = all(abs(e) <= t for errs, t in zip(errors, TARGETS, strict=True) for e in errs)
        rows.append(
            [str(run), *(" / ".join(f"{100 * e:+.0f}" for e in errs) for errs in errors), "yes" if met else "no"]
        )
    columns = ["run", *(f"{f:.0%}" for f in FRACTIONS), "all nine within"]
    print(f"\n{NOTES}\n| " + " | ".join(columns) + " |\n|---|---|---|---|---|")
    print("\n".join("| " + " | ".join(r) + " |" for r in rows))
    if args.publish is not None:
        met = sum(r[-1] == "yes" for r in rows)
        headline = [
            "a loaded server's TTFT p50 / p99 and ITL p50 at 30 / 60 / 90% of capacity: all nine within their "
            f"targets in {met} of {len(rows)} runs"
        ]
        path = publish(args.publish, "loaded_server", TITLE, columns, rows, notes=NOTES, headline=headline)
        print(f"wrote {path}")


TITLE = "A loaded server, predicted beside measured"
NOTES = "Errors of the prediction, TTFT p50 / TTFT p99 / ITL p50, % (targets 15% at 30% and 60%, 25% at 90%)."


if __name__ == "__main__":
    main()
