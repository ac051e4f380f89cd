"""GGUF-quantized weights kept as their blocks: the weight type, the modules, and the GEMM operator.

QuantWeight     a [N, K] weight as raw GGUF blocks (weight.py)
linear          F.linear for a dense or quantized weight: what every projection and the unembedding call
QuantLinear, QuantEmbedding, place_weight       the modules a loaded model holds (modules.py)
ops             the operator: C++ kernels (csrc/, built by build.py) or the portable torch path
"""

from prefill.model.quant.modules import QuantEmbedding, QuantLinear, place_weight
from prefill.model.quant.weight import KERNEL_TYPES, QuantWeight, cat_rows, linear

__all__ = ["KERNEL_TYPES", "QuantEmbedding", "QuantLinear", "QuantWeight", "cat_rows", "linear", "place_weight"]
