"""Ours vs transformers in thread CPU time, one thread: the steadiest comparison a shared, busy machine allows.

Wall-clock time on cores shared with other jobs measures the other jobs too; the CPU time of our one thread does
not count the time it waited. Reported beside the model-shape GEMM's rate in the same units.

    .venv/bin/python benchmarks/cpu_time.py float32 512,2048
"""

from __future__ import annotations

import sys
import time

import torch

from prefill.bench.peers import TransformersPeer
from prefill.costmodel.costs import prefill_flops_exact
from prefill.engine.llm import Engine
from prefill.loading.resolve import default_model_path


def cpu_seconds(fn, repeats: int = 4) -> float:
    """Best thread CPU time of `repeats` calls after one warm-up, seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def main(dtype: str, lengths: list[int]) -> None:
    torch.set_num_threads(1)
    ours = Engine.load(None, dtype=dtype, progress=False)
    hf = TransformersPeer.load(default_model_path(), dtype)
    s = ours.spec
    a = torch.randn(512, s.d_model).to(ours.dtype)  # [P, d_model]
    w = torch.randn(2 * s.d_ff, s.d_model).to(ours.dtype)  # gate and up: the widest projection
    gemm = 2 * 512 * s.d_model * 2 * s.d_ff / cpu_seconds(lambda: torch.nn.functional.linear(a, w), 10)
    with torch.inference_mode():
        for P in lengths:
            ids = torch.tensor([[(7919 * i + 11) % s.vocab_size for i in range(P)]])  # [1, P]
            t_ours, t_hf = cpu_seconds(lambda ids=ids: ours.prefill(ids)), cpu_seconds(lambda ids=ids: hf.prefill(ids))
            rate = prefill_flops_exact(s, P).total / t_ours
            line = (
                f"{dtype} P={P} 1 thread CPU time: ours {t_ours * 1e3:.0f} ms ({P / t_ours:.0f} tok/s, "
                f"{rate / 1e9:.0f} GFLOP/s = {rate / gemm:.0%} of the {gemm / 1e9:.0f} GFLOP/s model-shape GEMM), "
                f"transformers {t_hf * 1e3:.0f} ms ({P / t_hf:.0f} tok/s): {t_hf / t_ours:.2f}x"
            )
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "float32", [int(x) for x in (sys.argv[2:] or ["512"])[0].split(",")])
