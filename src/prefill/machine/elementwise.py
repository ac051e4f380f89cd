"""The engine's elementwise work, timed at the model's own shapes: the rate at which the time model's elementwise
operations (norms, rotary, the K/V write, residual adds, the MLP's activation; prefill.costmodel.ops counts their
bytes) run on this CPU.

    measure_elementwise_rate(spec, dtype)   bytes/s, as the time model counts them, of a block's elementwise work

A CPU does not run them at its cache's bandwidth: in bfloat16 each element is converted to add it, SiLU is a
transcendental, rotary reads strided views. So they are timed on the engine's own two block functions
(prefill.model.transformer.qkv_rotary and out_and_mlp, with GEMMs that cost nothing) and its K/V write, at two
prompt lengths, so the launches' fixed time cancels: (bytes at P2 - bytes at P1) / (seconds at P2 - at P1),
each block right after a GEMV that streams weights, as in a forward (probe.after_streaming). On the AMX Xeon VM:
float32 47-49 GB/s and bfloat16 20-22 GB/s (as back to back), where a float32 add in the cache ran at 187 GB/s.
"""

from __future__ import annotations

from prefill.costmodel import ops
from prefill.costmodel.costs import canonical_dtype
from prefill.costmodel.specs import ModelSpec
from prefill.machine.probe import after_streaming, streamer

LENGTHS = (64, 256)  # the two prompt lengths (activations of a few MB: within any CPU's cache)


def measure_elementwise_rate(spec: ModelSpec, dtype: str, device: str = "cpu") -> float:
    """Bytes/s of one block's elementwise work at the model's shapes in `dtype`, its bytes as the time model
    counts them (the slope between two prompt lengths; the larger one's average if noise inverts them)."""
    stream = streamer(device, dtype)
    (b1, t1), (b2, t2) = (_measured(spec, dtype, device, P, stream) for P in LENGTHS)
    return (b2 - b1) / (t2 - t1) if t2 > t1 else b2 / t2


def _measured(spec: ModelSpec, dtype: str, device: str, P: int, stream) -> tuple[float, float]:
    """(bytes the time model counts, seconds) of one block's elementwise work on P tokens, after a GEMV."""
    from prefill.costmodel.timemodel import layout_for

    layout = layout_for(canonical_dtype(dtype))
    work = [op for op in ops.layer_ops(spec, [ops.Row(P)], layout) if op.kind == "stream"]
    block, x = _block(spec, dtype, device, P)
    return sum(op.bytes * op.count for op in work) / spec.L, after_streaming(block, stream, lambda: x.mul_(1))


def _block(spec: ModelSpec, dtype: str, device: str, P: int):
    """A callable running the engine's block on P tokens with free GEMMs (the work around them, and its K/V
    write), and its input x [1, P, d_model]."""
    import torch

    from prefill.model.transformer import out_and_mlp, qkv_rotary

    dt = getattr(torch, canonical_dtype(dtype))
    d, H_q, H_kv, dh, ff = spec.d_model, spec.H_q, spec.H_kv, spec.d_head, spec.d_ff
    outs: dict = {}

    def free(x, w, b=None):  # a GEMM's output [..., N], made once: its cost is the GEMM curves'
        key = (tuple(x.shape[:-1]), w.shape[0])
        if key not in outs:
            outs[key] = zeros(*key[0], key[1])
        return outs[key]

    def ones(*shape):
        return torch.ones(*shape, dtype=dt, device=device)

    def zeros(*shape):
        return torch.zeros(*shape, dtype=dt, device=device)

    x, norm, head_norm = torch.randn(1, P, d, device=device).to(dt), ones(d), ones(dh) if spec.qk_norm else None
    post = ones(d) if spec.family.post_norms else None
    w_qkv, w_o = torch.empty((H_q + 2 * H_kv) * dh, d, dtype=dt), torch.empty(d, H_q * dh, dtype=dt)  # never read
    w_gate_up, w_down = torch.empty(2 * ff, d, dtype=dt), torch.empty(d, ff, dtype=dt)
    cos, sin = ones(1, P, 1, dh), ones(1, P, 1, dh)  # [B, P, 1, d_head]
    pool_k, pool_v = zeros(H_kv, P, dh), zeros(H_kv, P, dh)  # one layer's pool [H_kv, slots, d_head]
    slots, o = torch.arange(P, device=device), zeros(1, H_q, P, dh)  # o: attention's output [B, H_q, P, d_head]
    gelu = spec.family.activation == "gelu_tanh"

    def block() -> None:
        _, k, v = qkv_rotary(x, norm, 1e-6, w_qkv, None, head_norm, head_norm, cos, sin, H_q, H_kv, lin=free)
        pool_k.index_copy_(1, slots, k[0])  # the K/V write (prefill.model.batch.ForwardBatch.store)
        pool_v.index_copy_(1, slots, v[0])
        out_and_mlp(x, o, w_o, norm, 1e-6, w_gate_up, w_down, post, post, gelu, lin=free)

    return block, x
