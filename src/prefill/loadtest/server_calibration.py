"""A server's own time beyond the time model's forward and the step loop's work, timed on the server before a load.

    before = timed_requests(cfg, PromptLengths(32, 256))  # requests alone; a burst, and prompts prefilled among it
    ... the load ...
    serving = calibrate(forward, loop_steps, [before, timed_requests(cfg, lengths)])  # a ServingCalibration
    step_s = serving.step_seconds(forward, rows) + loop + ...    # what the simulator adds to each step

A server is more than its forwards: HTTP and SSE, its event loop and the client's, all on the compute's cores.
Measured on `prefill serve` under load (Xeon VM, bfloat16, a Poisson load at 60% of capacity, each step traced):
a step's forward ran 4-8% longer than the same rows replayed in-process, a step during which a request arrived
5-9 ms longer (its HTTP and tokenizing take a core from the forward's threads), a prefill step's forward 11%
longer than the time model's even in-process (the time model's error at 64-256 tokens in bfloat16,
benchmarks/predict.py), and the first forward at a new token count builds oneDNN's kernels for its shapes (~1 ms
each in bfloat16). Five figures, each timed on the server itself before the load and again after it:

- per step, c: the gaps between the tokens of a request alone, beyond the predicted one-row step (the lesser
  of ALONE such requests: a minute of a slower machine once timed c = 5.6 ms where the next read 0);
- per streamed row, e: the gaps of BURST requests decoding together, beyond the predicted step of all of them;
- per request, latency: the client's TTFT less the server's own (its `timings`: HTTP in, the first chunk out),
  of the probes below (requests sent to a busy server);
- the prefill's scale, k: PROBES prompts of the load's lengths sent one after another (each a random pause,
  up to two THINK_S, after the one before: they arrive at any point of a step, as a load's do) while the burst
  decodes, each prefill step (the server's `timings`, the burst's decode rows in it) against the time model's
  step, median (a server that sends no timings: k = 1). A new token count's first forward builds its kernels,
  so prompts of new lengths, as a load's, run slower than one length timed again and again;
- per arrival at a busy server, intake: the burst's step during which a probe arrived less its steps without
  an arrival or a prefill, median.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prefill.costmodel.ops import Row
from prefill.loadtest import client as loadtest
from prefill.loadtest.client import LoadTestConfig, PromptLengths, RequestRecord
from prefill.loadtest.report import itls

ALONE, ALONE_PROMPT, ALONE_TOKENS = 2, 32, 33  # requests timed alone, one after another: 32 gaps each
BURST, BURST_TOKENS = 8, 49  # requests decoding together (as many as a busy minute's steps hold), and their tokens
PROBES = 6  # prompts prefilled one after another while the burst decodes
PROBE_START_S = 0.3  # after the burst is sent: its prompts are prefilled and it decodes
THINK_S = 0.025  # the probes' mean pause after the one before (uniform up to twice it: about a step here)
SSE_S = 0.003  # a step's chunks reach the client within this of one another
Forward = Callable[[list[Row]], float]  # the time model's seconds of one forward
Timed = tuple[list[RequestRecord], list[RequestRecord]]  # timed_requests: (alone, burst + probes)


@dataclass(frozen=True)
class ServingCalibration:
    """The server's own seconds: c + e (R - 1) a step of R rows, `latency_s` a request outside its clock, a step
    that prefills at `prefill_scale` times the time model's forward, and `intake_s` more for a step during which
    a request arrived (prefill.plan.simulate charges it)."""

    c: float = 0.0
    e: float = 0.0
    latency_s: float = 0.0
    prefill_scale: float = 1.0
    intake_s: float = 0.0

    def forward_seconds(self, forward: Forward, rows: list[Row]) -> float:
        """A step's forward: the time model's, scaled when the step prefills (a row of more than one token)."""
        t = forward(rows)
        return t if all(r.new == 1 for r in rows) else self.prefill_scale * t

    def own_seconds(self, R: int) -> float:
        return self.c + self.e * (R - 1)


def calibrate(forward: Forward, step: Forward, runs: Sequence[Timed]) -> ServingCalibration:
    """The calibration from the records of timed_requests, run before and after a load: `forward` is the time
    model's forward, `step` the simulator's whole step without the server's own time (forward and the loop's
    work). c and e are the least of their runs' (a server timed in a slower minute: 6 ms a step more at one
    stream, then none in the next); k, the latency and the intake the median over every probe (sent to a busy
    server, as a load's requests are: 2-14 ms outside its clock where one alone spent 2-5; a client's first
    request, opening its connection, took 30 ms of a step). ValueError when the requests timed too little."""
    alone = [r for a, _ in runs for r in a]
    if not alone:
        raise ValueError("no request was timed alone")
    c = max(0.0, min(_median_gap(r) - step([Row(1, _middle(r))]) for r in alone))
    e = min(_per_row(step, list(busy[:BURST]), c) for _, busy in runs)
    scales = [s for _, busy in runs for s in prefill_scales(forward, busy[:BURST], busy[BURST:])]
    k = statistics.median(scales) if scales else 1.0
    timed = [r for _, busy in runs for r in busy[BURST:] if r.ok and (r.server_timings or {}).get("ttft_s")]
    latency = statistics.median(map(http_latency, timed)) if timed else min(map(http_latency, alone))
    intakes = [x for _, busy in runs for x in arrival_costs(busy[:BURST], busy[BURST:])]
    return ServingCalibration(c, e, latency, k, max(0.0, statistics.median(intakes)) if intakes else 0.0)


def _per_row(step: Forward, burst: list[RequestRecord], c: float) -> float:
    """e: the burst's median gap beyond the predicted step of all its rows and c, per row after the first."""
    if len(burst) < 2 or not all(r.ok for r in burst):
        raise ValueError("the burst of requests the server ran together did not all finish")
    gaps = [g for r in burst for g in itls(r)[2:-2]]  # the steps all of them decoded (not the others' prefill)
    return max(0.0, (statistics.median(gaps) - step([Row(1, _middle(r)) for r in burst]) - c) / (len(burst) - 1))


def prefill_scales(forward: Forward, burst: Sequence[RequestRecord], probes: Sequence[RequestRecord]) -> list[float]:
    """For each probe prefilled while the whole burst decoded, its prefill step (the burst's decode rows beside
    the probe's prompt) measured (the server's `timings`) over predicted."""
    ends = min((r.end for r in burst if r.end is not None), default=0.0)
    scales = []
    for p in probes:
        timed = (p.server_timings or {}).get("prefill_s")
        if not p.ok or timed is None or not p.usage_prompt_tokens or p.cached_tokens or p.first_content >= ends:
            continue  # not all of it prefilled beside the whole burst
        decode = [Row(1, r.usage_prompt_tokens + sum(t < p.start for t in r.chunk_times)) for r in burst]
        scales.append(timed / forward([Row(p.usage_prompt_tokens, 0), *decode]))
    return scales


def arrival_costs(burst: Sequence[RequestRecord], probes: Sequence[RequestRecord]) -> list[float]:
    """For each probe that arrived while the burst decoded: the burst's step it arrived in (the gap between two of
    the burst's tokens that holds its start, median over the burst's requests) less the burst's median step
    without an arrival, when no prompt was prefilled in either (a probe's first token not within SSE_S of it)."""
    prefilled = [p.first_content for p in probes if p.first_content is not None]
    starts = [p.start for p in probes]
    held: dict[int, list[float]] = {}
    free: list[float] = []
    for r in burst:
        for a, b in itertools.pairwise(r.chunk_times):
            if any(a < t <= b + SSE_S for t in prefilled):
                continue
            inside = [i for i, t in enumerate(starts) if a < t < b]
            (held.setdefault(inside[0], []) if inside else free).append(b - a)
    if not free:
        return []
    base = statistics.median(free)
    return [statistics.median(gaps) - base for gaps in held.values()]


def http_latency(alone: RequestRecord) -> float:
    """Seconds a request spends outside the server's own timing: the client's TTFT less the server's (its
    `timings`: HTTP in, tokenizing before the clock starts, the first chunk out), 0 when the server sends none."""
    timed = (alone.server_timings or {}).get("ttft_s")
    if not alone.ok or timed is None:
        return 0.0
    return max(0.0, alone.first_content - alone.start - timed)


def timed_requests(cfg: LoadTestConfig, probe_lengths: PromptLengths) -> Timed:
    """Run on the server at cfg.url: ALONE requests one after another, then BURST together with PROBES prompts of
    `probe_lengths` (each length new to the server, as a load's are: its first forward builds the kernels of its
    shapes) sent one after another, with pauses, PROBE_START_S later (their times moved to the burst's clock). Their
    words come from seeds drawn anew each time (negative: never a load's), so neither they nor the load meet a
    prefix of theirs in the server's cache. Returns (alone, burst + probes)."""
    seeds = [-1 - random.SystemRandom().randrange(2**31) for _ in range(3)]

    def run(
        n: int, together: int, seed: int, lengths, tokens: int, model: str | None = None, think_s: float = 0.0
    ) -> LoadTestConfig:
        each = {"concurrency": together, "rate": None, "max_requests": n, "seed": seed, "think_s": think_s}
        each["model"] = model or cfg.model
        return dataclasses.replace(cfg, prompt_lengths=lengths, max_tokens=tokens, ignore_eos=True, prompts=(), **each)

    async def started(config: LoadTestConfig, delay_s: float = 0.0) -> tuple[float, list[RequestRecord]]:
        await asyncio.sleep(delay_s)
        return time.perf_counter(), (await loadtest.run_load_test(config))[0]

    async def busy(model: str) -> list[RequestRecord]:
        burst = started(run(BURST, BURST, seeds[1], short, BURST_TOKENS, model))
        probes = started(run(PROBES, 1, seeds[2], probe_lengths, 2, model, THINK_S), PROBE_START_S)
        (t_burst, together), (t_probes, probed) = await asyncio.gather(burst, probes)
        return together + [_shifted(r, t_probes - t_burst) for r in probed]

    short = PromptLengths(ALONE_PROMPT, ALONE_PROMPT)
    alone, _, model = asyncio.run(loadtest.run_load_test(run(ALONE, 1, seeds[0], short, ALONE_TOKENS)))
    return alone, asyncio.run(busy(model))


def _shifted(r: RequestRecord, dt: float) -> RequestRecord:
    """A record with its times `dt` later (onto another run's clock)."""
    later = {k: getattr(r, k) + dt for k in ("start", "first_content", "end") if getattr(r, k) is not None}
    return dataclasses.replace(r, chunk_times=[t + dt for t in r.chunk_times], **later)


def _median_gap(record: RequestRecord) -> float:
    gaps = itls(record)
    if not record.ok or len(gaps) < 2 or not record.usage_prompt_tokens:
        raise ValueError("the request served alone streamed too few tokens to time its steps")
    return statistics.median(gaps)


def _middle(record: RequestRecord) -> int:
    """A streamed request's context at its middle token."""
    return (record.usage_prompt_tokens or 0) + len(record.chunk_times) // 2
