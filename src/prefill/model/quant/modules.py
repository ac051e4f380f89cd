"""The modules a model holds in place of nn.Linear / nn.Embedding when its weights stay GGUF blocks.

Each keeps its QuantWeight as `.weight`, so the block's code (`blk.wqkv.weight` handed to the pure per-block
functions, which call `linear`) is the same for dense and quantized weights. `place_weight` is the one way a
loaded weight reaches a model: a dense tensor is copied into the existing parameter, a QuantWeight swaps the
module.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from prefill.errors import ModelFileError
from prefill.model.quant.activations import check
from prefill.model.quant.weight import QuantRows, QuantWeight


class QuantLinear(nn.Module):
    """y = x W^T + b with W a QuantWeight or QuantRows [N, K] (b dense, optional)."""

    def __init__(self, weight: QuantWeight | QuantRows, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = weight
        parts = weight.parts if isinstance(weight, QuantRows) else (weight,)
        for i, part in enumerate(parts):  # so .to() / memory reports see them
            self.register_buffer("blocks" if i == 0 else f"blocks{i}", part.blocks, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight.matmul(x)  # [..., N]
        return y if self.bias is None else y + self.bias


class QuantEmbedding(nn.Module):
    """Token embeddings from a QuantWeight [vocab, d_model]: a lookup decodes only the rows it reads."""

    def __init__(self, weight: QuantWeight):
        super().__init__()
        self.weight = weight
        self.register_buffer("blocks", weight.blocks, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.rows(ids.reshape(-1)).view(*ids.shape, self.weight.K)  # [..., d_model]


def place_weight(owner: nn.Module, name: str, value, put: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
    """Load `value` as the weight of `owner.<name>` (an nn.Linear or nn.Embedding): a dense tensor through
    `put` into the existing parameter, a QuantWeight or QuantRows by replacing the module (a linear's bias is
    kept)."""
    module = getattr(owner, name)
    if not isinstance(value, QuantWeight | QuantRows):
        put(module.weight, value)
        return
    if tuple(module.weight.shape) != value.shape:
        raise ModelFileError(f"weight shape {value.shape} does not fit {tuple(module.weight.shape)}")
    value = value.pack()  # the x8 layout the kernels read fastest (weight.py), where they cover the type
    if isinstance(module, nn.Embedding):
        setattr(owner, name, QuantEmbedding(value))
    else:
        setattr(owner, name, QuantLinear(value, getattr(module, "bias", None)))


def set_activations(model: nn.Module, path: str) -> int:
    """Put every quantized matrix of `model` (QuantLinear and QuantEmbedding weights: a tied embedding is also
    the unembedding's weight) on activation path `path` (f32 | q8, prefill.model.quant.activations), in place;
    returns how many weights it set. An embedding's lookups decode rows and have no activations either way. The
    fused operators read the path from the weights' type ids at their next call."""
    check(path)
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, QuantLinear | QuantEmbedding)}
    for w in weights.values():
        w.activations = path
    return len(weights)
