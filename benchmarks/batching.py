"""Batched decode across streams, measured with the load-test client against a real `prefill serve`.

Starts `prefill serve` (embedded SmolLM2, float32 by default) as a subprocess on a free loopback port, then:
1. concurrency 1 vs concurrency 8, prompts of 64 tokens, 64 output tokens each (ignore_eos): aggregate output
   tokens/s and ITL p50 at both, and their ratios;
2. the same 8 streams with 2,000-token prompts arriving among them: ITL p99 of the short streams beside the
   time of one prefill chunk (the long prompts' prefill_s divided by their number of chunks);
3. 8 requests sharing a ~1,000-token system prompt: the KV-pool bytes in use while all 8 run, beside one copy
   of the prefix + 8 x (suffix + output) and beside 8 full copies (what copying the prefix would hold).

    .venv/bin/python benchmarks/batching.py [--dtype float32] [--out bench-results/batching.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from prefill.loadtest.client import LoadTestConfig, PromptLengths, RequestRecord, one_request, run_load_test
from prefill.loadtest.report import summarize
from prefill.server.server import free_port

WORDS = ("the", "river", "runs", "past", "the", "old", "mill", "and", "under", "the", "stone", "bridge", "near", "town")
RULES = ("rule", "one", "answer", "in", "one", "short", "sentence", "and", "check", "every", "fact", "with", "care")


def start_server(dtype: str, chunk_size: int, threads: int | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-c",
        "from prefill.cli.main import main; main()",
        "serve",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--chunk-size",
        str(chunk_size),
        "--kv-cache-mb",
        "1024",
    ]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, lambda: proc.stderr.read().decode())
    return proc, url


def wait_healthy(proc: subprocess.Popen, url: str, why: Callable[[], str]) -> None:
    """Return once the server at `url` answers /health; RuntimeError (`why()` if `proc` exited) after 2 minutes."""
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(why())
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not start")


def load(url: str, concurrency: int, requests: int, prompt_len: int, max_tokens: int) -> dict:
    cfg = LoadTestConfig(
        url,
        concurrency=concurrency,
        max_requests=requests,
        duration_s=900,
        prompt_lengths=PromptLengths(prompt_len, prompt_len),
        max_tokens=max_tokens,
        ignore_eos=True,
        seed=concurrency,
    )
    records, wall, _ = asyncio.run(run_load_test(cfg))
    return summarize(records, wall)


async def mixed(url: str, n_short: int, long_tokens: int, n_long: int, max_tokens: int) -> dict:
    """n_short streams of 64-token prompts, and n_long prompts of `long_tokens` sent once the streams run."""
    short = LoadTestConfig(url, max_tokens=max_tokens, ignore_eos=True)
    long = LoadTestConfig(url, max_tokens=4, ignore_eos=True)
    async with httpx.AsyncClient(timeout=900) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        t0 = time.perf_counter()
        recs = [RequestRecord(i, 0, 0.0) for i in range(n_short + n_long)]
        prompts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(64)) for i in range(n_short)]
        tasks = [asyncio.create_task(one_request(client, short, model, p, recs[i], t0)) for i, p in enumerate(prompts)]
        await asyncio.sleep(3.0)  # the short streams are decoding now
        long_prompt = " ".join(WORDS[j % len(WORDS)] + str(j % 7) for j in range(long_tokens // 2))
        tasks += [
            asyncio.create_task(one_request(client, long, model, f"{i} {long_prompt}", recs[n_short + i], t0))
            for i in range(n_long)
        ]
        await asyncio.gather(*tasks)
    short_recs, long_recs = recs[:n_short], recs[n_short:]
    return {
        "short": summarize(short_recs, 1.0),
        "long": [r.server_timings | {"prompt_tokens": r.usage_prompt_tokens} for r in long_recs],
    }


async def shared_prefix(url: str, n: int, system_tokens: int, max_tokens: int) -> dict:
    """n requests behind one system prompt; the pool's bytes in use, sampled while all n run."""
    system = " ".join(RULES[j % len(RULES)] for j in range(system_tokens))
    cfg = LoadTestConfig(url, max_tokens=max_tokens, ignore_eos=True, system_prompt=system)
    peak = {"kv_used_bytes": 0}
    async with httpx.AsyncClient(timeout=900) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        t0 = time.perf_counter()
        warm = RequestRecord(0, 0, 0.0)
        await one_request(client, LoadTestConfig(url, max_tokens=1, system_prompt=system), model, "hello", warm, t0)
        base = (await client.get(f"{url}/health")).json()
        recs = [RequestRecord(i, 0, 0.0) for i in range(n)]
        tasks = [
            asyncio.create_task(one_request(client, cfg, model, f"Question {i}: why?", recs[i], t0)) for i in range(n)
        ]
        while not all(t.done() for t in tasks):
            h = (await client.get(f"{url}/health")).json()
            if h["running"] == n and h["kv_used_bytes"] > peak["kv_used_bytes"]:
                peak = h
            await asyncio.sleep(0.05)
    P = recs[0].usage_prompt_tokens
    per_token = base["kv_pool_bytes"] // (base["kv_blocks_total"] * base["kv_block_tokens"])
    block = base["kv_block_tokens"] * per_token
    cached = recs[0].cached_tokens or 0
    suffix = P - cached
    tokens = base["kv_block_tokens"]
    # The pool also holds earlier phases' prefixes: count the blocks the n requests added, plus the shared
    # prefix's blocks (already in the pool before they came, held once however many requests use them).
    held = peak["kv_used_bytes"] - base["kv_used_bytes"] + cached * per_token
    one_prefix_plus_suffixes = cached * per_token + n * math.ceil((suffix + max_tokens - 1) / tokens) * block
    return {
        "n": n,
        "prompt_tokens": P,
        "cached_tokens": cached,
        "kv_bytes_held_by_the_n": held,
        "one_prefix_plus_suffixes": one_prefix_plus_suffixes,
        "n_full_copies": n * math.ceil((P + max_tokens - 1) / tokens) * block,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--chunk-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("bench-results/batching.json"))
    args = ap.parse_args()
    proc, url = start_server(args.dtype, args.chunk_size, args.threads)
    try:
        load(url, 2, 2, 64, 8)  # warm-up
        c1 = load(url, 1, 4, 64, 64)
        c8 = load(url, 8, 16, 64, 64)
        mix = asyncio.run(mixed(url, 8, 2000, 2, 64))
        share = asyncio.run(shared_prefix(url, 8, 1000, 32))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    tok = {k: s["throughput_output_tok_per_s"] for k, s in (("c1", c1), ("c8", c8))}
    itl = {k: s["latency"]["itl_s"]["p50"] for k, s in (("c1", c1), ("c8", c8))}
    chunks = [math.ceil((t["prompt_tokens"] - t.get("cached_tokens", 0)) / args.chunk_size) for t in mix["long"]]
    chunk_s = max(t["prefill_s"] / c for t, c in zip(mix["long"], chunks, strict=True))
    result = {
        "dtype": args.dtype,
        "throughput_tok_s": tok,
        "throughput_ratio_c8_over_c1": tok["c8"] / tok["c1"],
        "itl_p50_s": itl,
        "itl_p50_ratio_c8_over_c1": itl["c8"] / itl["c1"],
        "mixed_itl_p99_s": mix["short"]["latency"]["itl_s"]["p99"],
        "mixed_chunk_prefill_s": chunk_s,
        "mixed_itl_p99_over_chunk": mix["short"]["latency"]["itl_s"]["p99"] / chunk_s,
        "shared_prefix": share,
        "c1": c1,
        "c8": c8,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(
        f"output tok/s: c1 {tok['c1']:.1f}, c8 {tok['c8']:.1f} -> {result['throughput_ratio_c8_over_c1']:.2f}x "
        "(target >= 4x)"
    )
    print(
        f"ITL p50: c1 {itl['c1'] * 1e3:.1f} ms, c8 {itl['c8'] * 1e3:.1f} ms -> "
        f"{result['itl_p50_ratio_c8_over_c1']:.2f}x (target <= 1.5x)"
    )
    print(
        f"with 2,000-token prompts mixed in: ITL p99 {result['mixed_itl_p99_s'] * 1e3:.0f} ms vs one "
        f"{args.chunk_size}-token chunk {chunk_s * 1e3:.0f} ms -> {result['mixed_itl_p99_over_chunk']:.2f}x "
        "(target < 2x)"
    )
    s = share
    print(
        f"8 requests behind a {s['cached_tokens']}-token cached prefix: hold {s['kv_bytes_held_by_the_n']:,} B; "
        f"one prefix + 8 suffixes {s['one_prefix_plus_suffixes']:,} B; 8 full copies {s['n_full_copies']:,} B"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
