"""A GPU deployment simulated: one replica of a model on a catalog GPU, TP-way, run by one engine's rules.

    server = GpuServer.of(spec, "h100", "vllm", weights="fp8", tp=1)
    result = server.run(poisson_trace(4.0, 1200, ...))         # or closed_trace(...) at a fixed concurrency
    summary = summarize(result.records, result.wall_s)

The engine (prefill.costmodel.engines) gives the profile, the layout, the KV cache's positions and the
scheduler's caps; prefill.plan.simulate drives the one step loop and Scheduler with them, each step timed by
timemodel.predict_step. Nothing of a policy or a formula is written here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from prefill.costmodel import costs, timemodel
from prefill.costmodel.engines import GPU_WEIGHTS, Engine, activation_dtype, get_engine, gpu_weights_help
from prefill.costmodel.hardware import Hardware, get_hardware
from prefill.costmodel.ops import Row
from prefill.costmodel.parallel import tp_head_split_problem
from prefill.costmodel.profile import MachineProfile
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput
from prefill.loadtest.client import PromptLengths
from prefill.plan.simulate import SimRequest, SimResult, simulate


@dataclass(frozen=True)
class GpuServer:
    """One replica: `spec` on `tp` GPUs `hw`, weights and K/V stored as `weights` and `kv`, run by `engine`."""

    spec: ModelSpec
    hw: Hardware
    engine: Engine
    weights: str
    kv: str
    tp: int
    profile: MachineProfile
    tokens: int  # positions the KV cache holds

    @classmethod
    def of(cls, spec: ModelSpec, hardware: str, engine: str, weights: str = "bfloat16", kv=None, tp: int = 1):
        """The replica, or BadInput when `tp` cannot split the heads or the weights leave no KV cache."""
        if hardware.lower() == "cpu":  # never probe this machine for a GPU deployment
            raise BadInput("--engine simulates a GPU; cpu is not a catalog GPU (try --hardware h100 or h200)")
        return cls.on(spec, get_hardware(hardware), get_engine(engine), weights, kv, tp)

    @classmethod
    def on(cls, spec: ModelSpec, hw: Hardware, eng: Engine, weights: str, kv: str | None, tp: int) -> GpuServer:
        """GpuServer.of with the hardware and the engine given as data (a refitted engine, say)."""
        problem = tp_head_split_problem(spec.H_q, spec.H_kv, tp)
        if problem is not None:
            raise BadInput(problem)
        w = costs.canonical_dtype(weights)
        if w not in GPU_WEIGHTS:
            raise BadInput(f"a GPU engine stores weights as {gpu_weights_help()}, not {w}")
        kv_dt = costs.canonical_dtype(kv) if kv else activation_dtype(w)
        if kv_dt in costs.FP4_WEIGHTS:
            raise BadInput(f"{kv_dt} is a weight format; the K/V cache is bfloat16, float16 or fp8")
        tokens = eng.kv_tokens(spec, hw, w, kv_dt, tp)
        if tokens <= 0:
            raise BadInput(f"{spec.name} in {w} does not fit {tp} x {hw.name} with room for a KV cache; raise --tp")
        return cls(spec, hw, eng, w, kv_dt, tp, eng.profile(hw, w), tokens)

    def with_engine(self, engine: Engine) -> GpuServer:
        """The same deployment run by `engine` (e.g. the same engine with refitted efficiencies)."""
        return GpuServer.on(self.spec, self.hw, engine, self.weights, self.kv, self.tp)

    @property
    def layout(self):
        return self.engine.layout(self.weights, self.kv, self.tp)

    @property
    def name(self) -> str:
        return (
            f"{self.spec.name} on {self.tp} x {self.hw.name}, {self.engine.name}, weights {self.weights}, "
            f"KV {self.kv} ({self.tokens:,} positions)"
        )

    @functools.cached_property
    def _steps(self) -> tuple[timemodel.StepModel, float]:
        """The time model of this deployment's steps (remembering each distinct operation's time), and the
        engine's CPU seconds per row."""
        return timemodel.StepModel(self.spec, self.profile, self.layout), self.engine.row_overhead()[1]

    def step_seconds(self, rows: list[Row]) -> float:
        """One step: the forward (the time model, the engine's step overhead in it) plus its CPU time per row."""
        model, per_row = self._steps
        return model.seconds(rows) + per_row * len(rows)

    def run(self, trace: Sequence[SimRequest], in_flight: int | None = None) -> SimResult:
        """The trace through the engine's scheduler caps and rules (see prefill.plan.simulate.simulate)."""
        e = self.engine
        return simulate(
            self.spec,
            trace,
            self.step_seconds,
            self.tokens,
            e.token_budget,
            e.max_seqs,
            in_flight=in_flight,
            rules=(e.decode_in_budget, e.mixed),
            window=e.scheduler_steps,
            prefill_cap=e.prefill_cap,
        )


def closed_trace(n: int, prompts: PromptLengths, outputs: PromptLengths, seed: int = 0) -> list[SimRequest]:
    """`n` requests all ready at 0 s: run with in_flight = C, a closed loop at concurrency C (AIPerf, genai-perf)
    or, without a cap, an offline batch (vLLM's benchmark_throughput, bench_serving at an infinite rate)."""
    import random

    rng = random.Random(seed)
    return [SimRequest(0.0, prompts.sample(rng), outputs.sample(rng)) for _ in range(n)]
