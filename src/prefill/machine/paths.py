"""The serving paths this engine can run a model on, and `auto`'s choice among them by the predicted time of a
typical request on this machine.

A path is data: how the linear weights are stored (the GGUF's own blocks, "native", or a dense dtype) and the
activation dtype the engine computes in. Its prediction is the one time model's (costmodel.timemodel) over a
MachineProfile probed on that path (prefill.machine.profiles: the GEMM curves timed on the path's own kernels,
"KxN:Q4_1" for blocks, attention and the elementwise work in its dtype) and the path's Layout (bytes per
weight as stored). So `auto` compares what each path would take here, end to end, not one GEMM's rate: a
GEMM probe alone picked dense bfloat16 on a Zen 4, 32 ms a decode step where native blocks took 6 ms.

    PATHS                                    the registry, in the order a tie goes (a new kernel path is an entry):
                                             native blocks with float32 activations, with 8-bit activations
                                             (Q4_0/Q4_1/Q8_0 blocks only: the K-quants' kernels take float32),
                                             dense bfloat16, dense float32
    path_blocker(path, ...)                  why this device cannot run a path natively ("" when it can)
    candidates(dtype, weights, ...)          the paths a request (auto or explicit parts) leaves open here
    asked(path, dtype, weights, activations) whether the options named the path's reduced precision
    gate_note(what, record)                  why auto leaves a reduced-precision path out ("" when it may weigh it)
    Workload.parse("P,n")                    the typical request: P prompt tokens, n tokens out
    predict_path(spec, path, workload, ...)  its TTFT, ITL and whole-request seconds (PathTime)
    choose_path(times, shut)                 the exact path unless a gated one is MIN_GAIN faster, and its line
    kv_candidates(dtype, cap)                the K/V dtypes --kv-dtype auto weighs (KV_AUTO)
    choose_kv(times, workload, shut)         the same rule over K/V dtypes, and its start-up line

The rule (issue 51): an explicit option is honoured; `auto` is exact (float32 activations, float32 K/V) unless a
reduced-precision path is predicted at least MIN_GAIN faster AND measured near-lossless on this model file
(prefill.machine.quality_gate). Speed never buys a different answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prefill.costmodel import storage, timemodel
from prefill.costmodel.costs import cache_dtype, canonical_dtype, request_seconds
from prefill.costmodel.specs import ModelSpec
from prefill.device.capability import Capability
from prefill.errors import BadInput
from prefill.machine.quality_gate import QualityRecord

NATIVE = "native"
TYPICAL_P, TYPICAL_N = 256, 128  # a typical request: a 256-token prompt, 128 tokens out


@dataclass(frozen=True)
class ServingPath:
    """One way to run a model: `weights` "native" (the GGUF's blocks) or a dense dtype, the activation `dtype`
    the engine computes in (float32 on native blocks), and on blocks the `activations` their products take
    (prefill.model.quant.activations: "f32" the reference, "q8" rounded to 8 bits per 32-block)."""

    weights: str
    dtype: str
    activations: str = "f32"
    only_asked: str = ""  # why auto never takes it unasked ("": auto may, where the gate admits it)

    @property
    def auto(self) -> bool:
        """Whether auto may take it (where the gate admits it); else only where the options name it."""
        return not self.only_asked

    @property
    def exact(self) -> bool:
        """Computes as the float32 reference does (float32 activations, blocks or their float32 decoding)."""
        return self.dtype == "float32" and self.activations == "f32"

    @property
    def reduced(self) -> str:
        """What rounds below float32 on this path, in words ("8-bit activations", "dense bfloat16"; "" exact)."""
        if self.activations == "q8":
            return "8-bit activations"
        return "" if self.exact else f"dense {self.dtype}"

    def key(self, kv: str | None = None) -> str:
        """The quality gate's name of this path with K/V stored as `kv` (None: as computed)."""
        return f"{self.weights}|{self.dtype}|{self.activations}|kv {cache_dtype(kv or self.dtype)}"

    def label(self, qtypes: Sequence[str] = ()) -> str:
        """In words: "native Q4_1/Q8_0 blocks, float32 activations" or "dense bfloat16 weights, bfloat16
        activations"."""
        if self.weights == NATIVE:
            from prefill.model.quant.activations import words

            return f"native {'/'.join(qtypes) or 'GGUF'} blocks, {words(self.activations, self.dtype)} activations"
        return f"dense {self.weights} weights, {self.dtype} activations"


# The registry: every path the engine can serve on, in the order a tie goes (fewest bytes first).
# A path auto takes must give one text alone, batched and after a prefix-cache hit (issue 51): two are run only
# where asked, whatever their quality record says. 8-bit activations: a 612-token stretch of the seed lesson
# changed its text on its own hit (Zen 4, native Q4_1 blocks, float32 K/V); dense bfloat16: issue 42's prompts.
CHANGES_ON_A_HIT = "its greedy text changes on a prefix-cache hit"
PATHS = (
    ServingPath(NATIVE, "float32"),
    ServingPath(NATIVE, "float32", "q8", only_asked=CHANGES_ON_A_HIT),
    ServingPath("bfloat16", "bfloat16", only_asked=CHANGES_ON_A_HIT),
    ServingPath("float32", "float32"),
)
# A reduced-precision path (or K/V dtype) is taken only where predicted to save this fraction of the exact one's
# time for the workload, and measured near-lossless on the file. At a 256-token prompt float16 K/V are a small
# part of what a step reads (predicted 3-5% faster on native blocks on the Zen 3), and a probe on a busy machine
# is a few percent noisy: a smaller margin would round for noise. At 4,096 tokens of context float16 K/V cut the
# ITL by a third.
MIN_GAIN = 0.10


# What --kv-dtype auto weighs for an engine computing in float32: float32 (the reference) and float16, llama.cpp's
# default cache type, where the CPU widens it in hardware (F16C). The pool rounds K/V once, where written, so a
# prefix-cache hit reads what the cold run read. q8_0 only when asked: the KV store does not take it.
KV_AUTO = ("float32", "float16")


def kv_candidates(dtype: str, cap: Capability) -> tuple[str, ...]:
    """The K/V dtypes --kv-dtype auto weighs for an engine computing in `dtype` on `cap`'s device: KV_AUTO for
    float32 on a CPU (float16 where it has F16C), in its order, else `dtype` alone (16-bit activations keep
    16-bit K/V; a GPU engine keeps its dtype)."""
    dtype = canonical_dtype(dtype)
    if cap.device != "cpu" or dtype != "float32":
        return (dtype,)
    return tuple(kv for kv in KV_AUTO if kv != "float16" or "f16c" in cap.flags)


def choose_kv(times: Sequence[tuple[str, float]], workload: Workload, shut: Sequence[str] = ()) -> tuple[str, str]:
    """The K/V dtype to store (`times`: (K/V dtype, predicted whole-request seconds) in KV_AUTO's order, of the
    reference and the dtypes the quality gate admits): the first (the reference) unless another saves MIN_GAIN
    of its time, then the fastest; and the start-up line that says which, why, and (`shut`: gate_note's)
    which K/V dtypes the gate left out."""
    if not times:
        raise ValueError("choose_kv needs at least one K/V dtype's prediction")
    reference = times[0][1]
    kv, seconds = min(times, key=lambda t: t[1] if t[1] <= (1 - MIN_GAIN) * reference else reference)
    others = "; ".join(f"{k} {s:.2f} s" for k, s in times if k != kv)
    line = f"kv-dtype auto: {kv} K/V, predicted {seconds:.2f} s for {workload}" + (f"; vs {others}" if others else "")
    if any(s < seconds for _, s in times):
        line += f" (under {MIN_GAIN:.0%} faster: K/V kept as {kv})"
    return kv, line + "".join(f" ({note})" for note in shut)


def path_blocker(path: ServingPath, quantized: Sequence[str], cap: Capability, kernels: bool) -> str:
    """Why `cap`'s device cannot run `path` natively ("" when it can): native blocks need a quantized file, the
    CPU, and the compiled kernels (native_blocker); a dense dtype needs hardware that multiplies it."""
    if path.weights == NATIVE and (blocker := native_blocker(quantized, cap.device, kernels)):
        return blocker
    from prefill.model.quant.activations import Q8_TYPES, runs_q8

    if not any(runs_q8(path.activations, t) for t in quantized) and path.activations == "q8":
        return f"8-bit activations cover {'/'.join(Q8_TYPES)} blocks; this file's {'/'.join(quantized)} take float32"
    if not cap.native(path.dtype):
        return f"{path.dtype} is emulated here ({cap.why(path.dtype)})"
    return ""


def native_blocker(quantized: Sequence[str], device: str, kernels: bool) -> str:
    """Why the GGUF's blocks cannot serve here ("" when they can): `quantized` the file's types with a kernel,
    `device` "cpu" or "cuda...", `kernels` whether the compiled kernels loaded."""
    if not quantized:
        return "the model file holds no quantized matrix with a kernel here (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K)"
    if not device.startswith("cpu"):
        return f"the quantized kernels run on the CPU, not {device}"
    if not kernels:
        return "the quantized kernels are not built (no C++ compiler)"
    return ""


def candidates(
    dtype: str,
    weights: str,
    quantized: Sequence[str],
    cap: Capability,
    kernels: bool,
    activations: str = "auto",
) -> list[ServingPath]:
    """The registry's paths that `dtype` ("auto" or a dtype), `weights` ("auto", "native" or a dense dtype) and
    `activations` ("auto", or "f32" / "q8": native blocks on that path only, PREFILL_ACTIVATIONS) leave open and
    that run natively here, in the registry's order. An explicit `dtype` means those activations: float32 is
    float32 activations (8-bit ones only where `activations` says q8). The quality gate is the caller's
    (auto_path weighs a reduced-precision path only where asked() or gate_note() says it may)."""
    want_dtype = None if dtype.lower() == "auto" else canonical_dtype(dtype)
    want_weights = None if weights.lower() == "auto" else weights.lower()
    acts = "f32" if activations == "auto" and want_dtype is not None else activations
    return [
        p
        for p in PATHS
        if want_dtype in (None, p.dtype)
        and want_weights in (None, p.weights)
        and acts in ("auto", p.activations)
        and not path_blocker(p, quantized, cap, kernels)
    ]


def asked(path: ServingPath, dtype: str, weights: str, activations: str = "auto") -> bool:
    """Whether the options named `path`'s reduced precision themselves (an explicit option is honoured without
    the gate): `activations` q8 for 8-bit activations, a 16-bit `dtype` or `weights` for a dense 16-bit path."""
    if path.exact:
        return True
    if path.activations == "q8":
        return activations == "q8"
    named = {dtype.lower(), weights.lower()} - {"auto"}
    return any(canonical_dtype(n) == path.dtype for n in named if n != NATIVE)


def gate_note(what: str, record: QualityRecord | None, path: ServingPath | None = None) -> str:
    """Why `auto` leaves out the reduced precision `what` ("8-bit activations", "float16 K/V") on this file, in
    words, from its quality record (None: never measured); "" where the record passes the gate. A `path` auto
    never takes unasked (ServingPath.auto) is left out whatever its record."""
    if path is not None and not path.auto:
        return f"{what} only where asked: {path.only_asked}"
    if record is None:
        return f"{what} not measured near-lossless on this file; `prefill verify --quality` measures it"
    if broken := record.failures():
        return f"{what} not near-lossless on this file: {'; '.join(broken)}"
    return ""


@dataclass(frozen=True)
class Workload:
    """The request `auto` optimises for: P prompt tokens, then n tokens out."""

    P: int = TYPICAL_P
    n: int = TYPICAL_N

    @classmethod
    def parse(cls, text: str | None) -> Workload:
        """ "P,n" (e.g. "256,128"), or the typical request for None; BadInput on anything else."""
        if text is None:
            return cls()
        try:
            P, n = (int(part) for part in text.split(","))
        except ValueError:
            raise BadInput(f"--workload must be P,n (prompt tokens, tokens out), e.g. 256,128; got {text!r}") from None
        if P < 1 or n < 1:
            raise BadInput(f"--workload needs P >= 1 and n >= 1, got {text!r}")
        return cls(P, n)

    def __str__(self) -> str:
        return f"P = {self.P} + {self.n} out"


@dataclass(frozen=True)
class PathTime:
    """A path's predicted TTFT and ITL (seconds) for `workload` on this machine, and its label."""

    path: ServingPath
    label: str
    ttft_s: float
    itl_s: float
    workload: Workload

    @property
    def total_s(self) -> float:
        """The whole request: TTFT + (n - 1) ITL."""
        return request_seconds(self.ttft_s, self.workload.n, self.itl_s)

    def text(self) -> str:
        return f"{self.label} {self.total_s:.2f} s (TTFT {self.ttft_s * 1e3:.0f} ms, ITL {self.itl_s * 1e3:.1f} ms)"


def path_qtypes(path: ServingPath, qtypes: dict[str, str]) -> dict[str, str]:
    """ "KxN" -> the probe's name of the kernel `path` runs at that shape: the GGUF type ("Q4_1"), with ":q8"
    where the products take 8-bit activations ("Q4_1:q8", probed on those kernels); {} for dense weights."""
    from prefill.model.quant.activations import kernel_name

    if path.weights != NATIVE:
        return {}
    return {shape: kernel_name(t, path.activations) for shape, t in qtypes.items()}


def path_layout(path: ServingPath, qtypes: dict[str, str]) -> timemodel.Layout:
    """The Layout of an engine on `path`: the weights' bytes as stored (blocks: the widest projection's type's
    bits / 8), K/V read in place in the pool; `qtypes`: "KxN" -> GGUF type of the weights kept as blocks (a
    ":q8" kernel suffix is no part of the bytes)."""
    if path.weights != NATIVE:
        return timemodel.layout_for(path.dtype, path.weights, gathers_kv=False)
    from prefill.model.quant.weight import DENSE_MIN_M  # where the blocks' fused operators give way to float32

    qtype = next(iter(qtypes.values())).split(":")[0]  # the fused Q/K/V projection's, as Engine.layout reads it
    wb = storage.bytes_per_weight(qtype)
    return timemodel.layout_for(path.dtype, wb, gathers_kv=False, fused_below=DENSE_MIN_M)


def predict_path(
    spec: ModelSpec,
    path: ServingPath,
    workload: Workload,
    qtypes: dict[str, str],
    device: str = "cpu",
    threads: int | None = None,
    echo: Callable[[str], None] | None = None,
) -> PathTime:
    """`path`'s predicted TTFT (one prefill of P tokens) and ITL (a decode step at the middle context P + n / 2)
    on this machine's profile for that path (probed on first need: a few seconds, said to `echo`)."""
    from prefill.machine.profiles import profile_for

    blocks = path_qtypes(path, qtypes)
    profile = profile_for(spec, path.dtype, device, threads, echo=echo, qtypes=blocks)
    layout = path_layout(path, blocks)
    ttft = timemodel.predict_prefill(spec, workload.P, profile, layout).seconds
    itl = timemodel.predict_decode(spec, [workload.P + workload.n // 2], profile, layout).seconds
    label = path.label(tuple(dict.fromkeys(t.split(":")[0] for t in blocks.values())))
    return PathTime(path, label, ttft, itl, workload)


def choose_path(times: Sequence[PathTime], shut: Sequence[str] = ()) -> tuple[PathTime, str]:
    """The path `auto` serves on among `times` (the exact paths, and the reduced-precision ones the options
    named or the quality gate admits): the fastest exact path (the registry's order breaks a tie), unless a
    reduced-precision one is predicted MIN_GAIN faster than it; and the line that says which, the predictions that
    decided it, and (`shut`: gate_note's) what the gate left out."""
    if not times:
        raise ValueError("choose_path needs at least one path's prediction")
    exact = [t for t in times if t.path.exact]
    best = min(exact or times, key=lambda t: t.total_s)
    reduced = [t for t in times if not t.path.exact]
    fast = min(reduced, key=lambda t: t.total_s) if reduced and exact else None
    if fast is not None and fast.total_s <= (1 - MIN_GAIN) * best.total_s:
        best = fast
    others = "; ".join(t.text() for t in times if t is not best)
    line = f"path auto: {best.label}, predicted {best.text().removeprefix(best.label + ' ')} for {best.workload}"
    line += f"; vs {others}" if others else ""
    if fast is not None and best is not fast and fast.total_s < best.total_s:
        line += f" (under {MIN_GAIN:.0%} faster: {fast.path.reduced} not taken)"
    return best, line + "".join(f" ({note})" for note in shut)


def exact_line(label: str, shut: Sequence[str]) -> str:
    """The start-up line where the gate left `auto` one path, the exact one `label`: which, and why."""
    return f"path auto: {label}" + "".join(f" ({note})" for note in shut)
