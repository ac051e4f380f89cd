"""One estimate of a prefill, built in one place: what `prefill estimate` prints and what the page's calculator shows.

Every number comes from `prefill.costmodel.costs`; this module only decides which formulas apply (the exact count
and the KV cache need a model's shapes, tensor parallelism T > 1, the calibrated time a calibration) and names the
results. Units: FLOPs, FLOP/s, seconds, bytes, bytes/s; intensities in FLOPs per byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefill.costmodel import costs, parallel, roofline, storage
from prefill.errors import BadInput

if TYPE_CHECKING:
    from prefill.costmodel.specs import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What to estimate: a prefill of P tokens (P >= 0) x B sequences on T GPUs, at a peak and an MFU.

    spec: the model's shapes (None: only N is known, so no exact count, KV cache or tensor parallelism); N: the
    parameters of the 2*N*P rule (default spec.N; the page lets a reader set it apart from the model's);
    bandwidth_bytes_per_s: memory bandwidth (the roofline); link_bytes_per_s: GPU-to-GPU bandwidth per direction
    (None: unknown); network_s, tokenize_s: the rest of TTFT; output_tokens and itl_s: a whole request's time.
    BadInput for a setting no estimate can have; the formulas refuse out-of-range values (ValueError)."""

    P: int
    spec: ModelSpec | None = None
    N: float | None = None
    B: int = 1
    dtype: str = "bfloat16"
    hardware: str = "custom"
    peak_flops_per_s: float
    mfu: float = 0.5
    bandwidth_bytes_per_s: float
    link_bytes_per_s: float | None = None
    T: int = 1
    network_s: float = 0.0
    tokenize_s: float = 0.0
    calibration: costs.Calibration | None = None
    output_tokens: int | None = None
    itl_s: float | None = None
    weights: tuple[str, str] | None = None  # how the projections and the embedding are stored (default: dtype)

    def __post_init__(self) -> None:
        if self.N is None and self.spec is None:
            raise BadInput("an estimate needs a model's shapes or a parameter count N")
        if self.P < 0 or self.B < 1 or self.T < 1:
            raise BadInput(f"an estimate needs P >= 0, B >= 1 and T >= 1; got P = {self.P}, B = {self.B}, T = {self.T}")
        if self.T > 1 and self.spec is None:
            raise BadInput("tensor parallelism (T > 1) needs the model's shapes, not only a parameter count N")
        if self.T > 1 and (problem := parallel.tp_head_split_problem(self.spec.H_q, self.spec.H_kv, self.T)):
            H_q, H_kv = self.spec.H_q, self.spec.H_kv
            fits = [t for t in range(1, H_q + 1) if not parallel.tp_head_split_problem(H_q, H_kv, t)]
            raise BadInput(
                f"tensor parallelism over T = {self.T} GPUs: {problem}, so the heads cannot be split evenly; "
                f"use T in {fits}"
            )

    def warnings(self) -> tuple[str, ...]:
        """What makes the estimate less than a real prefill: a P beyond the model's trained context."""
        if self.spec is not None and self.spec.context_length < self.P:
            return (
                f"P = {self.P} is beyond {self.spec.name}'s context length of {self.spec.context_length} tokens: "
                "the model cannot serve such a prompt (the figures extrapolate its shapes)",
            )
        return ()


@dataclass(frozen=True)
class TensorParallel:
    """The prefill split over T GPUs (heads, MLP columns, vocabulary), with two ring all-reduces per layer."""

    T: int
    flops_per_gpu: float
    allreduce_bytes_per_gpu: float  # sent (and received) by each GPU in the ring
    allreduce_s: float | None  # None: the link bandwidth is unknown, and prefill_s counts no all-reduce
    prefill_s: float  # each GPU's share at peak x MFU, plus the all-reduces, not overlapped
    kv_heads_per_gpu: int

    def to_dict(self) -> dict:
        return {
            "tp_flops_per_gpu": self.flops_per_gpu,
            "tp_allreduce_bytes_per_gpu": self.allreduce_bytes_per_gpu,
            "tp_allreduce_s": self.allreduce_s,
            "tp_prefill_s": self.prefill_s,
            "tp_kv_heads_per_gpu": self.kv_heads_per_gpu,
        }


@dataclass(frozen=True)
class TTFT:
    """Time to first token: network + tokenization + prefill (seconds)."""

    network_s: float
    tokenize_s: float
    prefill_s: float  # exact when the shapes are known, else 2*N*P; on T GPUs when tensor-parallel
    ttft_s: float

    def to_dict(self) -> dict:
        return {
            "network_s": self.network_s,
            "tokenize_s": self.tokenize_s,
            "prefill_s": self.prefill_s,
            "ttft_s": self.ttft_s,
        }


@dataclass(frozen=True)
class KVCache:
    """The K and V caches after the prefill: all B sequences, one token of them, one GPU's share (bytes)."""

    bytes: int
    bytes_per_token: int
    bytes_per_gpu: int

    def to_dict(self) -> dict:
        return {
            "kv_cache_bytes": self.bytes,
            "kv_bytes_per_token": self.bytes_per_token,
            "kv_cache_bytes_per_gpu": self.bytes_per_gpu,
        }


@dataclass(frozen=True)
class Roofline:
    """The prefill and one decode step against the ridge point (peak / bandwidth)."""

    bandwidth_bytes_per_s: float
    ridge_point: float
    prefill_intensity: float  # weight bytes only when no shapes are known
    prefill_bound: str
    prefill_attainable_flops_per_s: float
    decode_intensity: float
    decode_bound: str
    decode_attainable_flops_per_s: float
    compute_bound_from_P: int | None  # the shortest compute-bound prompt; None past any realistic P

    def to_dict(self) -> dict:
        return {
            "prefill_intensity": self.prefill_intensity,
            "decode_intensity": self.decode_intensity,
            "ridge_point": self.ridge_point,
            "prefill_bound": self.prefill_bound,
            "decode_bound": self.decode_bound,
            "compute_bound_from_P": self.compute_bound_from_P,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "prefill_attainable_flops_per_s": self.prefill_attainable_flops_per_s,
            "decode_attainable_flops_per_s": self.decode_attainable_flops_per_s,
        }


@dataclass(frozen=True)
class RequestTime:
    """A whole request of n output tokens: TTFT + (n - 1) * ITL, the decode rate 1/ITL, the output rate n/time."""

    ttft_s: float
    output_tokens: int
    itl_s: float
    request_s: float
    decode_rate: float  # tokens/s
    output_rate: float  # tokens/s, TTFT included

    def to_dict(self) -> dict:
        return {
            "output_tokens": self.output_tokens,
            "itl_s": self.itl_s,
            "request_s": self.request_s,
            "decode_rate": self.decode_rate,
            "output_rate": self.output_rate,
        }


def request_time(ttft_s: float, output_tokens: int, itl_s: float) -> RequestTime:
    """The time of a request of `output_tokens` tokens, the first at `ttft_s` seconds, the rest `itl_s` apart."""
    total = costs.request_seconds(ttft_s, output_tokens, itl_s)
    rates = costs.decode_rate(itl_s), costs.request_output_rate(output_tokens, total)
    return RequestTime(ttft_s, output_tokens, itl_s, total, *rates)


@dataclass(frozen=True)
class WeightStorage:
    """How the weights are stored and what that costs a decode step: it reads every weight once (bytes)."""

    projections: str  # a dtype or a GGUF type (Q4_1, ...)
    embedding: str
    bytes_per_weight: float  # of the projections
    weight_bytes: int  # all weights
    decode_weight_bytes: int  # read by one decode step
    decode_weight_floor_s: float  # decode_weight_bytes / bandwidth

    def to_dict(self) -> dict:
        return {
            "weights_storage": [self.projections, self.embedding],
            "bytes_per_weight": self.bytes_per_weight,
            "weight_bytes": self.weight_bytes,
            "decode_weight_bytes": self.decode_weight_bytes,
            "decode_weight_floor_s": self.decode_weight_floor_s,
        }


def weight_storage(spec: ModelSpec, projections: str, embedding: str, bandwidth_bytes_per_s: float) -> WeightStorage:
    """The weights' bytes when the projections are stored as `projections` and the embedding as `embedding`."""
    step = storage.decode_weight_bytes(spec, projections, embedding)
    return WeightStorage(
        projections,
        embedding,
        storage.bytes_per_weight(projections),
        storage.weight_bytes(spec, projections, embedding),
        step,
        step / bandwidth_bytes_per_s,
    )


@dataclass(frozen=True)
class Estimate:
    """The estimate of a `setting`: the seed's 2*N*P rule, the exact count, times, KV cache and roofline.

    N: the parameters the 2*N*P rule used; exact / prefill_s_exact / kv: None without shapes; tensor_parallel:
    None on one GPU; calibrated_prefill_s: from the calibration's measured rates (None without one or shapes);
    request: None unless output tokens and an ITL were given."""

    setting: Setting
    N: float
    dtype: str  # canonical name
    bytes_per_element: int
    achieved_flops_per_s: float  # peak x MFU
    flops_2NP: float
    prefill_s_2NP: float
    exact: costs.FlopCount | None
    prefill_s_exact: float | None
    calibrated_prefill_s: float | None
    tensor_parallel: TensorParallel | None
    ttft: TTFT
    kv: KVCache | None
    roofline: Roofline
    request: RequestTime | None
    weights: WeightStorage | None = None  # None without shapes

    @property
    def flops_exact_minus_2NP(self) -> float | None:
        """How far the rule of thumb is off (FLOPs; None without shapes)."""
        return self.exact.total - self.flops_2NP if self.exact else None

    def to_dict(self) -> dict:
        """Every figure as one JSON object (`prefill estimate --json`); the parts that do not apply left out."""
        s = self.setting
        r = {
            "model": s.spec.name if s.spec else None,
            "N": self.N,
            "P": s.P,
            "B": s.B,
            "dtype": self.dtype,
            "hardware": s.hardware,
            "peak_flops_per_s": s.peak_flops_per_s,
            "mfu": s.mfu,
            "tp": s.T,
            "achieved_flops_per_s": self.achieved_flops_per_s,
            "flops_2NP": self.flops_2NP,
            "prefill_s_2NP": self.prefill_s_2NP,
        }
        if self.exact:
            r |= {
                "flops_exact": self.exact.to_dict(),
                "flops_exact_minus_2NP": self.flops_exact_minus_2NP,
                "prefill_s_exact": self.prefill_s_exact,
            }
        r |= self.tensor_parallel.to_dict() if self.tensor_parallel else {}
        r |= self.ttft.to_dict() | {"calibrated_prefill_s": self.calibrated_prefill_s}
        r |= (self.kv.to_dict() if self.kv else {}) | self.roofline.to_dict()
        r |= self.weights.to_dict() if self.weights else {}
        r |= {"warnings": list(s.warnings())} if s.warnings() else {}
        return r | ({"request": self.request.to_dict()} if self.request else {})


def build_estimate(s: Setting) -> Estimate:
    """The estimate of a prefill in setting `s`: every number from prefill.costmodel.costs."""
    N = s.spec.N if s.N is None else s.N
    b = costs.dtype_bytes(s.dtype)
    exact = costs.prefill_flops_exact(s.spec, s.P, B=s.B) if s.spec else None
    prefill_s_2NP = costs.prefill_seconds(N, s.B * s.P, s.peak_flops_per_s, s.mfu)
    prefill_s_exact = costs.compute_seconds(exact.total, s.peak_flops_per_s, s.mfu) if exact else None
    tp = _tensor_parallel(s, b, exact) if s.T > 1 else None
    prefill_s = tp.prefill_s if tp else (prefill_s_2NP if exact is None else prefill_s_exact)
    ttft = TTFT(s.network_s, s.tokenize_s, prefill_s, costs.ttft_seconds(prefill_s, s.network_s, s.tokenize_s))
    has_request = s.output_tokens is not None and s.itl_s is not None
    return Estimate(
        setting=s,
        N=N,
        dtype=costs.canonical_dtype(s.dtype),
        bytes_per_element=b,
        achieved_flops_per_s=costs.achieved_flops_per_s(s.peak_flops_per_s, s.mfu),
        flops_2NP=costs.prefill_flops(N, s.B * s.P),
        prefill_s_2NP=prefill_s_2NP,
        exact=exact,
        prefill_s_exact=prefill_s_exact,
        calibrated_prefill_s=costs.calibrated_prefill_seconds(exact, s.calibration)
        if s.calibration and exact
        else None,
        tensor_parallel=tp,
        ttft=ttft,
        kv=_kv_cache(s, b) if s.spec else None,
        roofline=_roofline(s, b),
        request=request_time(ttft.ttft_s, s.output_tokens, s.itl_s) if has_request else None,
        weights=weight_storage(s.spec, *(s.weights or (s.dtype, s.dtype)), s.bandwidth_bytes_per_s) if s.spec else None,
    )


def _tensor_parallel(s: Setting, b: int, exact: costs.FlopCount) -> TensorParallel:
    payload = parallel.tp_allreduce_payload_bytes(s.spec, s.P, b, s.B)
    allreduce_s = parallel.tp_allreduce_seconds(payload, s.T, s.link_bytes_per_s) if s.link_bytes_per_s else None
    return TensorParallel(
        T=s.T,
        flops_per_gpu=parallel.tp_flops_per_gpu(exact.total, s.T),
        allreduce_bytes_per_gpu=parallel.ring_allreduce_bytes_per_gpu(payload, s.T),
        allreduce_s=allreduce_s,
        prefill_s=parallel.tp_prefill_seconds(exact.total, s.T, s.peak_flops_per_s, s.mfu, allreduce_s or 0.0),
        kv_heads_per_gpu=parallel.tp_kv_heads_per_gpu(s.spec.H_kv, s.T),
    )


def _kv_cache(s: Setting, b: int) -> KVCache:
    return KVCache(
        bytes=costs.kv_cache_bytes_for(s.spec, s.P, b, s.B),
        bytes_per_token=costs.kv_cache_bytes_for(s.spec, 1, b, s.B),
        bytes_per_gpu=parallel.tp_kv_cache_bytes_per_gpu(s.spec, s.P, b, s.T, s.B),
    )


def _roofline(s: Setting, b: int) -> Roofline:
    peak, bandwidth = s.peak_flops_per_s, s.bandwidth_bytes_per_s
    ridge = roofline.ridge_point(peak, bandwidth)
    prefill_i, decode_i = roofline.prefill_intensity(s.spec, s.P, b, s.B), roofline.decode_intensity(b)
    return Roofline(
        bandwidth_bytes_per_s=bandwidth,
        ridge_point=ridge,
        prefill_intensity=prefill_i,
        prefill_bound=roofline.bound(prefill_i, ridge),
        prefill_attainable_flops_per_s=roofline.attainable_flops_per_s(prefill_i, peak, bandwidth),
        decode_intensity=decode_i,
        decode_bound=roofline.bound(decode_i, ridge),
        decode_attainable_flops_per_s=roofline.attainable_flops_per_s(decode_i, peak, bandwidth),
        compute_bound_from_P=roofline.compute_bound_prompt_length(s.spec, b, ridge, s.B),
    )
