"""The two per-block functions (prefill.model.transformer's qkv_rotary and out_and_mlp) as one operator each,
for blocks whose projections are GGUF blocks: a decode step then pays 2 dispatches per layer instead of ~25
small torch ops, which on a CPU cost as much as the layer's GEMMs. A forward of decode rows only goes further:
`decode_block` runs the whole block, attention over the pool included, as one operator (bitwise the same).

Same signatures, same arithmetic (csrc/fused.cpp), every family's block: Qwen3's and Gemma's q/k norms, Gemma's
norms after attention and the MLP and its GELU-tanh gate are arguments. `install(model)` puts them in the model's
Kernels. Dense weights and prompts long enough for the float32 copy (QuantWeight.uses_dense) run the model's own
functions unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from prefill.model.quant import ops
from prefill.model.quant.weight import QuantRows, QuantWeight, linear


def _native(w, rows: int) -> bool:
    return isinstance(w, QuantWeight | QuantRows) and not w.uses_dense(rows)


def _qkv(w) -> tuple[list[torch.Tensor], list[int]]:
    """The Q/K/V weight as the operators take it: its blocks and type ids, one matrix or part by part."""
    parts = w.parts if isinstance(w, QuantRows) else (w,)
    return [p.blocks for p in parts], [p.type_id for p in parts]


class BlockArgs(NamedTuple):
    """A block's arguments of decode_block that no step changes."""

    head: tuple  # attention norm, eps, Q/K/V blocks, types, bias
    tail: tuple  # W_o blocks, type, MLP norm, gate/up blocks, type, down blocks, type, q/k norms, post norms, gelu
    H_q: int
    H_kv: int
    scale: float
    weights: tuple  # the four QuantWeights
    dense_from: int  # from this many rows one of them may run over its float32 copy


def _block_arguments(blk) -> BlockArgs | None:
    """The block's fixed arguments, or None when the operator does not cover it."""
    from prefill.model.transformer import norm_weight  # the model's own (it imports this package)

    weights = (blk.wqkv.weight, blk.wo.weight, blk.w_gate_up.weight, blk.w_down.weight)
    if not all(isinstance(w, QuantWeight | QuantRows) for w in weights):
        return None
    w_qkv, w_o, w_gu, w_down = weights
    head = (blk.attn_norm.weight, blk.eps, *_qkv(w_qkv), blk.wqkv.bias)
    tail = (w_o.blocks, w_o.type_id, blk.mlp_norm.weight, w_gu.blocks, w_gu.type_id, w_down.blocks, w_down.type_id)
    norms = (blk.q_norm, blk.k_norm, blk.attn_post_norm, blk.mlp_post_norm)
    tail += (*(norm_weight(n) for n in norms), blk.gelu)
    dense_from = min(w.dense_min_m if w.dense_min_m > 0 else 2**62 for w in weights)
    return BlockArgs(head, tail, blk.H_q, blk.H_kv, blk.scale, weights, dense_from)


def install(model) -> bool:
    """Swap the fused functions into `model.kernels` when its blocks hold GGUF blocks and the kernels are built;
    returns whether it did."""
    blk = model.layers[0]
    if not (isinstance(blk.wqkv.weight, QuantWeight | QuantRows) and ops.available()):
        return False
    from prefill.model import transformer

    model.kernels.qkv_rotary = _fused_qkv_rotary(transformer.qkv_rotary)
    model.kernels.out_and_mlp = _fused_out_and_mlp(transformer.out_and_mlp)
    model.kernels.decode_block = _fused_decode_block()
    return True


def _fused_qkv_rotary(eager_qkv):
    """The block's norm, QKV projection and rotary as one operator where it covers them, else `eager_qkv`."""

    def qkv_rotary(x, norm_w, eps, w_qkv, b_qkv, q_norm_w, k_norm_w, cos, sin, H_q, H_kv, lin=None):
        B, P, _ = x.shape
        if x.dtype != torch.float32 or not _native(w_qkv, B * P):
            return eager_qkv(x, norm_w, eps, w_qkv, b_qkv, q_norm_w, k_norm_w, cos, sin, H_q, H_kv, lin or linear)
        # q [B, H_q, P, d_head], k, v [B, H_kv, P, d_head]
        return torch.ops.prefill_quant.pre_attention(
            x, norm_w, eps, *_qkv(w_qkv), b_qkv, cos, sin, H_q, H_kv, q_norm_w, k_norm_w
        )

    return qkv_rotary


def _fused_out_and_mlp(eager_out):
    """The output projection, residual, norm and MLP as one operator where it covers them, else `eager_out`."""

    def out_and_mlp(x, o, w_o, norm_w, eps, w_gate_up, w_down, post_attn_w=None, post_mlp_w=None, gelu=False, lin=None):
        B, H_q, P, d = o.shape
        if not all(_native(w, B * P) for w in (w_o, w_gate_up, w_down)):
            return eager_out(x, o, w_o, norm_w, eps, w_gate_up, w_down, post_attn_w, post_mlp_w, gelu, lin or linear)
        D = x.shape[-1]
        return torch.ops.prefill_quant.post_attention(
            x.reshape(B * P, D),
            o.transpose(1, 2).reshape(B * P, H_q * d),
            w_o.blocks,
            w_o.type_id,
            norm_w,
            eps,
            w_gate_up.blocks,
            w_gate_up.type_id,
            w_down.blocks,
            w_down.type_id,
            post_attn_w,
            post_mlp_w,
            gelu,
        ).view(B, P, D)

    return out_and_mlp


def _fused_decode_block():
    """The whole block as one operator over a step's decode rows (see decode_block), with each block's fixed
    arguments gathered once."""
    fixed: dict[tuple, BlockArgs | None] = {}  # (id(block), path) -> its arguments that no step changes

    def decode_block(blk, x, cos, sin, batch, layer):
        """The block as one operator when every token of the forward is a query of the paged kernel (decode
        rows: then they are the batch's tokens in order) and the block is one the operators cover; else None.
        The block's own arguments (weights, norms, types) are gathered once: a step's Python between layers
        is time the second thread spends waiting."""
        paged, N = batch.paged, x.shape[1]  # x [1, N, d_model]
        if paged is None or paged.index.shape[0] != N or x.dtype != torch.float32:
            return None
        key = (id(blk), blk.wqkv.weight.activations)  # the type ids carry the path (set_activations)
        if key not in fixed:
            fixed[key] = _block_arguments(blk)
        a = fixed[key]
        if a is None or (a.dense_from <= N and not all(_native(w, N) for w in a.weights)):
            return None
        g = batch.group_of[layer]
        table, first_block, first, end = paged.tables[g]
        d = cos.shape[-1]
        out = torch.ops.prefill_quant.decode_block(
            x.view(N, -1),  # [N, d_model]
            *a.head,
            cos.view(N, d),  # [N, d_head]
            sin.view(N, d),
            a.H_q,
            a.H_kv,
            batch.k[layer],  # [H_kv, n_slots, d_head]: the new K/V are written here, then attention reads it
            batch.v[layer],
            batch.write[g],  # [N]: each token's slot
            table,
            first_block,
            first,
            end,
            paged.block_size,
            a.scale,
            *a.tail,
        )
        return out.view(1, N, -1)  # [1, N, d_model]

    return decode_block
