"""The lesson's probe: the attention weights of one layer and head, A = softmax(mask(Q K^T / sqrt(d_head))).

A separate, explicit computation for the lesson page: it runs the model's own block functions (`Block.qkv`,
`causal_attention`, `Block.finish`) up to the chosen layer without a KV cache, so the normal prefill path stays
as it is (the fused kernels there never form the P x P matrix). P is capped: the matrix is P^2 numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefill.errors import BadInput
from prefill.model.attention import causal_attention, visible
from prefill.model.transformer import Transformer

MAX_P = 64  # the largest prompt whose attention matrix the page asks for


@dataclass(frozen=True)
class LayerQKV:
    """Q [1, H_q, P, d_head] and K, V [1, H_kv, P, d_head] of one layer, as the prefill computes them."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def run_layers(model: Transformer, ids: list[int], layers: int) -> tuple[torch.Tensor, list]:
    """The hidden states x [1, P, d_model] after the first `layers` blocks for the prompt `ids` (positions
    0..P-1, as a prefill from an empty cache, without one), and every layer's rotary tables."""
    device = model.embed.weight.device
    x = model.embed_tokens(torch.tensor([ids], dtype=torch.long, device=device))  # [1, P, d_model]
    positions = torch.arange(len(ids), device=device)[None]  # [1, P]: 0..P-1
    tables = model.rope_tables(positions, x.dtype)  # per layer: cos, sin [1, P, 1, d_head]
    for block, (cos, sin) in zip(model.layers[:layers], tables, strict=False):
        q, k, v = block.qkv(x, cos, sin)
        x = block.finish(x, causal_attention(q, k, v, 0, block.window, block.scale))  # [1, P, d_model]
    return x, tables


@torch.inference_mode()
def layer_qkv(model: Transformer, ids: list[int], layer: int) -> LayerQKV:
    """Q, K, V of `layer` for the prompt `ids` (positions 0..P-1): the layers before it run in full."""
    L = len(model.layers)
    if not 0 <= layer < L:
        raise BadInput(f"layer must be in [0, {L}), got {layer}")
    x, tables = run_layers(model, ids, layer)
    return LayerQKV(*model.layers[layer].qkv(x, *tables[layer]))


@torch.inference_mode()
def attention_weights(model: Transformer, ids: list[int], layer: int, head: int) -> torch.Tensor:
    """A [P, P] float32 for query head `head` of `layer`: row i is how token i spreads its attention over
    tokens 0..i. The upper triangle is exactly 0 (the mask) and every row sums to 1 (the softmax).

    Query head h reads K/V head h // (H_q / H_kv), as grouped-query attention does.
    """
    spec = model.spec
    P = len(ids)
    if not 1 <= P <= MAX_P:
        raise BadInput(f"attention weights are shown for prompts of 1..{MAX_P} tokens; this one has {P}")
    if not 0 <= head < spec.H_q:
        raise BadInput(f"head must be in [0, {spec.H_q}), got {head}")
    t = layer_qkv(model, ids, layer)
    q = t.q[0, head].float()  # [P, d_head]
    k = t.k[0, head // (spec.H_q // spec.H_kv)].float()  # [P, d_head]
    scores = q @ k.T * spec.attention_scale  # [P, P]: scaled by d_head^-1/2 (Gemma: query_pre_attn_scalar^-1/2)
    pos = torch.arange(P, device=scores.device)
    hidden = ~visible(pos[:, None], pos[None, :], spec.windows[layer])  # [P, P]: the future; in a windowed layer
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1).cpu()  # also the too old. [P, P]


@dataclass(frozen=True)
class AttentionMap:
    """attention_weights as plain numbers for the page, with the two checks it shows: every row sums to 1, and
    the upper triangle (the masked future) is exactly 0."""

    weights: list[list[float]]  # [P][P]
    row_sums: list[float]  # [P]
    upper_max: float  # largest |weight| above the diagonal


def attention_map(model: Transformer, ids: list[int], layer: int, head: int) -> AttentionMap:
    """attention_weights and its checks, every tensor op on the calling thread (the server's worker: a torch op
    on another thread, even a small triu, can start a second OpenMP pool; see prefill.machine.openmp)."""
    A = attention_weights(model, ids, layer, head)  # [P, P]
    return AttentionMap(A.tolist(), A.sum(-1).tolist(), float(A.triu(1).abs().max()))


@dataclass(frozen=True)
class NextToken:
    """The first answer token's distribution, as plain numbers: the `top` most likely (id, probability), and for
    each id looked up, (id, rank from 1, probability)."""

    top: list[tuple[int, float]]
    looked: list[tuple[int, int, float]]


@torch.inference_mode()
def next_token(model: Transformer, ids: list[int], top: int, lookup: list[int]) -> NextToken:
    """softmax of the logits at the prompt's last position (every layer, the final norm and the unembedding, as
    the model's forward computes them, float32), its `top` most likely tokens, and the rank and probability of
    each id in `lookup`. Every tensor op on the calling thread (the server's worker)."""
    x, _ = run_layers(model, ids, len(model.layers))
    probs = torch.softmax(model.logits(model.norm(x[0, -1])), dim=-1)  # [vocab] float32
    p, i = probs.topk(top)
    looked = [(t, int((probs > probs[t]).sum()) + 1, float(probs[t])) for t in lookup]
    return NextToken(list(zip(i.tolist(), p.tolist(), strict=True)), looked)
