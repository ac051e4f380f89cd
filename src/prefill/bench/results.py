"""The sweep's inputs and results: what to measure (BenchConfig), one engine at one point (Measurement), and a
whole run with its machine (BenchResult); the engines' names and the parsing of the command's lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefill.bench import calibrate
from prefill.costmodel.costs import canonical_dtype
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput

DEFAULT_PROMPT_LENGTHS = (32, 128, 512, 1024, 2048, 4096)
DEFAULT_DTYPES = ("auto",)  # the dtypes native on this device (plan.default_dtypes)
OURS = "prefill"
OURS_COMPILED = "prefill-compiled"  # the same engine with its block functions through torch.compile
LLAMA_DENSE = "llamacpp-dense"  # llama.cpp on an F32 / BF16 GGUF of the same weights (like for like)
VERDICT_P = 512  # the prompt length whose eager-vs-compiled result `run --compile` follows
# Any fixed English text will do: attention and GEMM cost do not depend on which tokens they are.
PROMPT_TEXT = (
    "Prefill is the first phase of inference: the model reads every prompt token in one parallel pass, "
    "fills the key-value cache, and produces the logits of the first new token. "
)


@dataclass(frozen=True)
class BenchConfig:
    """What to sweep. `model` None means the embedded SmolLM2 GGUF."""

    model: str | None = None
    prompt_lengths: tuple[int, ...] = DEFAULT_PROMPT_LENGTHS
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    repeats: int = 5
    warmup: int = 1
    peers: tuple[str, ...] = ("transformers", "llamacpp")
    threads: int | None = None
    calibrate: bool = False
    calibrate_on: tuple[int, ...] | None = None  # default: the second-shortest and the longest P
    chunk_sizes: tuple[int, ...] = ()
    device: str = "cpu"
    compile: bool = False  # also measure ours with its per-block functions compiled (Engine.compile)
    force: bool = False  # measure an emulated dtype at every P, not just the smallest
    llama_dense: bool = True  # llama.cpp also on F32 / BF16 GGUFs of the same weights (prefill.bench.dense_gguf)
    weights: str = "auto"  # ours: the GGUF's blocks ("native"), dense, or the faster here (prefill.engine.weights)
    activations: str = "auto"  # the blocks' products: "f32", "q8", or auto (prefill.engine.weights.auto_path)


@dataclass(frozen=True)
class Measurement:
    """One engine at one (dtype, P, chunk size): seconds, rates and memory. FLOPs are ours for every engine."""

    engine: str
    dtype: str
    P: int
    chunk_size: int | None
    cold_s: float
    median_s: float
    p90_s: float
    samples_s: tuple[float, ...]
    tokens_per_s: float
    flops: float
    flops_per_s: float
    mfu: float | None  # against the GEMM rate measured in this run in `dtype`; None for llama.cpp's own types
    peak_bytes: int
    peak_delta_bytes: int
    memory_kind: str
    predicted_s: float  # the time model on this machine's profile (prefill.costmodel.timemodel)
    calibrated_s: float | None = None
    predicted_bound: str = ""  # what the time model says dominates: compute, memory or overhead


@dataclass(frozen=True)
class Crash:
    """A peer whose child process died: at which point (P None: while loading), why ("crashed (signal 11)"), and
    where its log is, with its tail."""

    engine: str
    dtype: str
    P: int | None
    reason: str
    log_path: str
    log: str

    def note(self) -> str:
        where = "while loading" if self.P is None else f"at P = {self.P}"
        tail = " | ".join(line for line in self.log.strip().splitlines()[-3:])
        return f"{self.engine} ({self.dtype}) {self.reason} {where}; the benchmark went on without it. Its log: " + (
            f"{self.log_path}, ending: {tail}" if tail else f"{self.log_path} (empty)"
        )


@dataclass
class BenchResult:
    """Everything one run measured, with the machine it ran on."""

    config: BenchConfig
    model: str
    spec: ModelSpec
    machine: dict[str, Any]
    gemm_flops_per_s: dict[str, float]
    measurements: list[Measurement] = field(default_factory=list)
    calibrations: dict[str, calibrate.CalibrationReport] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    crashes: list[Crash] = field(default_factory=list)

    def crash_of(self, engine: str, dtype: str, P: int) -> Crash | None:
        """The crash that left `engine` without a measurement at (dtype, P): its own at or before P."""
        dtypes = (dtype, "gguf")
        return next((c for c in self.crashes if c.engine == engine and c.dtype in dtypes and (c.P or 0) <= P), None)

    def find(self, engine: str, dtype: str, P: int, chunk_size: int | None = None) -> Measurement | None:
        """The measurement of `engine` at (dtype, P, chunk_size), or None."""
        for m in self.measurements:
            if (m.engine, m.dtype, m.P, m.chunk_size) == (engine, dtype, P, chunk_size):
                return m
        return None

    def speedup(self, peer: str, dtype: str, P: int) -> float | None:
        """Our tokens/s over the peer's at the same P (llama.cpp runs its own types: compared to any dtype)."""
        ours = self.find(OURS, dtype, P)
        theirs = self.find(peer, dtype, P) or self.find(peer, "gguf", P)
        if ours is None or theirs is None:
            return None
        return ours.tokens_per_s / theirs.tokens_per_s


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """'32,128,512' -> (32, 128, 512); BadInput on anything but positive integers."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BadInput(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise BadInput(f"{what} must be positive integers, got {text!r}")
    return values


def parse_dtypes(text: str) -> tuple[str, ...]:
    """'float32,bf16' -> ('float32', 'bfloat16'), each checked by the cost model's dtype table."""
    return tuple(canonical_dtype(x.strip()) for x in text.split(",") if x.strip())
