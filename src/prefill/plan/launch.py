"""The launch command of a simulated deployment: the checkpoint and every engine flag that was simulated.

    launch = launch_for(server)  # server: a GpuServer (prefill.plan.gpu_serving)
    launch.command      # vllm serve RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 --tensor-parallel-size 1 ...
    launch.files        # (("trtllm.yaml", "kv_cache_config:\n  dtype: fp8\n"),) for TensorRT-LLM
    launch.missing      # why there is no command ("" when there is one)

What is simulated is what the line deploys: the Instruct checkpoint (a plan serves chat), pre-quantized where the
weights are FP8 or FP4 (vLLM and SGLang load a BF16 checkpoint in BF16 before quantizing it online: 141 GB of a
70B model do not load on one H200), the TP width, the activations' and the KV cache's precision, the memory
fraction, the running requests and the token budget, each with the engine's own flag. Pipeline parallelism is not
simulated, so the lines leave it at the engines' default (1). Each flag is the engine's documented one:
tests/data/engine_args.json keeps the table with its sources, and tests/plan/test_launch.py checks every line
against it.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefill.costmodel import costs, storage
from prefill.costmodel.engines import QUANTIZED_WEIGHTS, activation_dtype

# The Instruct (chat) checkpoint of each preset's base repo id, as published on the Hugging Face Hub (each id
# checked there or in the engines' own tests and guides; Qwen3-8B is itself the post-trained model, its base is
# Qwen/Qwen3-8B-Base). A model outside this table is launched by the name it was given.
INSTRUCT = {
    "meta-llama/Llama-2-7b-hf": "meta-llama/Llama-2-7b-chat-hf",
    "meta-llama/Meta-Llama-3-8B": "meta-llama/Meta-Llama-3-8B-Instruct",
    "meta-llama/Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Meta-Llama-3-70B": "meta-llama/Meta-Llama-3-70B-Instruct",
    "meta-llama/Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct",
    "mistralai/Mistral-7B-v0.1": "mistralai/Mistral-7B-Instruct-v0.1",
    "Qwen/Qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen3-8B": "Qwen/Qwen3-8B",
    "google/gemma-2-9b": "google/gemma-2-9b-it",
    "google/gemma-3-270m": "google/gemma-3-270m-it",
    "google/gemma-3-1b-pt": "google/gemma-3-1b-it",
    "google/gemma-3-4b-pt": "google/gemma-3-4b-it",
    "google/gemma-3-12b-pt": "google/gemma-3-12b-it",
    "google/gemma-3-27b-pt": "google/gemma-3-27b-it",
    "HuggingFaceTB/SmolLM2-135M": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


@dataclass(frozen=True)
class Checkpoint:
    """A pre-quantized Instruct checkpoint: its repo id, what its linear layers are stored as (fp8, nvfp4) and its
    format (the quant_method its config names, which the engines detect without a flag)."""

    repo: str
    weights: str
    format: str


# Pre-quantized Instruct checkpoints by base repo id. Sources: the RedHatAI (formerly neuralmagic) and nvidia
# model cards on the Hub; vLLM's CI loads RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8, TensorRT-LLM's
# examples/pytorch/README.md nvidia/Llama-3.1-8B-Instruct-FP8, SGLang's benchmark README
# neuralmagic/Meta-Llama-3-70B-Instruct-FP8 (AutoFP8: quant_method fp8).
QUANTIZED = {
    "meta-llama/Meta-Llama-3-8B": (Checkpoint("neuralmagic/Meta-Llama-3-8B-Instruct-FP8", "fp8", "fp8"),),
    "meta-llama/Meta-Llama-3-70B": (Checkpoint("neuralmagic/Meta-Llama-3-70B-Instruct-FP8", "fp8", "fp8"),),
    "meta-llama/Llama-3.1-8B": (
        Checkpoint("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8", "fp8", "compressed-tensors"),
        Checkpoint("nvidia/Llama-3.1-8B-Instruct-FP8", "fp8", "modelopt"),
        Checkpoint("nvidia/Llama-3.1-8B-Instruct-FP4", "nvfp4", "modelopt"),
    ),
    "meta-llama/Llama-3.1-70B": (
        Checkpoint("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", "fp8", "compressed-tensors"),
        Checkpoint("nvidia/Llama-3.1-70B-Instruct-FP8", "fp8", "modelopt"),
        Checkpoint("RedHatAI/Llama-3.1-70B-Instruct-NVFP4", "nvfp4", "compressed-tensors"),
    ),
    "Qwen/Qwen3-8B": (Checkpoint("Qwen/Qwen3-8B-FP8", "fp8", "fp8"),),
}

# The checkpoint formats each engine loads (vLLM: quantization/__init__.py's methods; SGLang: its quantization
# docs; TensorRT-LLM: ModelOpt checkpoints, its deployment guides), in the order preferred.
LOADS = {
    "vllm": ("compressed-tensors", "fp8", "modelopt"),
    "sglang": ("fp8", "compressed-tensors", "modelopt"),
    "trtllm": ("modelopt",),
    "prefill": (),
}
# An engine's flag that quantizes a BF16 checkpoint to FP8 online, where it has one.
ONLINE_FP8 = {"vllm": "--quantization fp8", "sglang": "--quantization fp8"}
# The KV cache's precision as each engine names it; "auto" is the activations' dtype.
KV_NAMES = {"vllm": {"fp8": "fp8"}, "sglang": {"fp8": "fp8_e4m3"}, "trtllm": {"fp8": "fp8"}}


@dataclass(frozen=True)
class Launch:
    """One replica's launch: the command, files it reads (name, text), and, where the engine cannot deploy what
    was simulated, why (then no command)."""

    command: str = ""
    files: tuple[tuple[str, str], ...] = ()
    missing: str = ""


def checkpoint(name: str, weights: str, engine: str) -> tuple[str, bool] | None:
    """The repo id an engine loads for model `name` (a base repo id) with `weights`, and whether the engine must
    quantize it online (a BF16 checkpoint for FP8 weights); None when no checkpoint it loads is known."""
    w = costs.canonical_dtype(weights)
    if w not in QUANTIZED_WEIGHTS:
        return INSTRUCT.get(name, name), False
    for fmt in LOADS.get(engine, ()):
        for c in QUANTIZED.get(name, ()):
            if c.weights == w and c.format == fmt:
                return c.repo, False
    if w == "fp8" and engine in ONLINE_FP8:
        return INSTRUCT.get(name, name), True
    return None


def launch_for(server) -> Launch:
    """The launch of `server` (a GpuServer): its checkpoint and its engine's flags for everything simulated."""
    e, spec, w, tp = server.engine, server.spec, server.weights, server.tp
    found = checkpoint(spec.name, w, e.name)
    if found is None:
        return Launch(missing=f"no pre-quantized {w} checkpoint of {spec.name} is known that {e.name} loads")
    repo, online = found
    if online:  # the BF16 weights load whole before they are quantized
        bf16 = storage.weight_bytes(spec, "bfloat16") / tp
        if bf16 > e.fraction(tp) * server.hw.memory_bytes:
            why = f"{spec.name}'s BF16 weights ({bf16 / 1e9:,.0f} GB a GPU) do not load on {server.hw.name} to quantize"
            return Launch(missing=f"no pre-quantized {w} checkpoint known; {why}")
    act = activation_dtype(w)
    build = {"vllm": _flags, "sglang": _flags, "trtllm": _trtllm, "prefill": _prefill}[e.name]
    return build(server, repo, act, ONLINE_FP8.get(e.name, "") if online else "")


def _kv(engine: str, kv: str) -> str:
    return KV_NAMES[engine].get(kv, "auto")


# vLLM's and SGLang's flags, in the order written: the program, the checkpoint's flag ("": positional), TP, the
# activations' dtype, the KV cache's, the memory fraction, the running requests, the tokens a step.
FLAGS = {
    "vllm": ("vllm serve", "", "--tensor-parallel-size", "--dtype", "--kv-cache-dtype", "--gpu-memory-utilization",
             "--max-num-seqs", "--max-num-batched-tokens"),
    "sglang": ("python -m sglang.launch_server", "--model-path", "--tp-size", "--dtype", "--kv-cache-dtype",
               "--mem-fraction-static", "--max-running-requests", "--chunked-prefill-size"),
}  # fmt: skip


def _flags(server, repo: str, act: str, quant: str) -> Launch:
    """vLLM's or SGLang's line: each simulated setting with the engine's flag (FLAGS)."""
    e, tp = server.engine, server.tp
    program, model, tp_flag, dtype, kv, memory, running, tokens = FLAGS[e.name]
    words = [program, f"{model} {repo}".strip(), f"{tp_flag} {tp}", f"{dtype} {act}", quant]
    words += [f"{kv} {_kv(e.name, server.kv)}", f"{memory} {e.fraction(tp)}", f"{running} {e.max_seqs}"]
    return Launch(" ".join(w for w in [*words, f"{tokens} {e.token_budget}"] if w))


def _trtllm(server, repo: str, act: str, quant: str) -> Launch:
    """trtllm-serve's PyTorch backend: the KV cache's dtype only in the LLM API's YAML (kv_cache_config.dtype),
    the activations' the checkpoint's own (BF16 for every checkpoint in INSTRUCT and QUANTIZED)."""
    if act != "bfloat16":
        return Launch(missing=f"trtllm-serve computes in the checkpoint's dtype (bfloat16), not {act}")
    e, tp = server.engine, server.tp
    yaml = f"kv_cache_config:\n  dtype: {_kv('trtllm', server.kv)}\n"
    return Launch(
        f"trtllm-serve {repo} --backend pytorch --tp_size {tp} --max_batch_size {e.max_seqs} --max_num_tokens "
        f"{e.token_budget} --kv_cache_free_gpu_memory_fraction {e.fraction(tp)} --enable_chunked_prefill "
        "--extra_llm_api_options trtllm.yaml",
        (("trtllm.yaml", yaml),),
    )


def _prefill(server, repo: str, act: str, quant: str) -> Launch:
    """`prefill serve` on one GPU: no tensor parallelism, weights and K/V in a 16-bit dtype; its KV pool the
    positions simulated."""
    if server.tp > 1 or server.kv == "fp8":
        return Launch(missing="prefill serve runs one GPU with 16-bit K/V")
    mb = costs.kv_cache_bytes_for(server.spec, server.tokens, costs.dtype_bytes(server.kv)) / 2**20
    e = server.engine
    return Launch(
        f"prefill serve --model {repo} --device cuda --dtype {act} --weights {server.weights} --kv-dtype "
        f"{server.kv} --kv-cache-mb {mb:.0f} --max-running {e.max_seqs} --chunk-size {e.token_budget}"
    )
