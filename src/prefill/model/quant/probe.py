"""The decode-GEMM probe `--weights auto` reads: M = 1 against 16 stacked [3,072 x 576] matrices (SmolLM2's
fused gate/up), native Q4_1 blocks against float32, so that the float32 set (113 MB) streams from memory as a
real decode step's weights do, instead of sitting in the last-level cache. About a tenth of a second.

It runs on one thread whatever the engine uses: what it decides is whether the kernels turn fewer bytes into
less time, which more threads scale alike for both storages, and on a shared machine a two-thread barrier
measures the other processes more than the kernels."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from prefill.model.quant.weight import QuantWeight

N, K, LAYERS = 3072, 576, 16


def random_q4_1(N: int, K: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Valid Q4_1 blocks uint8 [N, K / 32 * 20]: random nibbles, scales d in [0.001, 0.011), offsets m = -8 d."""
    nb = K // 32
    raw = torch.randint(0, 256, (N, nb, 20), dtype=torch.uint8, generator=generator)
    d = torch.rand(N, nb, generator=generator) * 0.01 + 0.001
    raw[..., 0:2] = d.half().view(torch.uint8).view(N, nb, 2)
    raw[..., 2:4] = (-8 * d).half().view(torch.uint8).view(N, nb, 2)
    return raw.view(N, nb * 20)


def measure_decode_gemm(rounds: int = 7) -> dict[str, float]:
    """Seconds of one M = 1 product with one matrix, native vs float32, the best of interleaved rounds (each
    round walks all LAYERS matrices once; other load on the machine can only add time, so the minimum is the
    machine's own speed)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(rounds)
    finally:
        torch.set_num_threads(old)


def _measure(rounds: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    weights = [QuantWeight(random_q4_1(N, K, g), "Q4_1", N, K).pack() for _ in range(LAYERS)]  # as the engine
    dense = [w.dequantize() for w in weights]  # [N, K] float32 each
    x = torch.randn(1, K, generator=g)
    runs = {
        "native": lambda i: weights[i].matmul(x),
        "float32": lambda i: F.linear(x, dense[i]),
    }
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(rounds + 1):
        for name, fn in runs.items():
            t = time.perf_counter()
            for i in range(LAYERS):
                fn(i)
            if r:  # the first round warms up
                samples[name].append((time.perf_counter() - t) / LAYERS)
    return {name: min(s) for name, s in samples.items()}
