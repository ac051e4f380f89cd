"""GGUF-quantized weights kept as their blocks: the weight type, the modules, and the GEMM operator.

QuantWeight     a [N, K] weight as raw GGUF blocks (weight.py)
QuantRows       weights of several GGUF types stacked by rows (a Q4_K_M file's Q/K/V), each kept as its blocks
linear          F.linear for a dense or quantized weight: what every projection and the unembedding call
QuantLinear, QuantEmbedding, place_weight       the modules a loaded model holds (modules.py)
ops             the operator: C++ kernels (csrc/, built by build.py) or the portable torch path
activations     the activation paths (f32 reference, q8: 8-bit activations, integer dot products), PREFILL_ACTIVATIONS
set_activations put a loaded model's quantized projections on one path
"""

from prefill.model.quant.activations import PATHS as ACTIVATION_PATHS
from prefill.model.quant.modules import QuantEmbedding, QuantLinear, place_weight, set_activations
from prefill.model.quant.weight import KERNEL_TYPES, QuantRows, QuantWeight, cat_rows, linear

__all__ = [
    "ACTIVATION_PATHS",
    "KERNEL_TYPES",
    "QuantEmbedding",
    "QuantLinear",
    "QuantRows",
    "QuantWeight",
    "cat_rows",
    "linear",
    "place_weight",
    "set_activations",
]
