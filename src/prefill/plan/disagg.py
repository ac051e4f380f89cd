"""Disaggregated prefill/decode, simulated: x prefill instances and y decode instances (xPyD), each its own
replica with its own TP width and its own scheduler, the K/V of each prompt shipped between them over a link.

    d = Disagg(GpuServer.of(spec, "h100", "vllm"), GpuServer.of(spec, "h100", "vllm"), 2, 1, get_link("nvlink"))
    result = simulate_disagg(d, poisson_trace(8.0, 400, PromptLengths(3000, 5000), PromptLengths(100, 300)))
    summary = summarize(result.records, result.wall_s)   # TTFT, TPOT, goodput as a load test reports them

What runs, in order (DistServe's and Splitwise's split; NVIDIA Dynamo's and llm-d's):
1. Prefill. Requests go round-robin to the prefill instances. Each runs the one step loop and Scheduler with its
   engine's rules (prefill.plan.simulate), every request asking for one token: its first token is the TTFT.
2. Transfer. The prompt's K/V (prefill.costmodel.links: the KV formula's bytes, the link's time) leaves when its
   prefill ends, after the transfer before it on the same instance's links; not layer by layer during the prefill.
3. Decode. Requests go round-robin to the decode instances as their K/V lands. Each runs the same loop with
   the engine's caps, a request's prompt plus its first token already there: the first step it joins computes that
   one token at its context (the row (P + 1, 0) the scheduler schedules is timed as (1, P)), and no prefill shares a
   decode step. The K/V held by a prefill instance while it waits for a decode slot is not counted.
Nothing is extrapolated: every figure comes from the simulated steps.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prefill.costmodel.links import Link, kv_transfer_seconds
from prefill.costmodel.ops import Row
from prefill.errors import BadInput
from prefill.loadtest.client import RequestRecord
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.simulate import SimRequest, SimResult, simulate


class Meter:
    """A step-time function that also keeps every step it timed: (seconds, prompt tokens, decode rows)."""

    def __init__(self, step_seconds: Callable[[list[Row]], float]) -> None:
        self.step_seconds = step_seconds
        self.steps: list[tuple[float, int, int]] = []

    def __call__(self, rows: list[Row]) -> float:
        s = self.step_seconds(rows)
        self.steps.append((s, sum(r.new for r in rows if r.new > 1), sum(1 for r in rows if r.new == 1)))
        return s

    @property
    def busy_s(self) -> float:
        return sum(s for s, _, _ in self.steps)


def run_metered(server: GpuServer, trace: Sequence[SimRequest], arrived: bool = False) -> tuple[SimResult, Meter]:
    """`trace` through `server` as GpuServer.run does, each step metered. `arrived`: a decode instance, whose
    requests bring their prompt's K/V (a prompt row is timed as its last token; no token budget; decode and
    arrivals share steps)."""
    e = server.engine
    if not arrived:
        meter = Meter(server.step_seconds)
        rules, budget = (e.decode_in_budget, e.mixed), e.token_budget
    else:
        meter = Meter(lambda rows: server.step_seconds([_landed(r) for r in rows]))
        rules, budget = (False, True), None
    result = simulate(server.spec, trace, meter, server.tokens, budget, e.max_seqs, rules=rules)
    return result, meter


def _landed(row: Row) -> Row:
    """A row of a decode instance: a prompt whose K/V arrived computes only its last token."""
    return row if row.new == 1 else Row(1, row.past + row.new - 1)


@dataclass(frozen=True)
class Disagg:
    """x prefill instances like `prefill` and y decode instances like `decode`, K/V over `link`."""

    prefill: GpuServer
    decode: GpuServer
    x: int
    y: int
    link: Link

    def __post_init__(self) -> None:
        if self.x < 1 or self.y < 1:
            raise BadInput(f"a disaggregated deployment needs x, y >= 1, got {self.x}P{self.y}D")

    @property
    def gpus(self) -> int:
        return self.x * self.prefill.tp + self.y * self.decode.tp

    @property
    def name(self) -> str:
        p, d = self.prefill, self.decode
        return (
            f"{self.x}P{self.y}D of {p.spec.name} on {p.hw.name} ({p.engine.name}): prefill {self.x} x TP {p.tp}, "
            f"decode {self.y} x TP {d.tp}, K/V over {self.link.name}"
        )

    def transfer_s(self, P: int) -> float:
        """Seconds to ship one prompt's K/V of P tokens to a decode instance."""
        kvb = self.prefill.layout.kv_bytes
        return kv_transfer_seconds(self.prefill.spec, P, kvb, self.prefill.tp, self.decode.tp, self.link)


@dataclass
class DisaggResult:
    """The deployment's run: each request as a load test records it (first token from the prefill instance, the
    rest from the decode one), the wall time, each pool's metered steps and each request's transfer seconds."""

    records: list[RequestRecord]
    wall_s: float
    prefill_meters: list[Meter] = field(default_factory=list)
    decode_meters: list[Meter] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)
    preemptions: int = 0

    @property
    def steps(self) -> list[tuple[float, int, int]]:
        """Every step of both pools (seconds, prompt tokens, decode rows)."""
        return [s for m in self.prefill_meters + self.decode_meters for s in m.steps]

    def busy(self, meters: list[Meter]) -> float:
        """The share of the wall time a pool's instances were running steps (their mean)."""
        return sum(m.busy_s for m in meters) / (len(meters) * self.wall_s) if meters and self.wall_s else 0.0


def parse_xpyd(text: str) -> tuple[int, int]:
    """'2P1D' -> (2, 1): prefill and decode instances; BadInput otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*[pP]\s*(\d+)\s*[dD]\s*", text or "")
    if m is None or min(int(m[1]), int(m[2])) < 1:
        raise BadInput(f"--disagg wants xPyD with x, y >= 1 (prefill and decode instances), e.g. 2P1D; got {text!r}")
    return int(m[1]), int(m[2])


def simulate_disagg(d: Disagg, trace: Sequence[SimRequest]) -> DisaggResult:
    """`trace` through the xPyD deployment `d` (see the module docstring)."""
    pending = sorted(trace)
    records = [RequestRecord(i, r.prompt_tokens, r.arrival_s) for i, r in enumerate(pending)]
    out = DisaggResult(records, 0.0)
    landed: list[tuple[float, int]] = []  # (when its K/V is at a decode instance, request index)
    for i in range(d.x):
        mine = list(range(i, len(pending), d.x))  # round-robin, in arrival order
        result, meter = run_metered(
            d.prefill, [SimRequest(pending[k].arrival_s, pending[k].prompt_tokens, 1) for k in mine]
        )
        out.prefill_meters.append(meter)
        out.preemptions += result.preemptions
        free = 0.0  # this instance's links carry one transfer at a time
        for k, rec in sorted(zip(mine, result.records, strict=True), key=lambda kr: kr[1].end or 0.0):
            if not rec.ok:
                records[k].error = rec.error or "prefill failed"
                continue
            records[k].first_content = records[k].end = rec.first_content
            records[k].chunk_times.append(rec.first_content)
            records[k].usage_prompt_tokens, records[k].usage_completion_tokens = pending[k].prompt_tokens, 1
            records[k].n_chunks = 1
            if pending[k].output_tokens >= 2:
                seconds = d.transfer_s(pending[k].prompt_tokens)
                free = max(rec.end, free) + seconds
                out.transfer_s.append(seconds)
                landed.append((free, k))
    _decode(d, pending, records, sorted(landed), out)
    out.wall_s = max((r.end or 0.0) for r in records) if records else 0.0
    return out


def _decode(d: Disagg, pending, records: list[RequestRecord], landed: list[tuple[float, int]], out) -> None:
    """The decode pool: each request's tokens after its first, arriving when its K/V lands, round-robin."""
    for j in range(d.y):
        mine = [k for _, k in landed[j :: d.y]]
        trace = [SimRequest(t, pending[k].prompt_tokens + 1, pending[k].output_tokens - 1) for t, k in landed[j :: d.y]]
        result, meter = run_metered(d.decode, trace, arrived=True)
        out.decode_meters.append(meter)
        out.preemptions += result.preemptions
        by_arrival = sorted(range(len(trace)), key=lambda n: trace[n])  # simulate() sorts its trace
        for n, rec in zip(by_arrival, result.records, strict=True):
            k = mine[n]
            if not rec.ok:
                records[k].error = rec.error or "decode failed"
                continue
            records[k].chunk_times.extend(rec.chunk_times)
            records[k].n_chunks += rec.n_chunks
            records[k].usage_completion_tokens = 1 + rec.n_out
            records[k].end = rec.end
