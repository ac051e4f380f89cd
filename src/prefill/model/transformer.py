"""The decoder: RMSNorm, rotary embedding, grouped-query attention, gated MLP, tied or untied unembedding.

One Block covers every family of prefill.costmodel.families: Llama 2/3, Mistral (sliding window), Qwen2/2.5 (QKV bias),
Qwen3 (q/k RMSNorm), SmolLM2, and Gemma 3 (embeddings scaled by sqrt(d_model), RMSNorm with 1 + w, norms after
attention and after the MLP too, GELU-tanh gate, local layers with a sliding window and their own rotary base).
What differs is a flag of the family's table entry, never a subclass. It knows nothing of files: weights arrive
as a Hugging Face-named state dict (see `load_hf_state_dict`).

Prefill runs all P prompt tokens in one pass: one GEMM per projection over [B, P, d_model], causal attention
(prefill.model.attention: no P x P mask, K/V never repeated per query head), and the unembedding on the last
position only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from prefill.costmodel.families import check_runnable
from prefill.costmodel.specs import ModelSpec
from prefill.errors import ModelFileError
from prefill.model.attention import attend
from prefill.model.batch import ForwardBatch
from prefill.model.kernels import few_rows_linear, invariant_linear
from prefill.model.quant import cat_rows, linear, place_weight


def check_supported(spec: ModelSpec) -> None:
    """Refuse, with a clear error, an architecture this decoder does not implement (prefill.costmodel.families)."""
    check_runnable(spec.arch)
    if spec.attn_softcap:  # no runnable family sets it (Gemma 3 ignores the key, as transformers does)
        raise ModelFileError(f"{spec.name}: attention soft-capping (Gemma 2) is not implemented")


class RMSNorm(nn.Module):
    """x / rms(x) * weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused kernel (it accumulates in float32 for bfloat16 inputs too).
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_inv_freq(spec: ModelSpec, local: bool = False) -> torch.Tensor:
    """Inverse frequencies [d_head / 2] of the global layers (rope_theta, with the config's scaling: Llama-3
    or linear), or of the windowed layers when they have their own base (`local`: rope_local_theta, unscaled)."""
    d = spec.d_head
    theta = spec.rope_local_theta if local else spec.rope_theta
    # on the CPU even inside a meta-device scope (meta arange goes through torch._refs, which imports dynamo)
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d))
    rs = {} if local else spec.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = ((old / wavelen) - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif kind == "linear":  # positions divided by the factor (Gemma 3 4B and larger)
        inv = inv / rs["factor"]
    elif kind not in (None, "default"):
        raise ModelFileError(f"rope scaling type {kind!r} is not supported")
    return inv.float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def qkv_rotary(x, norm_w, eps: float, w_qkv, b_qkv, q_norm_w, k_norm_w, cos, sin, H_q: int, H_kv: int, lin=linear):
    """RMSNorm, the Q/K/V projection in one GEMM, and rotary on Q and K: the work before attention.

    x [B, P, d_model] -> q [B, H_q, P, d_head], k and v [B, H_kv, P, d_head]. A pure function of its tensors, so
    one compiled graph (Transformer.compile) serves every layer. `lin` is the GEMM (F.linear, or the
    batch-invariant one: Kernels).
    """
    B, P, _ = x.shape
    h = F.rms_norm(x, norm_w.shape, norm_w, eps)  # [B, P, d_model]
    qkv = lin(h, w_qkv, b_qkv)  # [B, P, (H_q + 2 H_kv) d_head]
    qkv = qkv.view(B, P, H_q + 2 * H_kv, -1)  # [B, P, H_q + 2 H_kv, d_head]
    qk, v = qkv[:, :, : H_q + H_kv], qkv[:, :, H_q + H_kv :]  # [B, P, H_q + H_kv, d_head], [B, P, H_kv, d_head]
    if q_norm_w is not None:  # Qwen3: RMSNorm of each head's q and k
        q, k = qk[:, :, :H_q], qk[:, :, H_q:]
        qk = torch.cat([F.rms_norm(q, q_norm_w.shape, q_norm_w, eps), F.rms_norm(k, k_norm_w.shape, k_norm_w, eps)], 2)
    qk = qk * cos + rotate_half(qk) * sin  # rotary on Q and K heads at once; cos, sin [B, P, 1, d_head]
    q = qk[:, :, :H_q].transpose(1, 2)  # [B, H_q, P, d_head]
    k = qk[:, :, H_q:].transpose(1, 2)  # [B, H_kv, P, d_head]
    return q, k, v.transpose(1, 2)


def out_and_mlp(
    x, o, w_o, norm_w, eps: float, w_gate_up, w_down, post_attn_w=None, post_mlp_w=None, gelu=False, lin=linear
):
    """The work after attention: output projection and residual, then RMSNorm, gated MLP and residual.

    x [B, P, d_model], o [B, H_q, P, d_head] -> [B, P, d_model]. Gemma's extra norms (`post_attn_w` on the
    attention output, `post_mlp_w` on the MLP output, each before its residual add) and its GELU-tanh gate
    (`gelu`) are arguments, so one function serves every family.
    """
    B, H_q, P, d = o.shape
    a = lin(o.transpose(1, 2).reshape(B, P, H_q * d), w_o)  # [B, P, d_model]
    if post_attn_w is not None:
        a = F.rms_norm(a, post_attn_w.shape, post_attn_w, eps)
    x = x + a
    h = F.rms_norm(x, norm_w.shape, norm_w, eps)
    gate, up = lin(h, w_gate_up).chunk(2, dim=-1)  # 2 x [B, P, d_ff]: gate and up in one GEMM
    gate = F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)
    m = lin(gate * up, w_down)  # [B, P, d_model]
    if post_mlp_w is not None:
        m = F.rms_norm(m, post_mlp_w.shape, post_mlp_w, eps)
    return x + m


class Kernels:
    """The two pure functions a block runs around attention, eager or compiled (shared by all layers), and the
    GEMM they call: few_rows_linear (dense or GGUF blocks), or in the batch-invariant mode the one that sums every
    element in one fixed order whatever the number of rows (prefill.model.kernels.linear_f32)."""

    def __init__(self):
        self.qkv_rotary, self.out_and_mlp = qkv_rotary, out_and_mlp
        self.decode_block = None  # (block, x, cos, sin, batch, layer) -> [1, N, d_model] or None: the whole block
        # in one operator where it applies (prefill.model.quant.fused)
        self.linear = few_rows_linear
        self.deterministic = False

    def set_deterministic(self) -> None:
        self.deterministic, self.linear = True, invariant_linear


class Block(nn.Module):
    """Residual block with grouped-query attention (H_q query heads share H_kv K/V heads) and a gated MLP.

    Its layout comes from the family's table entry (prefill.costmodel.families): q/k norm, QKV bias, norms after
    attention and the MLP, the gate's activation; and from the spec: this layer's window, the attention scale.
    """

    def __init__(self, spec: ModelSpec, kernels: Kernels, layer: int):
        super().__init__()
        family = spec.family
        self.H_q, self.H_kv, self.eps, self.kernels = spec.H_q, spec.H_kv, spec.norm_eps, kernels
        self.window, self.scale = spec.windows[layer], spec.attention_scale
        self.gelu = family.activation == "gelu_tanh"
        qkv_out = (spec.H_q + 2 * spec.H_kv) * spec.d_head
        self.attn_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.wqkv = nn.Linear(spec.d_model, qkv_out, bias=spec.qkv_bias)  # Q, K and V in one GEMM
        self.q_norm = RMSNorm(spec.d_head, spec.norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.d_head, spec.norm_eps) if spec.qk_norm else None
        self.wo = nn.Linear(spec.H_q * spec.d_head, spec.d_model, bias=False)
        self.attn_post_norm = RMSNorm(spec.d_model, spec.norm_eps) if family.post_norms else None
        self.mlp_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.w_gate_up = nn.Linear(spec.d_model, 2 * spec.d_ff, bias=False)  # gate and up in one GEMM
        self.w_down = nn.Linear(spec.d_ff, spec.d_model, bias=False)
        self.mlp_post_norm = RMSNorm(spec.d_model, spec.norm_eps) if family.post_norms else None

    def qkv(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The work before attention: x [B, T, d_model] -> q [B, H_q, T, d_head], k, v [B, H_kv, T, d_head]."""
        return self.kernels.qkv_rotary(
            x,
            self.attn_norm.weight,
            self.eps,
            self.wqkv.weight,
            self.wqkv.bias,
            norm_weight(self.q_norm),
            norm_weight(self.k_norm),
            cos,
            sin,
            self.H_q,
            self.H_kv,
            self.kernels.linear,
        )

    def finish(self, x, o) -> torch.Tensor:
        """The work after attention: x [B, T, d_model], o [B, H_q, T, d_head] -> [B, T, d_model]."""
        return self.kernels.out_and_mlp(
            x,
            o,
            self.wo.weight,
            self.mlp_norm.weight,
            self.eps,
            self.w_gate_up.weight,
            self.w_down.weight,
            norm_weight(self.attn_post_norm),
            norm_weight(self.mlp_post_norm),
            self.gelu,
            self.kernels.linear,
        )

    def forward(self, x, cos, sin, batch: ForwardBatch, layer: int) -> torch.Tensor:
        whole = self.kernels.decode_block
        if whole is not None and (y := whole(self, x, cos, sin, batch, layer)) is not None:
            return y
        q, k, v = self.qkv(x, cos, sin)
        return self.finish(x, attend(q, k, v, batch, layer, self.window, self.scale))


def norm_weight(norm: RMSNorm | None) -> torch.Tensor | None:
    """A norm's weight, None where the block has no such norm (the operators' optional arguments)."""
    return None if norm is None else norm.weight


class Transformer(nn.Module):
    """Token ids in, last-position logits out; K and V of every layer land in the cache."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        check_supported(spec)
        self.spec = spec
        # [vocab, d_model]; given its (meta) weight, no initializer runs (normal_ on meta imports torch._dynamo: 2 s)
        self.embed = nn.Embedding(spec.vocab_size, spec.d_model, _weight=torch.empty(spec.vocab_size, spec.d_model))
        self.embed_scale = spec.family.embedding_scale(spec.d_model)  # sqrt(d_model) for Gemma, else 1
        self.kernels = Kernels()
        self.layers = nn.ModuleList(Block(spec, self.kernels, i) for i in range(spec.L))
        self.norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.unembed = None if spec.tied_embeddings else nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        # Which rotary table each layer uses: windowed layers of a family with a local base get their own.
        self.local_rope = [spec.rope_local_theta is not None and w is not None for w in spec.windows]
        self.register_buffer("inv_freq", rope_inv_freq(spec), persistent=False)  # [d_head / 2]
        self.register_buffer("inv_freq_local", self._local_inv_freq(), persistent=False)  # [d_head / 2] or [0]

    def _local_inv_freq(self) -> torch.Tensor:
        return rope_inv_freq(self.spec, local=True) if any(self.local_rope) else torch.zeros(0)

    def materialize(self, device, dtype: torch.dtype) -> Transformer:
        """Allocate the parameters of a model built on the meta device, directly in `dtype` on `device`
        (uninitialized: load or initialize them next). The rotary frequencies stay float32, as in the reference.
        Each tensor is made with torch.empty: Module.to_empty on meta tensors runs torch's Python reference of
        empty_like, whose import of sympy and the symbolic-shapes machinery costs 1.6 s a load here."""
        made: dict[int, torch.Tensor] = {}  # a tensor shared by two modules stays one tensor

        def empty(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in made:
                new = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device=device)
                made[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
            return made[id(t)]

        for module in self.modules():
            for table in (module._parameters, module._buffers):
                for name, t in table.items():
                    if t is not None:
                        table[name] = empty(t)
        self.inv_freq = rope_inv_freq(self.spec).to(device)
        self.inv_freq_local = self._local_inv_freq().to(device)
        return self

    def compile(self) -> None:
        """Compile the two per-block functions with torch.compile (inductor): it fuses the norms, rotary, SiLU
        and residual adds into a few vectorized loops. One graph serves all layers and any P."""
        self.kernels.qkv_rotary = torch.compile(qkv_rotary, dynamic=True)
        self.kernels.out_and_mlp = torch.compile(out_and_mlp, dynamic=True)

    def unembed_weight(self):
        """The unembedding [vocab, d_model]: a dense tensor or a QuantWeight (prefill.model.quant)."""
        return self.embed.weight if self.unembed is None else self.unembed.weight  # [vocab, d_model]

    def rope(self, positions: torch.Tensor, dtype, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, 1, d_head] for positions [B, T], computed in float32 like the reference (`local`:
        with the windowed layers' own base)."""
        inv_freq = self.inv_freq_local if local else self.inv_freq
        angles = positions.to(torch.float32)[..., None] * inv_freq  # [B, T, d_head / 2]
        angles = torch.cat((angles, angles), dim=-1)[:, :, None, :]  # [B, T, 1, d_head]: broadcast over heads
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, ids: torch.Tensor, batch: ForwardBatch, output: str = "last") -> torch.Tensor:
        """Run the N new tokens ids [N] of the batch's rows at their positions, writing K/V through `batch`.

        `output`: "last" -> float32 logits [R, vocab] of each row's last token (the next token's; the only
        unembedding a generation needs); "all" -> logits [N, vocab] (the proofs); "hidden" -> the final-normed
        hidden states [N, d_model] (scoring unembeds them in slices, see prefill.engine.scoring).
        """
        x = self.embed_tokens(ids[None])  # [1, N, d_model]: the rows' tokens side by side
        for i, (layer, (cos, sin)) in enumerate(
            zip(self.layers, self.rope_tables(batch.positions[None], x.dtype), strict=True)
        ):
            x = layer(x, cos, sin, batch, i)
        if output == "hidden":
            return self.norm(x[0])  # [N, d_model]
        h = x[0] if output == "all" else x[0, batch.last]  # [R, d_model]: only each row's last position predicts
        return self.logits(self.norm(h))  # [R or N, vocab]

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [B, T, d_model] of ids [B, T], times sqrt(d_model) in Gemma (rounded to the dtype
        first, as the reference does)."""
        x = self.embed(ids)
        return x if self.embed_scale == 1.0 else x * torch.tensor(self.embed_scale, dtype=x.dtype)

    def rope_tables(self, positions: torch.Tensor, dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (cos, sin) [B, T, 1, d_head] for positions [B, T]: one table per rotary base, shared."""
        tables = {local: self.rope(positions, dtype, local) for local in set(self.local_rope)}
        return [tables[local] for local in self.local_rope]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Float32 logits [..., vocab] of final-normed hidden states h [..., d_model], soft-capped to
        final_softcap * tanh(logits / final_softcap) when the model has a cap (Gemma)."""
        logits = self.kernels.linear(h, self.unembed_weight()).float()
        cap = self.spec.final_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    @torch.no_grad()
    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Copy weights named as in Hugging Face checkpoints of the family, fusing QKV and gate/up.

        Multimodal wrappers (Gemma 3 4B and larger) keep the decoder under `language_model`; their vision
        weights are skipped. Gemma's RMSNorm weights w become 1 + w, so one RMSNorm serves every family.
        """
        sd = {_decoder_name(k): v for k, v in sd.items()}
        sd = {k.removeprefix("model."): v for k, v in sd.items() if k is not None}
        family = self.spec.family
        shift = 1.0 if family.norm_plus_one else 0.0

        def take(name: str) -> torch.Tensor:
            if name not in sd:
                raise ModelFileError(f"weight {name!r} is missing from the model file")
            return sd.pop(name)

        def put(param: torch.Tensor, value: torch.Tensor, plus: float = 0.0) -> None:
            if param.shape != value.shape:
                raise ModelFileError(f"weight shape {tuple(value.shape)} does not fit {tuple(param.shape)}")
            param.copy_(value.float() + plus if plus else value)

        place_weight(self, "embed", take("embed_tokens.weight"), put)  # dense or GGUF blocks (prefill.model.quant)
        for i, blk in enumerate(self.layers):
            p = f"layers.{i}."
            for slot, hf in family.hf_norms.items():
                put(getattr(blk, slot).weight, take(p + hf + ".weight"), shift)
            qkv = [take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
            place_weight(blk, "wqkv", cat_rows(qkv), put)
            if self.spec.qkv_bias:
                put(blk.wqkv.bias, torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"]))
            place_weight(blk, "wo", take(p + "self_attn.o_proj.weight"), put)
            if self.spec.qk_norm:
                put(blk.q_norm.weight, take(p + "self_attn.q_norm.weight"), shift)
                put(blk.k_norm.weight, take(p + "self_attn.k_norm.weight"), shift)
            gate_up = [take(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]
            place_weight(blk, "w_gate_up", cat_rows(gate_up), put)
            place_weight(blk, "w_down", take(p + "mlp.down_proj.weight"), put)
        put(self.norm.weight, take("norm.weight"), shift)
        lm_head = sd.pop("lm_head.weight", None)
        if self.unembed is not None:
            if lm_head is None:
                raise ModelFileError("weight 'lm_head.weight' is missing from the model file")
            place_weight(self, "unembed", lm_head, put)
        sd = {k: v for k, v in sd.items() if "rotary_emb" not in k}
        if sd:
            raise ModelFileError(f"unexpected weights in the model file: {', '.join(sorted(sd)[:5])}")


_NOT_DECODER = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def _decoder_name(name: str) -> str | None:
    """The text decoder's own name of a checkpoint weight (None for a multimodal model's vision weights):
    'language_model.model.layers.0...' (transformers 4) and 'model.language_model.layers.0...' (5) both
    become 'model.layers.0...', 'language_model.lm_head.weight' becomes 'lm_head.weight'."""
    if name.startswith(_NOT_DECODER):
        return None
    if name.startswith("model.language_model."):
        return "model." + name.removeprefix("model.language_model.")
    return name.removeprefix("language_model.")
