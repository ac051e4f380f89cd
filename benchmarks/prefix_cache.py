"""TTFT with and without the prefix cache: a ~1,000-token shared system prompt plus a short question.

Starts our server twice on a loopback port (prefix cache on, then --prefix-cache-mb 0), sends the same
sequence of requests to each, one at a time (streamed, temperature 0, a few output tokens), and reports
the client-measured TTFT (to the first chunk with text) and the server's own ttft_s and prefill_s.
The first request of the cached run fills the cache; the rest reuse the system prompt.

    .venv/bin/python benchmarks/prefix_cache.py [--questions 6] [--system-tokens 1000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx

from prefill.engine.llm import Engine
from prefill.loadtest.client import LoadTestConfig, RequestRecord, one_request
from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

QUESTIONS = [
    "What is the capital of France?",
    "Name a prime number above 10.",
    "How many legs does a spider have?",
    "What colour is the sky on a clear day?",
    "Which planet is closest to the Sun?",
    "What is two plus three?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?",
]


def system_prompt(engine: Engine, n_tokens: int) -> str:
    """Numbered house rules, cut to about `n_tokens` tokens."""
    rules = [
        f"Rule {i}: answer in one short sentence, check every fact, and never invent a source." for i in range(400)
    ]
    text = "You are the help desk of a small library. " + " ".join(rules)
    words = text.split()
    lo, hi = 1, len(words)
    while lo < hi:  # the most words that stay within n_tokens
        mid = (lo + hi + 1) // 2
        if len(engine.tokenizer.encode(" ".join(words[:mid]))) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


async def run(url: str, model: str, system: str, questions: list[str], max_tokens: int) -> list[RequestRecord]:
    """The questions one after another (no queueing), each behind the same system prompt."""
    cfg = LoadTestConfig(url, model=model, chat=True, max_tokens=max_tokens, system_prompt=system)
    records = []
    async with httpx.AsyncClient(timeout=600) as client:
        for i, q in enumerate(questions):
            rec = RequestRecord(i, len(system) + len(q), 0.0)
            t0 = time.perf_counter()
            await one_request(client, cfg, model, q, rec, t0)
            if rec.error:
                raise RuntimeError(rec.error)
            records.append(rec)
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    engine = Engine.load(progress=False)
    system = system_prompt(engine, args.system_tokens)
    questions = (QUESTIONS * 4)[: args.questions]
    results = {}
    for label, mb in (("prefix cache on", 256.0), ("prefix cache off", 0.0)):
        cfg = ServeConfig(model_id_of(engine), prefix_cache_mb=mb, chunk_size=args.chunk_size)
        with BackgroundServer(create_app(engine, cfg)) as url:
            results[label] = asyncio.run(run(url, cfg.model_id, system, questions, args.max_tokens))
    print(f"model {model_id_of(engine)}, {engine.dtype}, system prompt {args.system_tokens} tokens (target)")
    print(
        f"{'run':18} {'req':>3} {'P':>5} {'cached':>6} {'client TTFT ms':>14} {'server TTFT ms':>14} {'prefill ms':>10}"
    )
    summary = {}
    for label, recs in results.items():
        for r in recs:
            t = r.server_timings or {}
            print(
                f"{label:18} {r.index:>3} {r.usage_prompt_tokens:>5} {r.cached_tokens:>6} "
                f"{(r.first_content - r.start) * 1e3:>14.1f} {t.get('ttft_s', float('nan')) * 1e3:>14.1f} "
                f"{t.get('prefill_s', float('nan')) * 1e3:>10.1f}"
            )
        steady = recs[1:]  # request 0 of the cached run is the one that fills the cache
        summary[label] = {
            "median_client_ttft_s": statistics.median(r.first_content - r.start for r in steady),
            "median_server_prefill_s": statistics.median(r.server_timings["prefill_s"] for r in steady),
            "median_cached_tokens": statistics.median(r.cached_tokens for r in steady),
            "median_prompt_tokens": statistics.median(r.usage_prompt_tokens for r in steady),
        }
    on, off = summary["prefix cache on"], summary["prefix cache off"]
    print(
        f"requests 1..{len(questions) - 1}: median TTFT {on['median_client_ttft_s'] * 1e3:.0f} ms with the prefix "
        f"cache vs {off['median_client_ttft_s'] * 1e3:.0f} ms without "
        f"({off['median_client_ttft_s'] / on['median_client_ttft_s']:.1f}x faster; "
        f"{on['median_cached_tokens']:.0f} of {on['median_prompt_tokens']:.0f} prompt tokens cached)"
    )
    if args.out:
        rows = {k: [vars(r) for r in v] for k, v in results.items()}
        args.out.write_text(json.dumps({"summary": summary, "requests": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
