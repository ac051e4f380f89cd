"""This machine, measured: the one probe. Every timing of the machine (not of the engine) is taken here.

    gemm_curve(K, N, dtype)        FLOP/s of [M, K] x [K, N] as M grows, its weights streamed from memory as a
                                   forward streams each layer's (the model is larger than the cache)
    attention_curves(H_q, ...)     (prefill.machine.attention_probe) causal attention's and a decode row's FLOP/s
    measure_bandwidth()            streaming reads from memory (bytes/s): a GEMV over a matrix far larger than
                                   the cache, the way a decode step reads its weights
    measure_op_overhead()          seconds per launch of a block's small operations (one token, width 64),
                                   between GEMVs that stream weights, as in a forward
    measure_gemm_rate(dtype)       a square GEMM's FLOP/s (a peak: MFU's denominator, the GPU bench)
    measure_copy_bandwidth()       an array copy's bytes/s (read + written)

Each timing is the best of a few repeats after a warm-up: other load on a shared machine can only slow a
kernel down. A repeat is the work as a forward runs it: a pass over weights streamed from memory, a burst of
back-to-back GEMMs (their mean: a thread that runs late is part of what a forward sees), small operations and
attention right after a GEMV that streams weights (after_streaming). prefill.machine.profiles assembles these
into a MachineProfile and caches it. torch is imported inside the functions only.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from prefill.costmodel.costs import canonical_dtype, dtype_bytes
from prefill.costmodel.storage import GGUF_BLOCKS

# Row counts the GEMM curve is measured at (while the budget allows); 32 and 64 on both sides of the engine's
# switch from its own few-rows kernel to MKL on most CPUs (prefill.model.kernels.few_rows: 128 on AVX2).
GEMM_MS = (1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096)  # 8: a decode step of 8 rows, measured, not interpolated
COLD_UP_TO = 64  # up to this M, the probe streams the weights from memory; beyond, gemm_curve adds their time
# Beyond it, HOT_BURST_S of back-to-back calls are timed, their mean: on the Xeon VM one call in six or seven ran
# at half speed (a thread late), so the fastest single call ([256, 576] x [576, 3072] bf16: 503 us) was 20% under
# the mean (618 us), which is what a forward sees.
HOT_BURST_S, HOT_BURST_CALLS = 0.02, 64
COLD_PASS_S = 0.1  # the longest pass over the weights' copies worth timing (an emulated dtype is never near it)
# What the probe streams so that nothing comes from the cache, as in a forward (all 538 MB of the float32 model
# between two uses of a weight): COLD_CACHES x the last-level cache, at most COLD_MAX_BYTES. At 2x, the Zen 3's
# 32 MiB L3 (a victim cache) still served part of them: [8, 576] x [576, 3072] ran in 324 us over 2x, 362-378 us
# over 8x and 16x. A Xeon VM reports a 480 MiB L3, shared with its neighbours: the same GEMM streamed 28 GB/s of
# weights over 64 MiB of copies, 18-19 GB/s over 256 MiB to 2 GiB.
COLD_CACHES = 8
COLD_MAX_BYTES = 512 * 2**20
COLD_MAX_COPIES = 1024  # a small GEMM's copies stop here (its launches, not its bytes, decide its time)
GEMM_MAX_N = 8192  # columns the probe measures of a wider GEMM
CACHE_BYTES_FALLBACK = 8 * 2**20  # when sysfs does not say how large the last-level cache is


def _sync(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def best_seconds(fn: Callable[[], object], repeats: int, device: str = "cpu") -> float:
    """The fastest of `repeats` timed calls of fn after one untimed warm-up call (seconds)."""
    sync = _sync(device)
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def gemm_seconds(
    M: int,
    K: int,
    N: int,
    dtype: str,
    device: str = "cpu",
    repeats: int = 3,
    copies: int = 1,
    qtype: str | None = None,
    made: list | None = None,
    calls: int = 1,
) -> float:
    """Best seconds of one [M, K] x [N, K]^T as the engine's projections run it (few_rows_linear: MKL's F.linear,
    for 2..32 rows of dense float32 the engine's own kernel, and with `qtype` the kernels of GGUF blocks kept
    native), cycling through `copies` weights so that with enough of them each one comes from memory, not from
    the cache. `made`: a list that keeps the copies for the next call at the same shape (making 512 MiB of
    them takes 0.1 s). `calls`: back-to-back calls on each copy, their mean timed."""
    import torch

    from prefill.model.kernels import few_rows_linear

    dt = getattr(torch, canonical_dtype(dtype))
    ws = made if made is not None else []  # copies x [N, K] (nn.Linear's layout)
    ws.extend(_weight(N, K, dt, device, qtype) for _ in range(copies - len(ws)))
    a = torch.randn(M, K, device=device).to(dt)  # [M, K]

    def all_copies() -> None:
        for w in ws:
            for _ in range(calls):
                few_rows_linear(a, w)

    return best_seconds(all_copies, repeats, device) / (copies * calls)


def _weight(N: int, K: int, dt, device: str, qtype: str | None):
    """A weight as the engine holds it: dense [N, K] in `dt`, or GGUF blocks of `qtype` (random values), its
    products on the activation path the name says ("Q4_1:q8": 8-bit activations; "Q4_1": float32, whatever
    PREFILL_ACTIVATIONS says)."""
    import torch

    if qtype is None:
        return torch.full((N, K), 0.01, device=device, dtype=dt)
    from prefill.model.quant import QuantWeight

    qtype, _, acts = qtype.partition(":")
    blocks = _random_blocks(N, K, qtype).clone()  # a copy each, as the engine holds it
    return QuantWeight(blocks, qtype, N, K, activations=acts or "f32").pack()


def _random_blocks(N: int, K: int, qtype: str):
    """GGUF blocks uint8 [N, K / block * bytes] of `qtype` to time its kernels on: random weights quantized by the
    gguf package, where it can make the type; else a model file's own blocks of that type (give_blocks), repeated
    to fill the shape; else zero blocks, said in one line (the kernels run the same instructions whatever the
    values: none branches on a weight)."""
    import torch

    if qtype not in _UNMADE:
        try:
            return _quantized(N, K, qtype)
        except NotImplementedError:  # gguf-py quantizes no K-quant (after drawing the weights: ask it once)
            _UNMADE.add(qtype)
    block, nbytes = GGUF_BLOCKS[qtype]
    if (given := _GIVEN.get(qtype)) is not None:
        return torch.from_numpy(np.resize(given, N * (K // block) * nbytes).reshape(N, -1))
    if qtype not in _SAID:
        _SAID.add(qtype)
        print(f"probe: no {qtype} blocks to time (gguf-py cannot make them): timing zero blocks", file=sys.stderr)
    return torch.zeros(N, K // block * nbytes, dtype=torch.uint8)


@functools.lru_cache(maxsize=8)
def _quantized(N: int, K: int, qtype: str):
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    w = (np.random.default_rng(0).standard_normal((N, K)) * 0.02).astype(np.float32)
    return torch.from_numpy(quantize(w, GGMLQuantizationType[qtype]))


GIVEN_BYTES = 4 * 2**20  # of each type's given blocks kept (repeated to fill a larger shape)
_GIVEN: dict[str, np.ndarray] = {}  # GGUF type -> a model file's own blocks, flat uint8 (give_blocks)
_SAID: set[str] = set()
_UNMADE: set[str] = set()  # the types gguf-py cannot quantize


def give_blocks(qtype: str, blocks) -> None:
    """Keep up to GIVEN_BYTES of a model file's blocks of `qtype` (uint8, whole blocks) for the probe to time the
    kernels on where the gguf package cannot quantize that type; the first ones given per type stay."""
    if qtype in _GIVEN:
        return
    nbytes = GGUF_BLOCKS[qtype][1]
    flat = np.asarray(blocks, dtype=np.uint8).reshape(-1)
    _GIVEN[qtype] = flat[: min(flat.size, GIVEN_BYTES) // nbytes * nbytes].copy()


def gemm_curve(
    K: int,
    N: int,
    dtype: str,
    device: str = "cpu",
    budget_s: float = 1.0,
    Ms: tuple[int, ...] = GEMM_MS,
    qtype: str | None = None,
    bandwidth: float | None = None,
) -> tuple[tuple[int, float], ...]:
    """(M, FLOP/s) of [M, K] x [K, N] for M in Ms while the next M is predicted to fit the budget (its time grows
    at most 4x per step), so an emulated dtype costs a fraction of a second. Up to M = COLD_UP_TO the weights
    cycle through copies of cold_bytes() in all, so each is read from memory as in a forward; beyond (or where a
    pass would be too slow), the hot time plus the weights' bytes at `bandwidth` (default: measured), as a CPU
    GEMM packs its weights, then computes (on the Xeon VM, cold = hot + bytes / bandwidth within 5% at M = 16 to
    1,024, bf16 and fp32). A wide N (an unembedding) is timed on its first GEMM_MAX_N columns."""
    from prefill.costmodel.storage import bytes_per_weight

    N = min(N, GEMM_MAX_N)
    weight_bytes = K * N * (bytes_per_weight(qtype.split(":")[0]) if qtype else dtype_bytes(dtype))
    cold = max(1, min(COLD_MAX_COPIES, math.ceil(cold_bytes() / weight_bytes))) if device == "cpu" else 1
    made: list = []  # the cold copies, made once for every M
    stream_s = weight_bytes / (bandwidth or measure_bandwidth(device)) if cold > 1 else 0.0

    def measure(M: int) -> tuple[float, float]:
        repeats = 2  # of the largest too: one call of [4096, 576] x [576, 3072] fp32 took 55 ms or 106 in a process
        t = gemm_seconds(M, K, N, dtype, device, repeats, qtype=qtype)
        if M <= COLD_UP_TO and cold > 1 and t * cold < COLD_PASS_S:
            t = gemm_seconds(M, K, N, dtype, device, repeats, copies=cold, qtype=qtype, made=made)
        elif cold > 1:
            calls = min(HOT_BURST_CALLS, math.ceil(HOT_BURST_S / t))
            t = (gemm_seconds(M, K, N, dtype, device, repeats, qtype=qtype, calls=calls) if calls > 1 else t) + stream_s
        return 2.0 * M * K * N, t

    return grow(Ms, measure, budget_s)


def grow(sizes, measure, budget_s: float) -> tuple[tuple[int, float], ...]:
    """(size, FLOP/s) for sizes in turn while the next is predicted to fit the budget (4x the last one's time);
    measure(size) -> (FLOPs, best seconds) of one call (its repeats cost about 3 calls)."""
    points, spent = [], 0.0
    for n in sizes:
        flops, t = measure(n)
        points.append((n, flops / t))
        spent += 3 * t
        if spent + 3 * t * 4 > budget_s:
            break
    return tuple(points)


def measure_bandwidth(device: str = "cpu", n_bytes: int | None = None) -> float:
    """Streaming read bandwidth (bytes/s): the matrix bytes of a one-row GEMM over an `n_bytes` float32 matrix
    (default cold_bytes(): none of it in the cache; the way a decode step reads its weights), over the best of a
    few repeats."""
    import torch
    import torch.nn.functional as F

    n_bytes = n_bytes or cold_bytes()
    K = 1024
    w = torch.ones(n_bytes // 4 // K, K, device=device)  # [N, K] float32, n_bytes in all
    x = torch.ones(1, K, device=device)  # [1, K]
    return w.nbytes / best_seconds(lambda: F.linear(x, w), 4, device)


def last_level_cache_bytes() -> int:
    """The largest CPU cache one core sees (sysfs), else CACHE_BYTES_FALLBACK."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip().upper()
            sizes.append(int(text[:-1]) * {"K": 2**10, "M": 2**20}[text[-1]] if text[-1] in "KM" else int(text))
        except (OSError, ValueError):
            continue
    return max(sizes, default=CACHE_BYTES_FALLBACK)


def cold_bytes() -> int:
    """Bytes a probe streams between two uses of one tensor so that it comes from memory, not the cache."""
    return min(COLD_CACHES * last_level_cache_bytes(), COLD_MAX_BYTES)


def measure_op_overhead(device: str = "cpu", n: int = 32, dtype: str = "float32") -> float:
    """Seconds per kernel launch of an eager forward's small operations: the operations of one block on one
    token at width 64 (no work to speak of), timed together and divided by the launches prefill.costmodel.ops
    counts for them, so that the time model's launch counts and this figure agree. On a CPU each block's four
    groups of them (before and after its four projections) run between GEMVs that stream weights from memory,
    whose time alone is taken off, as in a forward: there the streaming evicts the small operations' code and
    data and each GEMM starts cold (on the Xeon VM 9.2 us a launch, 2.9 back to back; SmolLM2's 1-token prefill:
    3.3 ms without its GEMMs, 27.9 ms with them, which take 20.1 back to back). At least the back-to-back time.
    In the model's `dtype`, weights and activations: there a launch took 8.9 us in float32, 10.6-11.3 in bf16."""
    import torch
    import torch.nn.functional as F

    from prefill.costmodel.ops import LAUNCHES

    d = 64
    t = {
        name: torch.randn(*shape, device=device).to(getattr(torch, canonical_dtype(dtype)))
        for name, shape in (
            ("x", (1, 1, d)),
            ("w", (d,)),
            ("qkv", (3 * d, d)),
            ("sq", (d, d)),
            ("up", (4 * d, d)),
            ("down", (d, 2 * d)),
            ("cos", (1, 1, 1, d)),
            ("pool", (1, 64, d)),
        )
    }
    slot = torch.tensor([3], device=device)
    streamed = streamer(device, dtype)

    def block(stream: Callable[[], None]) -> None:
        stream()
        h = F.rms_norm(t["x"], (d,), t["w"])
        qkv = F.linear(h, t["qkv"]).view(1, 1, 3, d)  # [B, T, heads, d_head]
        stream()
        qk, v = qkv[:, :, :2], qkv[:, :, 2:]
        x1, x2 = qk.chunk(2, dim=-1)
        qk = qk * t["cos"] + torch.cat((-x2, x1), dim=-1) * t["cos"]  # rotary: mul, neg, cat, mul, add
        q, k = qk[:, :, :1].transpose(1, 2), qk[:, :, 1:].transpose(1, 2)  # [B, 1, T, d_head]
        t["pool"].index_copy_(1, slot, k.transpose(0, 1).reshape(1, 1, d))
        t["pool"].index_copy_(1, slot, v.transpose(1, 2).transpose(0, 1).reshape(1, 1, d))
        o = F.scaled_dot_product_attention(q, k, v.transpose(1, 2))
        x = t["x"] + F.linear(o.transpose(1, 2).reshape(1, 1, d), t["sq"])
        stream()
        gate, up = F.linear(F.rms_norm(x, (d,), t["w"]), t["up"]).chunk(2, dim=-1)
        stream()
        _ = x + F.linear(F.silu(gate) * up, t["down"])

    names = ("norm", "qkv", "rotary", "kv_write", "attention", "o", "residual")  # block()'s, in order
    names += ("norm", "gate_up", "mlp_act", "down", "residual")
    launches = sum(LAUNCHES[name] for name in names)

    if device != "cpu":  # no streaming: the launches back to back, synchronised
        return best_seconds(lambda: [block(streamed) for _ in range(n)], 5, device) / (n * launches)

    # the fastest of n rounds each: another process on the cores slows some rounds, not all of them
    between = best_seconds(lambda: block(streamed), n) - best_seconds(lambda: [streamed() for _ in range(4)], n)
    return max(between, best_seconds(lambda: block(lambda: None), n)) / launches


def after_streaming(fn: Callable[[], object], stream: Callable[[], None], touch=None, calls: int = 10) -> float:
    """Seconds of one fn() as a forward runs it on a CPU: each call right after a GEMV that streams weights from
    memory (it evicts fn's code and data, its threads have gone idle) and `touch` (which makes fn's inputs hot,
    as the work that produced them would). The fastest of `calls` such rounds, less the fastest of as many without
    fn: what fn adds to a forward, its effect on the next GEMV included; at least fn's warm time. Fastest rounds,
    not a loop's mean: another process on the cores slows some rounds, not the fastest. On the Xeon VM causal
    attention at P = 64 added 193 us this way, 162 warm (bf16; float32: 113 and 74)."""
    touch = touch or (lambda: None)
    rounds = best_seconds(lambda: (stream(), touch(), fn()), calls)  # its first, untimed, follows the other kind's
    alone = best_seconds(lambda: (stream(), touch()), calls)
    return max(rounds - alone, best_seconds(fn, 3))


def streamer(device: str, dtype: str = "float32") -> Callable[[], None]:
    """A callable that runs one GEMV of a forward's kind (one row, the engine's GEMM) over the next of copies of
    a [1024, 1024] weight in `dtype` filling cold_bytes(), so each comes from memory; nothing on a GPU."""
    if device != "cpu":
        return lambda: None
    import torch

    from prefill.model.kernels import few_rows_linear

    dt = getattr(torch, canonical_dtype(dtype))
    copies = max(1, cold_bytes() // (2**20 * dt.itemsize))
    ws = [torch.full((1024, 1024), 0.01, dtype=dt) for _ in range(copies)]  # copies x [N, K]
    a = torch.ones(1, 1024, dtype=dt)  # [1, K]
    turn = [0]

    def stream() -> None:
        few_rows_linear(a, ws[turn[0] % copies])
        turn[0] += 1

    return stream


def measure_gemm_rate(
    dtype: str = "bfloat16", device: str = "cpu", threads: int | None = None, seconds: float = 0.2
) -> float:
    """FLOP/s of a square GEMM in `dtype` on `device` (a peak): the size grows from 1024 until one GEMM takes
    about seconds / 5 (CPU), or 8192 after a warm-up (a GPU, whose small GEMMs are launch-bound); the best of
    the repeats. `threads`: run with that many CPU threads, restored after."""
    import torch

    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        if device.startswith("cuda"):
            n, fn = 8192, _square(8192, dtype, device)
            for _ in range(2):  # cuBLAS start-up and clock ramp-up, before the timed warm-up
                fn()
            return 2 * n**3 / best_seconds(fn, 10, device)
        n, repeats = 1024, 5
        t = best_seconds(_square(n, dtype, device), 1, device)
        if t > seconds:  # an emulated dtype: one timed GEMM says enough, and more would take minutes
            return 2 * n**3 / t
        while t < seconds / repeats / 2 and n < 8192:  # time grows as n^3: aim one GEMM at seconds / repeats
            n = min(8192, int(n * min(2.0, max(1.25, (seconds / repeats / max(t, 1e-6)) ** (1 / 3)))))
            t = best_seconds(_square(n, dtype, device), 1, device)
        return 2 * n**3 / best_seconds(_square(n, dtype, device), repeats, device)
    finally:
        torch.set_num_threads(old)


def _square(n: int, dtype: str, device: str) -> Callable[[], object]:
    import torch

    dt = getattr(torch, canonical_dtype(dtype))
    a = torch.randn(n, n, device=device).to(dt)  # [n, n]
    b = torch.randn(n, n, device=device).to(dt)  # [n, n]
    return lambda: torch.matmul(a, b)


def measure_copy_bandwidth(n_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Memory bandwidth (bytes/s) of copying an `n_bytes` array: bytes read + written over the best time."""
    src = np.ones(n_bytes // 8)  # [n_bytes / 8] float64
    dst = np.empty_like(src)
    return 2 * src.nbytes / best_seconds(lambda: np.copyto(dst, src), repeats)
