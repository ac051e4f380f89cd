"""A machine profile: the numbers the per-operation time model needs, measured here or taken from a datasheet.

    GemmCurve          FLOP/s of [M, K] x [K, N] at one (K, N), as a function of the row count M
    MachineProfile     GEMM curves, attention rates, bandwidth, per-operation overhead, and the efficiencies
    catalog_profile()  the same for a catalog GPU: datasheet peaks and bandwidth times stated efficiencies

Torch-free. The probe that measures a profile lives in prefill.machine.probe; the time model that reads one in
prefill.costmodel.timemodel; the fit that adjusts one to measurements in prefill.costmodel.fit.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from dataclasses import dataclass

from prefill.costmodel.costs import canonical_dtype
from prefill.costmodel.hardware import Hardware
from prefill.errors import BadInput


def _interpolate(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise log-log interpolation of (x, y) points ascending in x; beyond the last point y stays flat, below
    the first it falls in proportion to x (a kernel too small to fill the machine takes a constant time)."""
    xs = [p[0] for p in points]
    if x >= xs[-1]:
        return points[-1][1]
    if x <= xs[0]:
        return points[0][1] * x / xs[0]
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return points[i][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    f = math.log(x / x0) / math.log(x1 / x0)
    return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))


def shape_key(K: int, N: int) -> str:
    """A GEMM shape's name, "KxN": the key of a profile's GEMM curves and of Engine.weight_types."""
    return f"{K}x{N}"


@dataclass(frozen=True)
class GemmCurve:
    """FLOP/s of [M, K] x [K, N] (weights hot in cache: the compute side of the roofline) at measured row counts.

    points: (M, FLOP/s) with M ascending; rate(M) interpolates log-log between them (see _interpolate).
    """

    K: int
    N: int
    points: tuple[tuple[int, float], ...]

    def rate(self, M: float) -> float:
        """FLOP/s at M rows."""
        return _interpolate(self.points, M)

    @property
    def key(self) -> str:
        return shape_key(self.K, self.N)


# Stated efficiencies of a catalog GPU (fractions of the datasheet's dense peak and bandwidth), for eager PyTorch:
# cuBLAS reaches 70-80% of the dense bf16 peak on large GEMMs (the square 8192 GEMM of docs/gpu-h200.json: 80%);
# FlashAttention-2-class kernels reach about 35% of it on Hopper (FA2 paper and FA3's comparison: ~350 of 989
# TFLOP/s causal forward at d_head 128); a streaming kernel gets about 80% of HBM's datasheet bandwidth; a kernel
# launch costs about 5 us of GPU time when the CPU runs ahead. The GEMM tile (128 x 256) sets wave quantization.
GPU_EFFICIENCY = {"gemm": 0.75, "attention": 0.35, "bandwidth": 0.80}
GPU_LAUNCH_S = 5e-6
GPU_TILE = (128, 256)


@dataclass(frozen=True)
class MachineProfile:
    """What one device does, for one dtype and thread count, in the units the time model reads.

    gemm: measured curves at the model's own shapes (empty for a catalog GPU: peak x efficiency x waves instead);
    peak_flops_per_s: the best GEMM rate measured (or the datasheet's dense peak for a catalog GPU);
    attention: (prompt length P, FLOP/s) of causal attention, ascending; attention_decode: (keys S, FLOP/s) of one
    decode query (both empty for a catalog GPU: peak x attention efficiency);
    bandwidth_bytes_per_s: streaming reads from memory (weights, K/V); cache_bytes and cache_bandwidth_bytes_per_s:
    working sets that fit the last-level cache move at that rate instead; op_overhead_s: seconds per kernel
    launch / dispatch; step_overhead_s: fixed seconds per forward (Python around the kernels; 0 unless fitted);
    overlap_launches: True where launches overlap the kernels (a GPU: an op takes max(work, launch)), False where
    dispatch runs before the work on the same cores (a CPU: it adds); gemm_efficiency, attention_efficiency:
    multipliers on the measured or datasheet rates (1.0 for a probe; stated for a GPU; fitted by the fit);
    compute_units: SMs for wave quantization (None on a CPU); link_bytes_per_s: GPU-to-GPU bandwidth per direction;
    kind: where the numbers come from: "probe" (measured here), "fitted" (then fitted to measured forwards) or
    "catalog" (a datasheet and stated efficiencies).
    A GPU engine's serving path adds (the defaults leave a CPU's predictions as they were):
    gemm_half_m: a catalog GPU's GEMM efficiency curve by M, M / (M + gemm_half_m) of the large-M rate (0: flat);
    link_latency_s: seconds of one all-reduce beyond its bytes over the link; graph_tokens: a step of at most this
    many tokens replays a CUDA graph (decode rows only, or any step when graph_mixed), costing graph_launch_s
    once instead of a launch per kernel (0: every step launches eagerly); attention_flops_per_s: the attention
    kernel's peak where it differs from the GEMMs' (FP8 GEMMs, BF16 attention); kernel_floor_s: the shortest a
    kernel takes on the GPU however little its work (0: none).
    """

    name: str
    dtype: str
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    op_overhead_s: float
    source: str
    gemm: tuple[GemmCurve, ...] = ()
    attention: tuple[tuple[int, float], ...] = ()
    attention_decode: tuple[tuple[int, float], ...] = ()
    cache_bytes: float = 0.0
    cache_bandwidth_bytes_per_s: float | None = None
    step_overhead_s: float = 0.0
    overlap_launches: bool = False
    gemm_efficiency: float = 1.0
    attention_efficiency: float = 1.0
    compute_units: int | None = None
    link_bytes_per_s: float | None = None
    threads: int | None = None
    kind: str = "probe"
    gemm_half_m: float = 0.0
    link_latency_s: float = 0.0
    graph_tokens: int = 0
    graph_mixed: bool = False
    graph_launch_s: float = 0.0
    attention_flops_per_s: float | None = None
    kernel_floor_s: float = 0.0

    def gemm_rate(self, M: float, K: int, N: int) -> float:
        """FLOP/s of [M, K] x [K, N]: the measured curve of this shape (else of the nearest shape by K x N), or a
        catalog GPU's peak with wave quantization; times gemm_efficiency."""
        if self.gemm:
            return self._curve(K, N).rate(M) * self.gemm_efficiency
        by_m = M / (M + self.gemm_half_m)
        return self.peak_flops_per_s * self.gemm_efficiency * by_m * wave_efficiency(M, N, self.compute_units)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - profiles are few, frozen and hashable; a step asks thousands
    def _curve(self, K: int, N: int) -> GemmCurve:
        """The measured curve of this shape, else of the nearest one by K x N (then by K)."""
        return min(self.gemm, key=lambda c: abs(math.log(c.K * c.N / (K * N))) + 0.1 * abs(math.log(c.K / K)))

    @property
    def gemm_streams_weights(self) -> bool:
        """Whether the GEMM curves were timed with their weights streamed from memory, as a forward streams them (a
        CPU's probe): a GEMM's time is then its curve's alone, its bytes no second limit. A GPU's are timed hot."""
        return bool(self.gemm) and not self.overlap_launches

    def gemm_peak(self, K: int, N: int) -> float:
        """The best FLOP/s of a [M, K] x [K, N] GEMM at any M (its roofline's flat roof)."""
        if self.gemm:
            return max(r for _, r in self._curve(K, N).points) * self.gemm_efficiency
        return self.peak_flops_per_s * self.gemm_efficiency

    @property
    def _attention_roof(self) -> float:
        return self.attention_flops_per_s or self.peak_flops_per_s

    def attention_peak(self) -> float:
        """The best FLOP/s of the attention kernel (its roofline's flat roof)."""
        return max((r for _, r in self.attention), default=self._attention_roof) * self.attention_efficiency

    def graphed(self, tokens: int, decode: bool) -> bool:
        """Whether a step of `tokens` tokens (decode rows only, or not) replays a captured CUDA graph."""
        return 0 < tokens <= self.graph_tokens and (decode or self.graph_mixed)

    def attention_rate(self, queries: float, keys: float) -> float:
        """FLOP/s of the attention kernel for a row of `queries` new positions over `keys` keys: the decode curve
        by keys for one query, the prefill curve by queries otherwise; and a few queries over a long cached past
        (a chunk after a prefix-cache or KV-store hit) at least at one query's rate over those keys, since each
        key read serves every query (12 queries over 540 keys on the Zen 3: 3.5 GFLOP/s by the prefill curve, 19
        by the decode one; the prefill took 76 ms, predicted 187 ms before)."""
        decode = _interpolate(self.attention_decode, keys) if self.attention_decode else None
        if queries == 1 and decode is not None:
            base = decode
        else:
            base = _interpolate(self.attention, queries) if self.attention else self._attention_roof
            if decode is not None and keys > queries:
                base = max(base, decode)
        return base * self.attention_efficiency

    def stream_rate(self, working_set: float) -> float:
        """Bytes/s of a streaming operation whose working set is `working_set` bytes (cache-resident or not)."""
        if self.cache_bandwidth_bytes_per_s and working_set <= self.cache_bytes:
            return self.cache_bandwidth_bytes_per_s
        return self.bandwidth_bytes_per_s

    def with_fit(self, **changes: float | str) -> MachineProfile:
        """A copy with some parameters replaced (the fit's result)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        """A JSON-ready dict (from_json reads it back)."""
        d = dataclasses.asdict(self)
        d["gemm"] = [{"K": c.K, "N": c.N, "points": [list(p) for p in c.points]} for c in self.gemm]
        d["attention"] = [list(p) for p in self.attention]
        d["attention_decode"] = [list(p) for p in self.attention_decode]
        return d

    @classmethod
    def from_json(cls, d: dict) -> MachineProfile:
        """The profile to_json wrote; BadInput on anything else."""
        try:
            d = dict(d)
            d["gemm"] = tuple(
                GemmCurve(int(c["K"]), int(c["N"]), tuple((int(m), float(r)) for m, r in c["points"]))
                for c in d.get("gemm", ())
            )
            for part in ("attention", "attention_decode"):
                d[part] = tuple((int(n), float(r)) for n, r in d.get(part, ()))
            return cls(**d)
        except (KeyError, TypeError, ValueError) as e:
            raise BadInput(f"not a machine profile ({e}); run `prefill calibrate` again") from None


def wave_efficiency(M: float, N: int, units: int | None, tile: tuple[int, int] = GPU_TILE) -> float:
    """The fraction of a GPU's SMs busy over a GEMM's waves: tiles / (waves x units), with ceil(M / tile_M) x
    ceil(N / tile_N) output tiles (NVIDIA's "wave quantization"); 1 without a unit count (a CPU)."""
    if units is None:
        return 1.0
    tiles = math.ceil(M / tile[0]) * math.ceil(N / tile[1])
    return tiles / (math.ceil(tiles / units) * units)


def catalog_profile(hw: Hardware, dtype: str, compute_units: int | None = None) -> MachineProfile:
    """A catalog GPU's profile: its dense datasheet peak in `dtype` and bandwidth times GPU_EFFICIENCY, a launch
    of GPU_LAUNCH_S overlapping the kernels, and wave quantization over `compute_units` SMs when known."""
    dt = canonical_dtype(dtype)
    eff = GPU_EFFICIENCY
    return MachineProfile(
        name=hw.name,
        dtype=dt,
        peak_flops_per_s=hw.peak(dt),
        bandwidth_bytes_per_s=hw.bandwidth_bytes_per_s * eff["bandwidth"],
        op_overhead_s=GPU_LAUNCH_S,
        source=f"{hw.source}; stated efficiencies: GEMM {eff['gemm']:.0%}, attention {eff['attention']:.0%}, "
        f"bandwidth {eff['bandwidth']:.0%}, launch {GPU_LAUNCH_S * 1e6:.0f} us",
        overlap_launches=True,
        gemm_efficiency=hw.gemm_fraction(eff["gemm"]),
        attention_efficiency=eff["attention"],
        compute_units=compute_units or hw.compute_units,
        link_bytes_per_s=hw.link_bytes_per_s,
        kind="catalog",
    )
