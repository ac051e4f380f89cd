"""prefill: see, measure and predict the first phase of LLM inference.

The cost model, the causal rule and model specs import no torch, so `import prefill` stays fast.
"""

from prefill.costmodel.causal import causal_mask, causal_pairs, prefill_matches_sequential
from prefill.costmodel.costs import (
    Calibration,
    FlopCount,
    attended_pairs,
    bytes_to_mb,
    bytes_to_mib,
    calibrated_prefill_seconds,
    canonical_dtype,
    compute_seconds,
    decode_rate,
    dtype_bytes,
    format_bytes,
    kv_cache_bytes,
    kv_cache_bytes_for,
    max_context_tokens,
    mfu,
    prefill_flops,
    prefill_flops_exact,
    prefill_seconds,
    request_output_rate,
    request_seconds,
    scoring_flops_exact,
    ttft_seconds,
)
from prefill.costmodel.hardware import HARDWARE, Hardware, load_calibration, save_calibration
from prefill.costmodel.ops import Row
from prefill.costmodel.parallel import (
    ring_allreduce_bytes_per_gpu,
    tp_allreduce_payload_bytes,
    tp_allreduce_seconds,
    tp_flops_per_gpu,
    tp_kv_cache_bytes_per_gpu,
)
from prefill.costmodel.profile import MachineProfile, catalog_profile
from prefill.costmodel.roofline import (
    bound,
    compute_bound_prompt_length,
    decode_intensity,
    prefill_bytes_moved,
    prefill_intensity,
    ridge_point,
    weight_reuse_intensity,
)
from prefill.costmodel.specs import PRESETS, ModelSpec, load_spec
from prefill.costmodel.timemodel import Prediction, predict_decode, predict_prefill, predict_scoring, predict_step
from prefill.errors import BadInput, ModelFileError, PrefillError

_LAZY = {  # torch-backed names, imported on first use so the calculator starts fast
    "Engine": "prefill.engine.llm",
    "Generation": "prefill.engine.request",
    "KVPool": "prefill.engine.kvcache",
    "Request": "prefill.engine.request",
    "SeqKV": "prefill.engine.kvcache",
    "StepLoop": "prefill.engine.loop",
    "SamplingParams": "prefill.engine.sampling",
    "Scores": "prefill.engine.scoring",
    "perplexity": "prefill.engine.scoring",
    "score": "prefill.engine.scoring",
    "Transformer": "prefill.model.transformer",
    "measure_gemm_rate": "prefill.machine.probe",  # the machine's one probe (imports torch when called)
    "profile_for": "prefill.machine.profiles",
    "get_hardware": "prefill.machine.profiles",  # a catalog GPU, or "cpu": this machine, measured
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'prefill' has no attribute {name!r}")


__all__ = [
    "Engine",
    "Generation",
    "KVPool",
    "Request",
    "SeqKV",
    "StepLoop",
    "SamplingParams",
    "Scores",
    "perplexity",
    "score",
    "catalog_profile",
    "predict_decode",
    "predict_prefill",
    "predict_scoring",
    "predict_step",
    "profile_for",
    "scoring_flops_exact",
    "Transformer",
    "HARDWARE",
    "PRESETS",
    "BadInput",
    "Calibration",
    "FlopCount",
    "Hardware",
    "MachineProfile",
    "Prediction",
    "Row",
    "ModelFileError",
    "ModelSpec",
    "PrefillError",
    "attended_pairs",
    "bound",
    "bytes_to_mb",
    "bytes_to_mib",
    "calibrated_prefill_seconds",
    "canonical_dtype",
    "causal_mask",
    "causal_pairs",
    "compute_bound_prompt_length",
    "compute_seconds",
    "decode_intensity",
    "decode_rate",
    "dtype_bytes",
    "format_bytes",
    "get_hardware",
    "kv_cache_bytes",
    "kv_cache_bytes_for",
    "load_calibration",
    "load_spec",
    "max_context_tokens",
    "measure_gemm_rate",
    "mfu",
    "prefill_bytes_moved",
    "prefill_flops",
    "prefill_flops_exact",
    "prefill_intensity",
    "prefill_matches_sequential",
    "prefill_seconds",
    "request_output_rate",
    "request_seconds",
    "ridge_point",
    "save_calibration",
    "ring_allreduce_bytes_per_gpu",
    "tp_allreduce_payload_bytes",
    "tp_allreduce_seconds",
    "tp_flops_per_gpu",
    "tp_kv_cache_bytes_per_gpu",
    "ttft_seconds",
    "weight_reuse_intensity",
]
