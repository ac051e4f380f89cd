"""The operations of one forward pass, each with its FLOPs, the bytes it moves and the kernels it launches.

A forward runs a list of rows (Row: a sequence's new tokens, its cached past, how many of its positions are
unembedded) through one set of GEMMs of M = sum of new tokens rows, then attention row by row over each row's own
context. This is the engine's Block (prefill.model.transformer) written as arithmetic: per layer an RMSNorm, the
fused Q/K/V GEMM, rotary, the K/V write, attention, the output GEMM and residual, an RMSNorm, the fused gate/up
GEMM, SiLU x up, the down GEMM and residual; then the final norm and the unembedding of the asked positions only.

Torch-free. prefill.costmodel.timemodel turns these counts into seconds on a MachineProfile.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prefill.costmodel.costs import attended_pairs

if TYPE_CHECKING:
    from prefill.costmodel.specs import ModelSpec

# Kernels each operation launches in the eager engine (torch 2.13 on a CPU, counted with torch.profiler on one
# forward): RMSNorm is a composite of pow, mean, add, rsqrt and two muls; rotary is mul, neg, cat, mul, add; the
# K/V write makes K and V contiguous and index_copy_s both; the output projection first copies the heads back
# to [M, H_q d_head]. A fit adjusts the seconds per launch, not these counts.
# The formatter is off for this table alone: it reads better aligned.
# fmt: off
LAUNCHES = {
    "embed": 1, "norm": 6, "qkv": 1, "rotary": 5, "kv_write": 4, "attention": 1, "kv_gather": 2, "o": 2,
    "residual": 1, "gate_up": 1, "mlp_act": 2, "down": 1, "unembed": 1, "allreduce": 1,
}
# fmt: on
# Bytes each elementwise operation moves, in units of its tensor's size (every composite kernel reads its input
# and writes its output): RMSNorm 6 passes, rotary 10, a residual add 3 (two reads, one write), SiLU x up 2.5
# passes of [M, 2 d_ff] (SiLU reads and writes the gate half, the product reads both halves and writes one).
PASSES = {"norm": 6.0, "rotary": 10.0, "residual": 3.0, "mlp_act": 2.5, "kv_write": 4.0}


@dataclass(frozen=True)
class Row:
    """One sequence's share of a forward: `new` tokens at positions past .. past + new - 1, of which the last
    `logits` are unembedded (1 for a prefill or a decode step, `new` for scoring, 0 for a hidden-states pass)."""

    new: int
    past: int = 0
    logits: int = 1

    def __post_init__(self) -> None:
        if self.new < 1 or self.past < 0 or not 0 <= self.logits <= self.new:
            raise ValueError(f"a row needs new >= 1, past >= 0 and 0 <= logits <= new, got {self}")


@dataclass(frozen=True)
class Layout:
    """How an engine stores and runs the model (not the machine): bytes per weight as stored (float32 4, bf16 2,
    a GGUF block type its bits / 8), bytes per activation and per K/V element, tensor-parallel GPUs `tp`,
    `gathers_kv`: whether attention over a cached context first copies each row's K/V out of the pool, and
    `fused_below`: a forward of fewer tokens runs each block's work before and after attention as one operator
    each, and a forward of decode rows the whole block as one (GGUF blocks kept native; 0: never);
    `batched_attention`: attention is one kernel a layer over all the step's rows (a GPU engine's paged
    attention: FlashInfer, FlashAttention-3), not one a row (our engine's on a CPU); `eager_launches`: every
    operation launches its eager PyTorch kernels (LAUNCHES) even where attention is batched (our engine on a GPU);
    kv_bytes: 1 for an FP8 KV cache."""

    weight_bytes: float
    act_bytes: int
    kv_bytes: float
    tp: int = 1
    gathers_kv: bool = True
    fused_below: int = 0
    batched_attention: bool = False
    eager_launches: bool = False


@dataclass(frozen=True)
class Op:
    """One operation, `count` times in a forward (e.g. once per layer). flops, bytes and launches are per instance;
    `weight_bytes` of its bytes are weights and `pool_bytes` K/V read from the cache pool (both streamed from
    memory: a model or a pool larger than the cache never stays in it); M, K, N: a GEMM's shape; queries, keys:
    an attention row's new positions and the keys it reads; kind: gemm, attention, stream (elementwise and
    copies) or comm (an all-reduce over the GPUs' link)."""

    name: str
    kind: str
    flops: float
    bytes: float
    launches: int
    count: int = 1
    weight_bytes: float = 0.0
    pool_bytes: float = 0.0
    working_set: float | None = None  # bytes alive together with its activations (None: its own)
    M: int = 0
    K: int = 0
    N: int = 0
    queries: int = 0
    keys: int = 0


def visible_keys(new: int, past: int, window: int | None) -> int:
    """Keys the `new` queries at past .. past + new - 1 read in one layer: all past + new, or under a sliding
    window of W only those from past - W + 1 on (the oldest the first query may see)."""
    return past + new - (0 if window is None else max(0, past - window + 1))


def _gemm(name: str, M: int, K: int, N: int, lay: Layout, count: int, bias: bool = False) -> Op:
    weights = (K * N + (N if bias else 0)) * lay.weight_bytes
    acts = M * (K + N) * lay.act_bytes  # read the input rows, write the output rows
    return Op(name, "gemm", 2.0 * M * K * N, weights + acts, _launches(name, lay), count, weights, M=M, K=K, N=N)


def _stream(name: str, elements: float, lay: Layout, count: int) -> Op:
    return Op(name, "stream", 0.0, PASSES[name] * elements * lay.act_bytes, _launches(name, lay), count)


def _launches(name: str, lay: Layout) -> int:
    """Kernel launches of one instance of operation `name`: LAUNCHES', or one where the engine runs one kernel an
    operation (a GPU engine, batched_attention: fused RMSNorm, rotary, cache write and SiLU x up, as vLLM's
    csrc/layernorm_kernels.cu, pos_encoding_kernels.cu, cache_kernels.cu, activation_kernels.cu; not where its
    launches are eager_launches)."""
    return 1 if lay.batched_attention and not lay.eager_launches else LAUNCHES[name]


def layer_ops(spec: ModelSpec, rows: Sequence[Row], lay: Layout) -> list[Op]:
    """The operations of all L blocks for `rows`: the GEMMs and elementwise work once per layer (count = L),
    attention once per (row, window) group (each layer reads its own context: windowed layers read less)."""
    T = lay.tp
    M, L, d, dh = sum(r.new for r in rows), spec.L, spec.d_model, spec.d_head
    H_q, H_kv = gpu_heads(spec, T)
    qkv_out = (H_q + 2 * H_kv) * dh
    ops = [
        _stream("norm", M * d, lay, L * (2 if not spec.family.post_norms else 4)),
        _gemm("qkv", M, d, qkv_out, lay, L, spec.qkv_bias),
        _stream("rotary", M * (H_q + H_kv) * dh, lay, L),
        _stream("kv_write", 2 * M * H_kv * dh, lay, L),
        _gemm("o", M, H_q * dh, d, lay, L),
        _stream("residual", M * d, lay, 2 * L),
        _gemm("gate_up", M, d, 2 * spec.d_ff // T, lay, L),
        _stream("mlp_act", M * 2 * spec.d_ff // T, lay, L),
        _gemm("down", M, spec.d_ff // T, d, lay, L),
    ]
    if spec.qk_norm:
        ops.append(_stream("norm", M * (H_q + H_kv) * dh, lay, L))
    ops += attention_ops(spec, rows, lay, H_q, H_kv)
    if fuses(rows, lay):
        ops = fused_launches(ops, decode=all(r.new == 1 for r in rows))
    if T > 1:  # two all-reduces of the [M, d_model] activations per layer (after attention, after the MLP)
        ring = 2 * (T - 1) / T * M * d * lay.act_bytes
        ops.append(Op("allreduce", "comm", 0.0, ring, _launches("allreduce", lay), 2 * L))
    return ops


def gpu_heads(spec: ModelSpec, T: int) -> tuple[int, int]:
    """Query and K/V heads on one of T GPUs (K/V heads replicated past H_kv)."""
    return spec.H_q // T, math.ceil(spec.H_kv / T)


def fuses(rows: Sequence[Row], lay: Layout) -> bool:
    """Whether a forward of `rows` runs each block as the fused operators (fused_launches): below the layout's
    fused_below tokens, in every family (the operators take the q/k norms, the norms after attention and the
    MLP, and the GELU gate as arguments)."""
    return 0 < sum(r.new for r in rows) < lay.fused_below


# The layer's operations inside the fused operators (prefill.model.quant.fused): pre_attention holds the norm,
# Q/K/V and rotary, post_attention the output projection, residuals, norm and MLP; each launches once.
FUSED_INTO = {"pre": ("norm", "qkv", "rotary"), "post": ("o", "residual", "gate_up", "mlp_act", "down")}


def fused_launches(ops: list[Op], decode: bool) -> list[Op]:
    """The layer's launches under the fused operators: one a block for decode rows (attention and the K/V write
    included), else one before attention and one after it (the K/V write and attention keep theirs)."""
    if decode:
        return [replace(o, launches=int(o.name == "qkv")) for o in ops]
    fused = {name for names in FUSED_INTO.values() for name in names}
    return [replace(o, launches=int(o.name in ("qkv", "o"))) if o.name in fused else o for o in ops]


def attention_ops(spec: ModelSpec, rows: Sequence[Row], lay: Layout, H_q: int, H_kv: int) -> list[Op]:
    """Attention per row and per distinct window: 4 H_q d_head FLOPs per attended (query, key) pair (QK^T and
    AV); bytes: Q read and O written, the visible K and V read (and, where the engine gathers, copied first: the
    copies of all rows are alive together, so they share one working set)."""
    counts: dict[int | None, int] = {}
    for w in spec.windows:
        counts[w] = counts.get(w, 0) + 1
    dh, ops = spec.d_head, []
    how = (H_q, H_kv, dh, lay.kv_bytes, lay.act_bytes, lay.gathers_kv, lay.batched_attention)
    for window, n_layers in counts.items():
        each = [_row_attention(row.new, row.past, window, *how) for row in rows]
        together = sum(nbytes - pool for _, nbytes, _, pool, _, _ in each)
        if lay.batched_attention:  # one kernel a layer (a GPU engine's paged attention: FlashInfer, FA3)
            ops.append(batched(each, n_layers, 4.0 * H_q * dh, together))
            continue
        ops += [
            Op(
                "attention",
                "attention",
                4.0 * H_q * dh * pairs,
                nbytes,
                launches,
                n_layers,
                pool_bytes=pool,
                queries=new,
                keys=keys,
                working_set=together,
            )
            for pairs, nbytes, launches, pool, new, keys in each
        ]
    return ops


@functools.lru_cache(maxsize=1 << 16)
def _row_attention(new: int, past: int, window: int | None, H_q: int, H_kv: int, dh: int, kv_bytes: float,
                   act_bytes: int, gathers_kv: bool, batched_attention: bool) -> tuple:  # fmt: skip
    """One row's attention in one layer: (pairs, bytes, launches, pool bytes, queries, keys). Remembered: a
    simulation meets the same (new tokens, past) in row after row, thousands of times."""
    pairs = attended_pairs(new, past, window)
    keys = visible_keys(new, past, window)
    kv = 2 * H_kv * keys * dh * kv_bytes
    gather = gathers_kv and past > 0  # a cached context is copied out of the pool, then read
    nbytes = 2 * H_q * new * dh * act_bytes + kv * (3 if gather else 1)
    one = {"attention": 1, "kv_gather": 1} if batched_attention else LAUNCHES  # as _launches counts them
    launches = one["attention"] + (one["kv_gather"] if gather else 0)
    pool = kv * (keys - new) / keys  # the cached keys come from the pool's memory, the new from cache
    return pairs, nbytes, launches, pool, new, keys


def batched(each: list[tuple], count: int, flops_per_pair: float, together: float) -> Op:
    """The rows' attention as one kernel (per layer), from each row's (pairs, bytes, launches, pool bytes,
    queries, keys): the FLOPs of every row's (query, key) pairs and the bytes of every row's K/V at its own
    context, one launch; its rate is read at the step's queries and longest keys. No Op a row: a simulated
    step of hundreds of rows builds one."""
    pairs, nbytes, _, pool, new, keys = zip(*each, strict=True)
    flops, queries = flops_per_pair * sum(pairs), sum(new)
    return Op(
        "attention",
        "attention",
        flops,
        sum(nbytes),
        1,
        count,
        pool_bytes=sum(pool),
        queries=queries,
        keys=max(keys),
        working_set=together,
    )


def forward_ops(spec: ModelSpec, rows: Sequence[Row], lay: Layout) -> list[Op]:
    """Every operation of one forward of `rows`: the embedding gather, the L blocks (layer_ops), the final norm
    and the unembedding of the positions whose logits are asked (sum of row.logits; vocabulary split over T)."""
    if not rows:
        raise ValueError("a forward needs at least one row")
    M, d = sum(r.new for r in rows), spec.d_model
    M_out = sum(r.logits for r in rows)
    ops = [Op("embed", "stream", 0.0, 2 * M * d * lay.act_bytes, _launches("embed", lay))]
    ops += layer_ops(spec, rows, lay)
    if M_out:
        ops.append(_stream("norm", M_out * d, lay, 1))
        ops.append(_gemm("unembed", M_out, d, math.ceil(spec.vocab_size / lay.tp), lay, 1))
    return ops
