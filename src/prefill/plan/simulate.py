"""A loaded server, simulated: the real step loop on a simulated clock, each step timed by the time model.

    trace = poisson_trace(rate=2.0, n=200, prompt_lengths=PromptLengths(64, 512), output_tokens=64)
    result = simulate(spec, trace, step_seconds, pool_tokens=65_536, chunk_size=256, max_running=32)
    summary = prefill.loadtest.report.summarize(result.records, result.wall_s)

Nothing of the policy is written here. The StepLoop and its Scheduler (admission first come first served, the
decode-first token budget, prefill chunks, one batched forward per step, the KV pool's blocks allocated as tokens
arrive, preemption) run as they do in `prefill serve`; only the runner is replaced: SimRunner advances each
sequence as a forward would and moves the clock by `step_seconds(rows)` (prefill.costmodel.timemodel.predict_step
on a machine profile) instead of computing. Requests that arrive during a step are admitted at the next step, as
the server's worker admits them. The K/V pool lives on torch's meta device: its blocks are counted, not stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from prefill.costmodel.specs import ModelSpec
from prefill.engine.kvcache import KVPool
from prefill.engine.loop import StepLoop
from prefill.engine.request import Generation, Request, TokenEvent
from prefill.engine.sampling import SamplingParams
from prefill.errors import BadInput
from prefill.loadtest.client import PromptLengths, RequestRecord
from prefill.loadtest.server_calibration import ServingCalibration
from prefill.plan.sim_runner import SimClock, SimRunner, StepSeconds


@dataclass(frozen=True, order=True)
class SimRequest:
    """One request of a trace: when it arrives (seconds from the start), its prompt and output tokens."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def poisson_trace(
    rate: float, n: int, prompt_lengths: PromptLengths, output_tokens: int | PromptLengths, seed: int = 0
) -> list[SimRequest]:
    """`n` requests arriving as a Poisson process of `rate` requests/s (exponential gaps), lengths drawn from
    `prompt_lengths` and `output_tokens` (a fixed count or lengths like the prompts')."""
    if rate <= 0 or n < 1:
        raise BadInput(f"a trace needs rate > 0 and n >= 1, got rate = {rate}, n = {n}")
    rng, t, out = random.Random(seed), 0.0, []
    outputs = output_tokens if isinstance(output_tokens, PromptLengths) else PromptLengths(output_tokens, output_tokens)
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(SimRequest(t, prompt_lengths.sample(rng), outputs.sample(rng)))
    return out


def trace_of(records: Sequence[RequestRecord]) -> list[SimRequest]:
    """The trace a load test sent (its successful requests: start, prompt and output tokens as the server counted
    them), to simulate the same load. A fixed-concurrency test is replayed open-loop at its measured starts."""
    return [
        SimRequest(r.start, r.usage_prompt_tokens, r.n_out)
        for r in records
        if r.ok and r.usage_prompt_tokens and r.n_out >= 1
    ]


@dataclass
class SimResult:
    """What the simulated server did: each request as a load-test client would record it, the simulated wall
    time, each step's rows (new tokens, past) and the preemptions."""

    records: list[RequestRecord]
    wall_s: float
    steps: list[list[tuple[int, int]]]
    preemptions: int


def simulate(
    spec: ModelSpec,
    trace: Sequence[SimRequest],
    step_seconds: StepSeconds,
    pool_tokens: int,
    chunk_size: int | None = 256,
    max_running: int = 32,
    model=None,
    in_flight: int | None = None,
    latency_s: float = 0.0,
    intake_s: float = 0.0,
    rules: tuple[bool, bool] = (False, True),
    window: int = 1,
    prefill_cap: int | None = None,
) -> SimResult:
    """Run `trace` through the step loop of a server with a KV pool of `pool_tokens` positions; every request
    generates exactly its output tokens (as loadtest --ignore-eos asks). `model`: a ModelRunner to run each
    step for real (its K/V pool then real too), timed all the same by `step_seconds`. `in_flight`: the client
    keeps at most this many requests at the server, the others waiting on its side in arrival order, as
    `prefill loadtest --rate R --concurrency C` does (a request's times still count from its arrival).
    `latency_s`: each request reaches the step loop this long after it is sent, and its first token the client
    as much later, in all (HTTP, tokenizing, the first chunk out: ServerModel.latency_s). `intake_s`: a request
    that arrives while the loop is busy makes its time longer by this (its HTTP and tokenizing take a core from
    the forward's threads), charged to the next step: the same for its TTFT and the others' tokens, one step
    on. `rules`: a GPU engine's (decode_in_budget, mixed) for the Scheduler (prefill.costmodel.engines.Engine);
    the default is our server's. A trace whose arrivals are all 0 under `in_flight` is a closed loop (a
    benchmark at fixed concurrency): each request's times count from when the client sends it. `window`: decode
    steps one scheduling decision runs (multi-step scheduling): requests that reach the loop during such a
    window join it when the window ends (or after a step with prefill work, which ends one). `prefill_cap`: at
    most this many of one request's prompt tokens a step (vLLM's --long-prefill-token-threshold)."""
    loop, runner, clock = _step_loop(spec, step_seconds, pool_tokens, (chunk_size, max_running, prefill_cap), model)
    loop.scheduler.decode_in_budget, loop.scheduler.mixed = rules
    pending = sorted(trace)
    closed = in_flight is not None and all(r.arrival_s == 0 for r in pending)
    records = [RequestRecord(i, r.prompt_tokens, r.arrival_s) for i, r in enumerate(pending)]
    i = 0  # requests sent to the server so far, in arrival order
    sent: list[RequestRecord] = []  # with a client cap: the sent requests not yet seen to end

    def room() -> bool:
        if in_flight is None:
            return True
        sent[:] = [r for r in sent if r.end is None and r.error is None]  # at most in_flight long
        return len(sent) < in_flight

    windows = _Windows(window)
    with _no_cyclic_gc():  # thousands of steps, each making short-lived objects
        while i < len(pending) or loop.busy:
            if not loop.busy and clock.now < pending[i].arrival_s + latency_s:
                clock.now = pending[i].arrival_s + latency_s  # idle until the next request reaches the loop
            busy, opened = loop.busy, windows.open(loop.busy)
            while opened and i < len(pending) and pending[i].arrival_s + latency_s <= clock.now and room():
                records[i].start = clock.now if closed else records[i].start
                loop.add(_request(pending[i], records[i], spec, clock.now))
                runner.owed_s += intake_s if busy else 0.0
                if in_flight is not None:
                    sent.append(records[i])
                i += 1
            windows.ran(loop.step(), opened)
    wall = max((r.end or 0.0) for r in records) if records else 0.0
    return SimResult(records, wall, runner.steps, loop.scheduler.preemptions)


def _step_loop(spec: ModelSpec, step_seconds: StepSeconds, pool_tokens: int, caps: tuple, model):
    """The real StepLoop over a SimRunner on a simulated clock, its K/V pool on the meta device (a model's own
    where one runs); caps: (chunk size, max running, prefill cap)."""
    chunk_size, max_running, prefill_cap = caps
    clock = SimClock()
    runner = SimRunner(spec, step_seconds, clock, model)
    where = ("meta", torch.float32) if model is None else (model.device, model.kv_dtype)
    pool = KVPool.for_tokens(spec, pool_tokens, where[1], where[0])
    loop = StepLoop(runner, pool, None, chunk_size, max_running, clock=clock)
    loop.scheduler.prefill_cap = prefill_cap
    return loop, runner, clock


class _Windows:
    """Multi-step scheduling (vLLM 0.6's --num-scheduler-steps): the scheduler takes new requests once a window of
    `steps` decode steps has run, or after a step with prefill work (which runs alone and ends one), or idle."""

    def __init__(self, steps: int) -> None:
        self.steps = self.since = steps  # decode steps since it last took requests (a full window: it takes them)

    def open(self, busy: bool) -> bool:
        return self.since >= self.steps or not busy

    def ran(self, step, opened: bool) -> None:
        if self.steps > 1:  # every row one token: a decode step, counted in the window
            decoded = bool(step.rows) and all(n == 1 for _, n in step.rows)
            self.since = (0 if opened else self.since) + 1 if decoded else self.steps


@contextlib.contextmanager
def _no_cyclic_gc():
    """Python's cycle collector off for the block, then one collection of the youngest generation: reference
    counting frees what a step makes as it goes, and the collections it skipped (each scanning every live
    request, record and event) took a sixth of a 3,000-request simulation's time. With the collector off,
    everything the block made stays in that generation, so collecting it alone finds the block's cycles
    without scanning the whole heap: a full collection, with torch and a model loaded, took 0.5 s after each
    of a fit's 46 simulations of 6 requests, 23 s of its 27."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        gc.collect(0)


def _request(r: SimRequest, record: RequestRecord, spec: ModelSpec, sent_s: float) -> Request:
    """The trace's request as the loop takes it at `sent_s` (its arrival, or later when the client held it),
    its events written into `record` (times from the start)."""
    if r.prompt_tokens < 1 or r.output_tokens < 1:
        raise BadInput(f"a simulated request needs prompt and output tokens >= 1, got {r}")

    def emit(event) -> None:
        if isinstance(event, TokenEvent):
            t = sent_s + event.t
            record.first_content = t if record.first_content is None else record.first_content
            record.chunk_times.append(t)
            record.n_chunks += 1
        elif isinstance(event, Generation):
            record.end, record.finish_reason = sent_s + event.total_s, event.finish_reason
            record.usage_completion_tokens, record.usage_prompt_tokens = len(event.token_ids), event.P
        else:  # Failed
            record.error = getattr(event, "message", "failed")

    ids = [1 + k % (spec.vocab_size - 1) for k in range(r.prompt_tokens)]
    return Request(ids, r.output_tokens, SamplingParams(), None, emit, arrival=sent_s, ignore_eos=True)


def time_model_steps(spec: ModelSpec, profile, layout) -> StepSeconds:
    """Each step's seconds as the time model predicts them (timemodel.predict_step) on `profile` and `layout`,
    each distinct operation but attention timed once (timemodel.StepModel)."""
    from prefill.costmodel import timemodel

    return timemodel.StepModel(spec, profile, layout).seconds


@dataclass
class ServerModel:
    """What a simulation of a server needs, resolved once: the model's spec, the machine profile and the layout
    its engine runs, the KV pool's tokens, the step loop's own seconds per step beyond the forward (a + b R for
    R rows: scheduling, sampling, detokenizing; zero unless measured), the serving process's own time beyond
    both (prefill.loadtest.server_calibration: HTTP, the event loop; none unless timed on the server) and, on a CPU,
    how to probe it again."""

    spec: ModelSpec
    profile: object  # MachineProfile
    layout: object  # Layout
    tokens: int
    label: str  # "(float32, weights Q4_1, KV pool 43,690 tokens)"
    qtypes: dict | None = None  # on a CPU: "KxN" -> GGUF type of the weights kept as blocks; None elsewhere
    loop_s: tuple[float, float] = (0.0, 0.0)
    serving: ServingCalibration = ServingCalibration()  # the server's own time, timed on it (none: zero)
    kv_dtype: str | None = None  # what its pool stores K/V as (None: the dtype); a CPU probe times attention so

    @property
    def name(self) -> str:
        return f"{self.spec.name} on {self.profile.name} {self.label}"

    def probe(self) -> dict:
        """One fresh quick probe of this machine at the model's shapes and kernels (a few seconds): a load test
        probes before and after its run, so the prediction sees the minutes it ran in."""
        from prefill.machine.profiles import measure_entry

        if self.qtypes is None:
            raise BadInput("only this machine (--hardware cpu) is probed")
        return measure_entry(self.spec, self.profile.dtype, "cpu", qtypes=self.qtypes, kv_dtype=self.kv_dtype)

    def with_probes(self, entries: list[dict]) -> ServerModel:
        """This model on the profile of `entries` (their point-wise medians; a saved fit applies as before)."""
        from prefill.machine.entries import median_entry
        from prefill.machine.profiles import profile_of

        entry = median_entry(entries)
        entry["measured"] = f"the run's minutes ({len(entries)} probes around it)"
        profile = profile_of(entry, self.spec, self.profile.dtype, "cpu", self.qtypes, True, kv_dtype=self.kv_dtype)
        return dataclasses.replace(self, profile=profile)

    def steps(self) -> StepSeconds:
        """Each step's seconds: the time model's forward, and the loop's own work for its rows."""
        forward, (a, b), own = time_model_steps(self.spec, self.profile, self.layout), self.loop_s, self.serving
        return lambda rows: own.forward_seconds(forward, rows) + a + b * len(rows) + own.own_seconds(len(rows))

    def with_serving(self, runs) -> ServerModel:
        """This model with the server's own time timed on it: `runs`, records of server_calibration.timed_requests
        before and after a load (server_calibration.calibrate)."""
        from prefill.loadtest.server_calibration import calibrate

        forward = time_model_steps(self.spec, self.profile, self.layout)
        bare = dataclasses.replace(self, serving=ServingCalibration()).steps()
        return dataclasses.replace(self, serving=calibrate(forward, bare, runs))


def server_model(
    model: str | None,
    hardware: str,
    dtype: str | None,
    weights: str | None,
    kv_cache_mb: float,
    echo: Callable[[str], None] | None = None,
    activations: str | None = None,
    kv_dtype: str | None = None,
) -> ServerModel:
    """A server of `model` (a preset, a file, or None: the embedded SmolLM2) on `hardware`: "cpu" runs this
    machine's profile (probed once and cached, prefill.machine.profiles) and measures the step loop's own work
    per step (prefill.plan.loop_overhead), a catalog GPU its datasheet profile. `weights`: a dtype or GGUF type,
    "native" (the file's blocks, as the engine runs them), "auto" (what `prefill serve` picks here) or None (the
    dtype). Attention reads K/V in place, as the engine does, stored as `kv_dtype` (None: the dtype); the blocks'
    products take `activations` ("f32" / "q8"; None: the engine's default), as the served engine's did."""
    from prefill.costmodel import costs, storage, timemodel
    from prefill.costmodel.profile import catalog_profile
    from prefill.costmodel.specs import load_spec
    from prefill.loading.resolve import default_model_path
    from prefill.machine.profiles import get_hardware

    if kv_cache_mb <= 0:
        raise BadInput(f"--kv-cache-mb must be > 0, got {kv_cache_mb}")
    spec = load_spec(model if model is not None else default_model_path())
    on_cpu = hardware.lower() == "cpu"
    dt = costs.canonical_dtype(dtype or ("float32" if on_cpu else "bfloat16"))
    served = on_cpu and weights is not None and weights.lower() in ("auto", "native")  # as `prefill serve` runs it
    weights = _stored_as(weights, model, dt, on_cpu)
    qtypes, tokenizer = ({} if on_cpu else None), None
    if served and weights in storage.GGUF_BLOCKS:  # the file's own blocks: as the server's engine runs them
        from prefill.engine.llm import Engine

        how = {"activations": activations, "kv_dtype": kv_dtype}
        engine = Engine.load(model, dtype=dt, weights="native", progress=False, **how)
        profile, layout = engine.profile(echo=echo), engine.layout()  # its kernels' curves, its fused decode
        qtypes, tokenizer = engine.weight_types(), engine.tokenizer
    else:
        if on_cpu:
            from prefill.machine.profiles import profile_for

            profile = profile_for(spec, dt, "cpu", echo=echo, kv_dtype=kv_dtype)
        else:
            profile = catalog_profile(get_hardware(hardware), dt)
        wb = storage.bytes_per_weight(weights) if weights else None
        layout = timemodel.layout_for(dt, wb, gathers_kv=False, kv=kv_dtype)
    kv = costs.cache_dtype(kv_dtype or dt)
    tokens = int(kv_cache_mb * 2**20 // costs.kv_cache_bytes_for(spec, 1, costs.kv_bytes_per_element(kv)))
    label = f"({dt}, weights {weights or dt}, {kv} K/V, KV pool {tokens:,} tokens)"
    loop_s = (0.0, 0.0)
    if on_cpu:
        from prefill.plan.loop_overhead import loop_overhead

        loop_s = loop_overhead(spec, tokenizer)
    return ServerModel(spec, profile, layout, tokens, label, qtypes, loop_s, kv_dtype=kv_dtype)


def simulate_server(
    model: str | None,
    hardware: str,
    dtype: str | None,
    weights: str | None,
    trace: Sequence[SimRequest],
    chunk_size: int,
    max_running: int,
    kv_cache_mb: float,
    echo: Callable[[str], None] | None = None,
    in_flight: int | None = None,
) -> tuple[SimResult, str]:
    """simulate() of `trace` on server_model(model, hardware, dtype, weights, kv_cache_mb). Returns the result
    and a one-line name of what was simulated."""
    server = server_model(model, hardware, dtype, weights, kv_cache_mb, echo)
    result = simulate(server.spec, trace, server.steps(), server.tokens, chunk_size, max_running, in_flight=in_flight)
    return result, server.name


def _stored_as(weights: str | None, model: str | None, dtype: str, on_cpu: bool) -> str | None:
    """The weights' storage for the time model: "native" is the GGUF's projection type, and "auto" resolves as
    `prefill serve` does (that type when it would run the blocks native, else the dtype)."""
    if weights is None or weights.lower() not in ("auto", "native"):
        return weights
    if not on_cpu:
        return None
    from prefill.costmodel import storage
    from prefill.engine.weights import resolve_weights
    from prefill.loading.resolve import default_model_path

    path = model if model is not None else default_model_path()
    if weights.lower() == "auto" and resolve_weights("auto", path, dtype, "cpu", echo=None) != "native":
        return None
    return storage.gguf_file_storage(path)[0]
