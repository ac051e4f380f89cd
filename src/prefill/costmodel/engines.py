"""GPU serving engines as data: each one's scheduling rules, memory fraction and efficiencies, with its defaults
cited. The time model (prefill.costmodel.timemodel) is the same for every engine and for a CPU; an engine only
changes the MachineProfile and the Layout it reads, and the scheduler's caps (prefill.plan.simulate drives the
one Scheduler with them).

    engine = get_engine("vllm")
    profile = engine.profile(get_hardware("h100"), "fp8")    # a catalog GPU as this engine runs it
    layout = engine.layout("fp8", kv="bfloat16", tp=2)       # batched paged attention, TP width 2
    tokens = engine.kv_tokens(spec, hw, "fp8", "bfloat16", tp=2)

Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from prefill.costmodel import costs, storage
from prefill.costmodel.hardware import HARDWARE, Hardware
from prefill.costmodel.ops import Layout
from prefill.costmodel.parallel import tp_kv_cache_bytes_per_gpu
from prefill.costmodel.profile import MachineProfile, catalog_profile
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput

GiB = 2**30

# What every engine on a Hopper GPU shares (the kernels are the same libraries), each figure with its source:
# - GEMMs: cuBLAS/CUTLASS reach about 70% of the dense BF16/FP8 peak on large LLM GEMMs (NVIDIA's H100 GEMM
#   figures; the square 8192 BF16 GEMM of docs/gpu-h200.json measured 80%); by M they follow M / (M + 128): at
#   128 tokens half the large-M rate (a 128-row tile fills only part of each SM's tensor-core pipeline; the
#   curve is stated, not measured here, and below M ~ 300 the weights' bytes bound the GEMM anyway).
# - Attention: FlashAttention-3 reaches up to 75% of the BF16 peak in its forward pass (Shah et al. 2024: up to
#   740 TFLOP/s on an H100); 0.5 for the short, ragged sequences of a serving step (an estimate).
# - Bandwidth: paged decode attention and weight streaming reach about 80% of HBM's datasheet bandwidth (an
#   estimate, the same as costmodel.profile.GPU_EFFICIENCY's; streaming copies reach 85-90% on an H100).
# - A CUDA graph replay: one cudaGraphLaunch a step, about 20 us of CPU before the GPU runs (NVIDIA, "Getting
#   Started with CUDA Graphs": a graph's launch costs about one kernel launch plus a few us).
# - All-reduce: about 8 us of latency on NVLink for a decode step's small message (vLLM's custom one-shot
#   all-reduce, vllm/distributed/device_communicators/custom_all_reduce.py, used below 8 MB), then the ring's
#   bytes at the link's bandwidth.
# - A kernel's floor: about 2 us from start to finish back to back in a stream or graph however little it does
#   (NVIDIA, "Getting Started with CUDA Graphs", 2019: 3.4 us a short kernel on a V100 with a graph; an estimate
#   for Hopper). A decode step of a 70B model runs about 1,000 kernels: 2 ms of floor.
QUANTIZED_WEIGHTS = ("fp8", *costs.FP4_WEIGHTS)  # weights a GPU engine runs beside BF16 activations and K/V
GPU_WEIGHTS = ("bfloat16", "float16", "float32", *QUANTIZED_WEIGHTS)  # what a GPU engine stores weights as


def gpu_weights_help() -> str:
    """The GPU weight formats, as the CLI's --weights help lists them (FP4 needs Blackwell's FP4 tensor cores)."""
    fp4_gpus = ", ".join(name for name, hw in HARDWARE.items() if "fp4" in hw.peak_flops)
    return f"{', '.join(GPU_WEIGHTS)} ({'/'.join(costs.FP4_WEIGHTS)} only where FP4 tensor cores are: {fp4_gpus})"


def activation_dtype(weights: str) -> str:
    """A GPU engine's activations (and default K/V) beside `weights`: bfloat16 for fp8/nvfp4/mxfp4 weights."""
    w = costs.canonical_dtype(weights)
    return "bfloat16" if w in QUANTIZED_WEIGHTS else w


HOPPER = {"gemm": 0.70, "attention": 0.50, "bandwidth": 0.80, "gemm_half_m": 128.0}
GRAPH_LAUNCH_S = 20e-6
ALLREDUCE_LATENCY_S = 8e-6
KERNEL_FLOOR_S = 2e-6


@dataclass(frozen=True)
class Engine:
    """One serving engine's rules. max_seqs: requests running at once; token_budget: tokens one step may
    schedule (prefill chunks, and decode rows where decode_in_budget); mixed: whether prefill chunks share a step
    with decode rows (else a step with prefill work runs only that, as SGLang's scheduler does); memory_fraction:
    of each GPU's memory the engine takes for weights, activations and the KV cache; reserve_bytes: of that, what
    activations and CUDA graphs keep from the KV cache; graph_tokens: decode steps of at most this many rows replay
    a CUDA graph (graph_mixed: any step of at most this many tokens); step_s, row_s: the engine's own CPU seconds
    per step and per row (scheduling, input preparation, sampling) that the GPU waits for; efficiencies: the
    HOPPER-style fractions this engine reaches. Every engine batches attention over the step's rows (one kernel a
    layer: paged attention reads each row's K/V at its own context); `fused`: one kernel an operation."""

    name: str
    max_seqs: int
    token_budget: int
    decode_in_budget: bool
    mixed: bool
    memory_fraction: float
    reserve_bytes: float
    graph_tokens: int
    graph_mixed: bool
    step_s: float
    row_s: float
    efficiencies: tuple[tuple[str, float], ...] = tuple(HOPPER.items())
    fused: bool = True  # one kernel an operation (fused RMSNorm, rotary, ...), else eager PyTorch's (LAUNCHES)
    of_free: bool = False  # memory_fraction is of the memory left after the weights (TensorRT-LLM's rule)
    fraction_by_tp: tuple[tuple[int, float], ...] = ()  # (TP width, memory fraction) where it differs
    # decode steps a scheduling decision runs (vLLM 0.6's --num-scheduler-steps): a request that arrives while
    # such a window runs waits for its end before its prefill is scheduled; a step with prefill work is one alone
    scheduler_steps: int = 1
    prefill_cap: int | None = None  # one request's prompt tokens a step at most (--long-prefill-token-threshold)
    source: str = ""

    def profile(self, hw: Hardware, dtype: str) -> MachineProfile:
        """The catalog GPU `hw` as this engine runs it in `dtype` (fp8: FP8 GEMMs at the FP8 peak, attention at
        the BF16 one; nvfp4/mxfp4: GEMMs at the FP4 peak, W4A4, BadInput on a GPU without FP4 tensor cores;
        bfloat16/float16: both at the BF16 peak), one step's own CPU time included."""
        dt = costs.canonical_dtype(dtype)
        eff = dict(self.efficiencies)
        base = catalog_profile(hw, dt)
        return dataclasses.replace(
            base,
            bandwidth_bytes_per_s=hw.bandwidth_bytes_per_s * eff["bandwidth"],
            gemm_efficiency=hw.gemm_fraction(eff["gemm"]),
            attention_efficiency=eff["attention"],
            gemm_half_m=eff["gemm_half_m"],
            # the M curve stands for wave quantization too: below a wave cuBLAS picks smaller tiles or split-K
            compute_units=None if eff["gemm_half_m"] else base.compute_units,
            attention_flops_per_s=hw.peak("bfloat16"),
            link_latency_s=ALLREDUCE_LATENCY_S,
            graph_tokens=self.graph_tokens,
            graph_mixed=self.graph_mixed,
            graph_launch_s=GRAPH_LAUNCH_S,
            kernel_floor_s=KERNEL_FLOOR_S,
            step_overhead_s=self.step_s,
            name=f"{hw.name} ({self.name})",
            source=f"{base.source}; engine {self.name}: {self.source}",
        )

    def layout(self, weights: str, kv: str | None = None, tp: int = 1) -> Layout:
        """Weights stored as `weights` (a 16-bit dtype, fp8, nvfp4 or mxfp4: their bytes with block scales),
        activations in BF16, K/V as `kv` (default: the engine's choice, BF16), paged attention batched over the
        step's rows, reading K/V in place."""
        act = activation_dtype(weights)
        kvb = costs.dtype_bytes(kv or act)
        w = float(costs.dtype_bytes(weights))
        return Layout(
            w, int(costs.dtype_bytes(act)), kvb, tp, False, batched_attention=True, eager_launches=not self.fused
        )

    def kv_tokens(self, spec: ModelSpec, hw: Hardware, weights: str, kv: str | None, tp: int) -> int:
        """Positions the KV cache holds on each GPU of a TP group: memory_fraction of its memory, less its 1/tp
        of the weights and the reserve, over one position's K/V on one GPU."""
        lay = self.layout(weights, kv, tp)
        fraction = self.fraction(tp)
        left = hw.memory_bytes - storage.weight_bytes(spec, weights) / tp - self.reserve_bytes
        free = fraction * left if self.of_free else left - (1 - fraction) * hw.memory_bytes
        return max(0, int(free // tp_kv_cache_bytes_per_gpu(spec, 1, lay.kv_bytes, tp)))

    def fraction(self, tp: int) -> float:
        """The memory fraction the engine takes at TP width `tp`."""
        return dict(self.fraction_by_tp).get(tp, self.memory_fraction)

    def row_overhead(self) -> tuple[float, float]:
        """(seconds per step, seconds per row) the engine's CPU adds to each step beyond the GPU's work."""
        return (0.0, self.row_s)  # the per-step part is the profile's step_overhead_s


# The engines' documented defaults on an 80+ GB Hopper GPU, each cited. CPU time per step (step_s, row_s) is an
# estimate: vLLM V1 overlaps its scheduler with the GPU only with --async-scheduling (off by default in 0.10), so
# a step's input preparation and sampling, ~1 ms plus ~2 us a row (estimates), sit between its forwards (the vLLM
# V1 blog, 2025-01-27, names CPU overhead between steps as what V1 set out to cut); SGLang's overlap scheduler
# hides most of it (SGLang v0.4 blog, 2024-12-04: the zero-overhead batch scheduler), so 0.2 ms a step; the same
# for TensorRT-LLM's C++ runtime.
ENGINES: dict[str, Engine] = {
    "vllm": Engine(
        "vllm",
        # vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (0.10): max_num_seqs 1024 and
        # max_num_batched_tokens 8192 (the OpenAI server) on GPUs of >= 70 GiB other than A100; V1 always
        # chunks prefills and counts decode tokens against the budget (vllm/v1/core/sched/scheduler.py).
        max_seqs=1024,
        token_budget=8192,
        decode_in_budget=True,
        mixed=True,
        # --gpu-memory-utilization 0.9 (vllm/config/cache.py); piecewise CUDA graphs capture batches up to 512
        # tokens, mixed prefill/decode steps included (vllm/config/compilation.py, max_capture_size 512).
        memory_fraction=0.90,
        reserve_bytes=2.5 * GiB,  # profile_run's activation peak at 8192 tokens plus graph pools: an estimate
        graph_tokens=512,
        graph_mixed=True,
        step_s=1.0e-3,
        row_s=2e-6,
        source="vllm 0.10 defaults: max_num_seqs 1024, max_num_batched_tokens 8192, gpu_memory_utilization 0.9",
    ),
    "sglang": Engine(
        "sglang",
        # python/sglang/srt/server_args.py (0.4.x): chunked_prefill_size 8192 on H100/H200, mem_fraction_static
        # 0.88 at TP1, 0.87 at TP2, 0.85 at TP4, 0.81 at TP8 (fraction_by_tp);
        # cuda_graph_max_bs 256 below TP4; max_running_requests from the pool (a cap of 4096 stands for it);
        # a prefill batch runs alone, decode between (scheduler.py get_next_batch_to_run; --enable-mixed-chunk
        # off by default).
        max_seqs=4096,
        token_budget=8192,
        decode_in_budget=False,
        mixed=False,
        memory_fraction=0.88,
        fraction_by_tp=((2, 0.87), (4, 0.85), (8, 0.81)),
        reserve_bytes=1.0 * GiB,  # mem_fraction_static already leaves activations outside the static pool
        graph_tokens=256,
        graph_mixed=False,
        step_s=0.2e-3,
        row_s=1e-6,
        source="sglang 0.4 defaults: chunked_prefill_size 8192, mem_fraction_static 0.88, cuda_graph_max_bs 256",
    ),
    "trtllm": Engine(
        "trtllm",
        # the LLM API's build defaults (tensorrt_llm BuildConfig: max_batch_size 2048, max_num_tokens 8192; the
        # trtllm-serve flags of some releases default lower); kv_cache_config.free_gpu_memory_fraction 0.9 of the
        # memory left after weights; in-flight batching mixes context chunks with generation (TensorRT-LLM docs:
        # performance-tuning-guide/tuning-max-batch-size-and-max-num-tokens).
        max_seqs=2048,
        token_budget=8192,
        decode_in_budget=True,
        mixed=True,
        memory_fraction=0.90,
        reserve_bytes=2.0 * GiB,
        graph_tokens=128,  # CUDA graphs for decode batches up to 128 (an estimate of cuda_graph_config's sizes)
        graph_mixed=False,
        step_s=0.2e-3,
        row_s=1e-6,
        of_free=True,
        source="trtllm-serve 1.0 defaults: max_batch_size 2048, max_num_tokens 8192, free_gpu_memory_fraction 0.9",
    ),
    "prefill": Engine(
        "prefill",
        # this project's server (prefill.engine.scheduler): decode first, a 256-token prefill budget, 32 running,
        # eager kernels (no graphs, each operation its PyTorch kernels), the step's decode rows' attention in one
        # batched call as the other engines'; prefill serve --chunk-size/--max-running.
        max_seqs=32,
        token_budget=256,
        decode_in_budget=False,
        mixed=True,
        memory_fraction=0.90,
        reserve_bytes=2.0 * GiB,
        graph_tokens=0,
        graph_mixed=False,
        step_s=0.0,
        row_s=0.0,
        efficiencies=(("gemm", 0.75), ("attention", 0.35), ("bandwidth", 0.80), ("gemm_half_m", 0.0)),
        fused=False,
        source="prefill serve defaults: chunk 256, 32 running, eager PyTorch (costmodel.profile.GPU_EFFICIENCY)",
    ),
}


def engine_names() -> list[str]:
    return list(ENGINES)


def get_engine(name: str) -> Engine:
    """An engine by name; BadInput naming the choices otherwise."""
    key = name.lower()
    if key not in ENGINES:
        raise BadInput(f"unknown engine {name!r}; choose one of: {', '.join(ENGINES)}")
    return ENGINES[key]
