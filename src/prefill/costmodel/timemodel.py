"""The per-operation time model: each operation of a forward takes max(FLOPs / rate, bytes / bandwidth) plus its
launches' overhead, on a MachineProfile; a step is the sum of its operations, a prefill or a request the sum of
its steps. Every prediction says which part dominates (compute, memory or overhead).

    predict_step(spec, rows, profile, layout)   one forward of rows (Row: new tokens, cached past, logits asked)
    predict_prefill(spec, P, profile, layout)   B prompts of P tokens after `past` cached ones, in chunks or not
    predict_decode(spec, contexts, ...)         one decode step of len(contexts) rows, each at its own context
    predict_scoring(spec, P, ...)               a prefill that unembeds every position

A request's time is costs.request_seconds over these predictions: TTFT (a prefill's) + (n - 1) ITL (decode steps').

Torch-free. The simple 2 N P model (costs.prefill_seconds) stays the lesson's first step; this one explains
where it stops holding: short prompts read every weight for few FLOPs, and many small kernels cost their launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefill.costmodel.costs import canonical_dtype, dtype_bytes, kv_bytes_per_element
from prefill.costmodel.ops import Layout, Op, Row, attention_ops, forward_ops, fused_launches, fuses, gpu_heads
from prefill.costmodel.profile import MachineProfile
from prefill.costmodel.specs import ModelSpec

PARTS = ("compute", "memory", "overhead")


def layout_for(
    dtype: str,
    weights: str | float | None = None,
    tp: int = 1,
    gathers_kv: bool = True,
    fused_below: int = 0,
    kv: str | None = None,
    batched_attention: bool = False,
) -> Layout:
    """The Layout of an engine computing in `dtype` with weights stored as `weights` (a dtype name, or bytes per
    weight for a quantized format; default: `dtype`), K/V stored as `kv` (costs.KV_DTYPES; default: `dtype`),
    its blocks fused below `fused_below` tokens, attention batched over the rows or one kernel a row (Layout)."""
    act = dtype_bytes(canonical_dtype(dtype))
    wb = act if weights is None else weights if isinstance(weights, (int, float)) else dtype_bytes(weights)
    kvb = act if kv is None else kv_bytes_per_element(kv)
    return Layout(float(wb), act, kvb, tp, gathers_kv, fused_below, batched_attention)


@dataclass(frozen=True)
class OpTime:
    """Seconds of one kind of operation over a forward (all its instances): its FLOPs at the rate measured at its
    shape (compute_s), its bytes at the bandwidth (memory_s), its launches (overhead_s), and its time: the larger
    of compute and memory, plus the launches on a CPU (dispatch runs before the work, on the same cores); on a GPU
    the launches overlap the kernels and are weighed for the whole step (Prediction.launch_wait_s).
    side: which side of its roofline the operation sits on (its FLOPs per byte against the ridge, the peak rate at
    its shape over the bandwidth): a rate measured at few rows already includes the weights' streaming, so the
    roofline, not the larger of the two terms, says whether compute or memory limits it."""

    name: str
    kind: str
    flops: float
    bytes: float
    weight_bytes: float
    compute_s: float
    memory_s: float
    overhead_s: float
    seconds: float
    side: str  # "compute" or "memory"

    @property
    def work_s(self) -> float:
        """The seconds its compute or memory side sets (its time without the launches)."""
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        """Which part sets most of this operation's time: compute, memory or overhead."""
        return "overhead" if self.overhead_s > self.work_s and self.seconds > self.work_s else self.side


def extra_launches(op: Op, profile: MachineProfile) -> int:
    """The launches whose overhead comes on top of an operation's work: all of them, less the kernel's own where
    its rate was measured with the dispatch included (the probe's GEMM and attention timings); none for an
    operation that runs inside another's launch (a fused block operator's)."""
    measured = (op.kind == "gemm" and profile.gemm) or (op.kind == "attention" and profile.attention)
    return max(0, op.launches - (1 if measured else 0))


def op_time(op: Op, profile: MachineProfile, weights_resident: bool = False, graphed: bool = False) -> OpTime:
    """One operation's time on `profile` (see OpTime), all `op.count` instances together; `graphed`: its step
    replays a CUDA graph, so the operation launches nothing of its own."""
    if op.kind == "gemm":
        compute, peak = op.flops / profile.gemm_rate(op.M, op.K, op.N), profile.gemm_peak(op.K, op.N)
    elif op.kind == "attention":
        compute, peak = op.flops / profile.attention_rate(op.queries, op.keys), profile.attention_peak()
    else:
        compute, peak = 0.0, 0.0
    if op.kind == "comm":  # each all-reduce: its latency, then its bytes over the link
        memory = profile.link_latency_s + op.bytes / (profile.link_bytes_per_s or profile.bandwidth_bytes_per_s)
    else:  # weights stream from memory unless all of them fit the cache, cached K/V always (the pool is
        # written long before it is read); activations may be cache-resident
        acts = op.bytes - op.weight_bytes - op.pool_bytes
        weights_rate = profile.stream_rate(0 if weights_resident else float("inf"))
        memory = op.weight_bytes / weights_rate + op.pool_bytes / profile.bandwidth_bytes_per_s
        memory += acts / profile.stream_rate(acts if op.working_set is None else op.working_set)
    overhead = 0.0 if graphed else extra_launches(op, profile) * profile.op_overhead_s
    if op.kind == "gemm" and profile.gemm_streams_weights:  # the curve's time has the weights' streaming in it
        memory = min(memory, compute)
    floor = op.launches * profile.kernel_floor_s  # a GPU kernel takes some microseconds however small its work
    seconds = max(compute, memory, floor) + (0.0 if profile.overlap_launches else overhead)
    ridge = peak / profile.bandwidth_bytes_per_s
    side = "compute" if op.bytes == 0 or op.flops / op.bytes >= ridge > 0 else "memory"
    n = op.count
    values = (op.flops, op.bytes, op.weight_bytes, compute, memory, overhead, seconds)
    return OpTime(op.name, op.kind, *(v * n for v in values), side)


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds of `steps` forwards, by operation, with the profile's fixed step overhead per forward;
    launch_wait_s: on a GPU, the seconds its kernels wait for the CPU to launch them (in a step whose launches
    take longer than its kernels' work); overlap: whether the launches overlap the work (a GPU)."""

    ops: tuple[OpTime, ...]
    step_overhead_s: float
    steps: int = 1
    profile: str = ""
    launch_wait_s: float = 0.0
    overlap: bool = False

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.ops) + self.launch_wait_s + self.steps * self.step_overhead_s

    @property
    def flops(self) -> float:
        return sum(o.flops for o in self.ops)

    @property
    def bytes(self) -> float:
        return sum(o.bytes for o in self.ops)

    def parts(self) -> dict[str, float]:
        """Seconds set by compute, by memory and by overhead; they add up to `seconds`."""
        out = dict.fromkeys(PARTS, 0.0)
        for o in self.ops:
            out[o.side] += o.work_s
            out["overhead"] += o.seconds - o.work_s
        out["overhead"] += self.launch_wait_s + self.steps * self.step_overhead_s
        return out

    @property
    def dominant(self) -> str:
        """The part that sets most of the time: compute, memory or overhead."""
        parts = self.parts()
        return max(parts, key=parts.get)

    def by_op(self) -> dict[str, OpTime]:
        """The operations merged by name (e.g. all attention rows and windows together)."""
        merged: dict[str, OpTime] = {}
        for o in self.ops:
            merged[o.name] = o if o.name not in merged else _merge(merged[o.name], o)
        return merged

    @property
    def weights_per_forward(self) -> float:
        """Bytes of weights one forward reads (every weight, once)."""
        return sum(o.weight_bytes for o in self.ops) / self.steps

    def dominant_work(self) -> tuple[list[OpTime], float]:
        """The operations on the dominant side, and the seconds of their work (never 0: rates divide by it)."""
        side = [o for o in self.ops if o.side == self.dominant]
        return side, max(sum(o.work_s for o in side), 1e-30)

    def explain(self) -> str:
        """One sentence on what sets the time, with the numbers that set it."""
        parts, total = self.parts(), self.seconds
        head = f"{self.dominant}-bound ({parts[self.dominant] / total if total else 0:.0%} of {total * 1e3:,.1f} ms)"
        side, seconds = self.dominant_work()
        if self.dominant == "memory":  # the rate it moves at, as measured at its shapes (not the stream's peak)
            moved = sum(o.bytes for o in side)
            return (
                f"{head}: {moved / 1e6:,.0f} MB moved at {moved / seconds / 1e9:,.1f} GB/s; the weights' "
                f"{self.weights_per_forward / 1e6:,.0f} MB are read once per forward however few its tokens"
            )
        if self.dominant == "compute":
            flops = sum(o.flops for o in side)
            return f"{head}: {flops / 1e9:,.1f} GFLOP at {flops / seconds / 1e9:,.1f} GFLOP/s"
        launches = sum(o.overhead_s for o in self.ops)
        return f"{head}: kernel launches ({launches * 1e3:,.1f} ms) and per-forward work, not FLOPs or bytes"

    def __add__(self, other: Prediction) -> Prediction:
        return Prediction(
            self.ops + other.ops,
            self.step_overhead_s,
            self.steps + other.steps,
            self.profile,
            self.launch_wait_s + other.launch_wait_s,
            self.overlap,
        )


def _merge(a: OpTime, b: OpTime) -> OpTime:
    side = a.side if a.work_s >= b.work_s else b.side
    sums = (x + y for x, y in zip(_values(a), _values(b), strict=True))
    return OpTime(a.name, a.kind, *sums, side)


def _values(o: OpTime) -> tuple[float, ...]:
    return (o.flops, o.bytes, o.weight_bytes, o.compute_s, o.memory_s, o.overhead_s, o.seconds)


def predict_step(spec: ModelSpec, rows: Sequence[Row], profile: MachineProfile, layout: Layout) -> Prediction:
    """Seconds of one forward of `rows` on `profile`: the sum over forward_ops of op_time, plus the step overhead.
    A step the profile replays as a CUDA graph (MachineProfile.graphed) pays one graph launch, not one a kernel."""
    return StepModel(spec, profile, layout).predict(rows)


class StepModel:
    """predict_step of one model on one profile and layout, for the thousands of steps a simulation times: every
    operation but attention depends on the step's token counts alone, so each distinct one is timed (op_time)
    once and remembered; attention, which depends on every row's context, is timed at each step."""

    def __init__(self, spec: ModelSpec, profile: MachineProfile, layout: Layout) -> None:
        self.spec, self.profile, self.layout = spec, profile, layout
        self._times: dict[tuple[Op, bool, bool], OpTime] = {}
        # (tokens, unembedded, decode only) -> the times before and after attention, weights resident, graphed
        self._steps: dict[tuple[int, int, bool], tuple] = {}

    def predict(self, rows: Sequence[Row]) -> Prediction:
        """The Prediction of one forward of `rows` (see predict_step)."""
        ops = forward_ops(self.spec, rows, self.layout)
        resident, graphed = self._how(ops, rows)
        return self._prediction(tuple(self._time(o, resident, graphed) for o in ops), graphed)

    def _how(self, ops: list[Op], rows: Sequence[Row]) -> tuple[bool, bool]:
        """Whether the weights stay resident (a model small enough to stay in the cache between forwards), and
        whether the step replays a CUDA graph."""
        resident = sum(o.weight_bytes * o.count for o in ops) <= self.profile.cache_bytes
        return resident, self.profile.graphed(sum(r.new for r in rows), all(r.new == 1 for r in rows))

    def _prediction(self, times: tuple[OpTime, ...], graphed: bool) -> Prediction:
        profile = self.profile
        wait = profile.graph_launch_s if graphed else 0.0
        if profile.overlap_launches and not graphed:  # the GPU idles only while the CPU's launches outlast them
            wait = max(0.0, sum(t.overhead_s for t in times) - sum(t.seconds for t in times))
        return Prediction(times, profile.step_overhead_s, 1, profile.name, wait, profile.overlap_launches)

    def seconds(self, rows: Sequence[Row]) -> float:
        """Predicted seconds of one forward of `rows`: predict's, the same sum in the same order. Every operation
        but attention depends on the step's tokens, unembedded positions and whether it decodes only (fusion
        too: fuses() reads the tokens): those are timed once per such step and remembered, and only attention
        (one batched operation a layer on a GPU engine, one a row on the CPU) is built and timed at each step."""
        decode = all(r.new == 1 for r in rows)
        key = (sum(r.new for r in rows), sum(r.logits for r in rows), decode)
        if key not in self._steps:
            ops = forward_ops(self.spec, rows, self.layout)
            resident, graphed = self._how(ops, rows)
            times = [self._time(o, resident, graphed) for o in ops]
            at = next(i for i, o in enumerate(ops) if o.kind == "attention")
            n = sum(o.kind == "attention" for o in ops)  # one a window
            self._steps[key] = (times[:at], times[at + n :], resident, graphed)
        before, after, resident, graphed = self._steps[key]
        attention = attention_ops(self.spec, rows, self.layout, *gpu_heads(self.spec, self.layout.tp))
        if fuses(rows, self.layout):  # as layer_ops: a fused decode block launches its attention inside it
            attention = fused_launches(attention, decode)
        times = (*before, *(op_time(o, self.profile, resident, graphed) for o in attention), *after)
        return self._prediction(times, graphed).seconds

    def _time(self, op: Op, resident: bool, graphed: bool) -> OpTime:
        if op.kind == "attention":
            return op_time(op, self.profile, resident, graphed)
        key = (op, resident, graphed)
        known = self._times.get(key)
        if known is None:
            known = self._times[key] = op_time(op, self.profile, resident, graphed)
        return known


def prefill_steps(P: int, past: int = 0, B: int = 1, chunk_size: int | None = None, scoring: bool = False):
    """The forwards of a prefill: B rows of P new tokens after `past` cached ones, in chunks of `chunk_size`
    (each chunk attends to the cache the chunks before it wrote, and unembeds its last position, or every
    position when `scoring`)."""
    if P < 1 or B < 1 or past < 0 or (chunk_size is not None and chunk_size < 1):
        raise ValueError(f"a prefill needs P >= 1, B >= 1, past >= 0 and chunk_size >= 1 (P={P}, B={B})")
    step = chunk_size or P
    for s in range(0, P, step):
        n = min(step, P - s)
        yield [Row(n, past + s, n if scoring else 1)] * B


def predict_prefill(
    spec: ModelSpec,
    P: int,
    profile: MachineProfile,
    layout: Layout,
    past: int = 0,
    B: int = 1,
    chunk_size: int | None = None,
) -> Prediction:
    """Seconds of a prefill of B prompts of P tokens after `past` cached ones (a prefix-cache hit is exactly
    that: the suffix's prefill against the cached context), in one forward or in chunks."""
    steps = [predict_step(spec, rows, profile, layout) for rows in prefill_steps(P, past, B, chunk_size)]
    return _sum(steps)


def predict_scoring(
    spec: ModelSpec, P: int, profile: MachineProfile, layout: Layout, past: int = 0, chunk_size: int | None = None
) -> Prediction:
    """Seconds of a scoring prefill: like predict_prefill, but every position is unembedded (its logits give
    the next token's log-probability)."""
    steps = [predict_step(spec, rows, profile, layout) for rows in prefill_steps(P, past, 1, chunk_size, True)]
    return _sum(steps)


def predict_decode(spec: ModelSpec, contexts: Sequence[int], profile: MachineProfile, layout: Layout) -> Prediction:
    """Seconds of one decode step (the ITL) of len(contexts) rows, row b with contexts[b] tokens already cached:
    the weights read once for all rows, each row's K/V read, a logit row each."""
    if not contexts:
        raise ValueError("a decode step needs at least one row")
    return predict_step(spec, [Row(1, int(c)) for c in contexts], profile, layout)


def _sum(preds: list[Prediction]) -> Prediction:
    total = preds[0]
    for p in preds[1:]:
        total = total + p
    return total
