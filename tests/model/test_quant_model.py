"""Whole models on GGUF blocks: a tiny Llama, a tiny Qwen2 (QKV bias) and a tiny Gemma 3 (q/k norms, norms after
attention and the MLP, GELU gate, a windowed layer; Q/K/V of two types as a Q4_K_M file holds them) built from
random blocks, through the fused block operators, the unfused functions and dense weights; and the embedded
SmolLM2 file, native against float32."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from prefill.costmodel.specs import ModelSpec
from prefill.engine import proofs
from prefill.engine.llm import Engine
from prefill.model.quant import QuantRows, QuantWeight, ops, set_activations
from quant_blocks import random_blocks

PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.")


def tiny_spec(arch: str) -> ModelSpec:
    spec = _tiny_llama(arch)
    if arch == "gemma3":  # one windowed layer with its own rotary base, one global
        return replace(spec, qk_norm=True, windows=(6, None), rope_local_theta=1_000.0, query_pre_attn_scalar=24.0)
    return spec


def _tiny_llama(arch: str) -> ModelSpec:
    return ModelSpec(
        f"tiny-{arch}",
        arch,
        L=2,
        d_model=64,
        H_q=4,
        H_kv=2,
        d_head=16,
        d_ff=96,
        vocab_size=160,
        context_length=256,
        tied_embeddings=True,
        rope_theta=10_000.0,
        norm_eps=1e-6,
        qkv_bias=arch == "qwen2",
    )


QMAX = {"Q8_0": 127, "Q4_0": 8, "Q4_1": 15, "Q5_0": 16}  # the largest |q| of a type: weights of size 0.1 for every type


def tiny_state_dict(spec: ModelSpec, qtype: str) -> dict:
    """Random blocks of `qtype` ("Q5_0+Q8_0": V of the second type, the rest of the first), norms near 1."""
    g = torch.Generator().manual_seed(1)
    seed = iter(range(1000))
    qtype, _, v_type = qtype.partition("+")

    def q(N: int, K: int, t: str = qtype) -> QuantWeight:
        return QuantWeight(random_blocks(t, N, K, next(seed), scale=0.1 / QMAX[t]), t, N, K)

    def norm(n: int = spec.d_model) -> torch.Tensor:  # Gemma's loader adds 1 to its norms: near 1 either way
        return (0.0 if spec.family.norm_plus_one else 1.0) + 0.1 * torch.randn(n, generator=g)

    D, F, kv = spec.d_model, spec.d_ff, spec.H_kv * spec.d_head
    sd = {"model.embed_tokens.weight": q(spec.vocab_size, D), "model.norm.weight": norm()}
    for i in range(spec.L):
        p = f"model.layers.{i}."
        sd |= {p + hf + ".weight": norm() for hf in spec.family.hf_norms.values()}
        if spec.qk_norm:
            sd |= {p + f"self_attn.{n}_norm.weight": norm(spec.d_head) for n in "qk"}
        sd |= {
            p + "self_attn.q_proj.weight": q(spec.H_q * spec.d_head, D),
            p + "self_attn.k_proj.weight": q(kv, D),
            p + "self_attn.v_proj.weight": q(kv, D, v_type or qtype),
            p + "self_attn.o_proj.weight": q(D, spec.H_q * spec.d_head),
            p + "mlp.gate_proj.weight": q(F, D),
            p + "mlp.up_proj.weight": q(F, D),
            p + "mlp.down_proj.weight": q(D, F),
        }
        if spec.qkv_bias:
            for n, width in (("q", D), ("k", kv), ("v", kv)):
                sd[p + f"self_attn.{n}_proj.bias"] = 0.1 * torch.randn(width, generator=g)
    return sd


def dense(sd: dict) -> dict:
    return {k: v.dequantize() if isinstance(v, QuantWeight) else v.clone() for k, v in sd.items()}


@pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")
@pytest.mark.parametrize(
    "arch, qtype", [("llama", "Q4_1"), ("qwen2", "Q8_0"), ("llama", "Q4_0"), ("gemma3", "Q5_0+Q8_0")]
)
def test_tiny_model_on_blocks_equals_dense_fused_or_not(arch, qtype):
    spec = tiny_spec(arch)
    sd = tiny_state_dict(spec, qtype)
    fused = Engine.from_state_dict(spec, dict(sd))
    unfused = Engine.from_state_dict(spec, dict(sd))
    unfused.model.kernels.__init__()  # the model's own per-block functions over the same blocks
    ref = Engine.from_state_dict(spec, dense(sd))
    assert fused.model.kernels.qkv_rotary is not unfused.model.kernels.qkv_rotary
    ids = [5, 17, 42, 99, 3, 150, 7, 64, 8]
    for prompt in (ids[:1], ids):  # M = 1 (the direct kernel) and M = 9 (the panel kernel)
        logits = {name: e.prefill(prompt)[0] for name, e in (("fused", fused), ("unfused", unfused), ("dense", ref))}
        tol = proofs.rounding_tolerance(float(logits["dense"].abs().max()), spec, torch.float32)
        assert float((logits["fused"] - logits["dense"]).abs().max()) <= tol
        assert float((logits["unfused"] - logits["dense"]).abs().max()) <= tol
    for check in proofs.parallel_vs_sequential(fused, ids) + proofs.chunked_vs_single(fused, ids, 4):
        assert check.ok, check


def test_tiny_gemma_blocks_on_every_isa_within_rounding_of_dense(isa):
    """Gemma's block in the fused operators on each instruction set (its GELU-tanh gate has a scalar and an AVX2
    row kernel; the Q5_0 and Q8_0 products theirs): prefill and decode logits within the rounding tolerance of
    the same model on the dense decoded weights, Q/K/V kept as blocks of two types, and the decode operator ran."""
    spec = tiny_spec("gemma3")
    sd = tiny_state_dict(spec, "Q5_0+Q8_0")
    fused, ref = Engine.from_state_dict(spec, dict(sd)), Engine.from_state_dict(spec, dense(sd))
    w = fused.model.layers[0].wqkv.weight
    assert isinstance(w, QuantRows) and [(p.qtype, p.N) for p in w.parts] == [("Q5_0", 96), ("Q8_0", 32)]
    ran = []
    one = fused.model.kernels.decode_block
    fused.model.kernels.decode_block = lambda *a: ran.append(y := one(*a)) or y
    ids = [5, 17, 42, 99, 3, 150, 7, 64, 8]  # longer than layer 0's window of 6
    logits = {}
    for name, e in (("fused", fused), ("dense", ref)):
        first, cache = e.prefill(ids, e.new_cache(len(ids) + 4))
        steps = [e.decode_step(torch.tensor([t]), cache) for t in (4, 9, 11)]
        logits[name] = torch.cat([first, *steps])  # [4, vocab]
    assert sum(y is not None for y in ran) == 3 * spec.L
    tol = proofs.rounding_tolerance(float(logits["dense"].abs().max()), spec, torch.float32)
    assert float((logits["fused"] - logits["dense"]).abs().max()) <= tol


@pytest.fixture(scope="module")
def smollm_pair(smollm_native, smollm):
    return smollm_native, smollm


@pytest.mark.slow
def test_embedded_file_logits_native_within_1e3_of_float32(smollm_pair):
    native, f32 = smollm_pair
    assert native.weights == "Q8_0 + Q4_1" and f32.weights == "float32"
    assert native.dtype == torch.float32  # activations and the KV cache stay float32
    for prompt in PROMPTS:
        ids = f32.encode_prompt(prompt)
        a, b = native.prefill(ids)[0], f32.prefill(ids)[0]
        assert float((a - b).abs().max()) <= 1e-3
        assert float((a - b).abs().max()) <= proofs.rounding_tolerance(float(b.abs().max()), f32.spec, f32.dtype)


@pytest.mark.slow
def test_embedded_file_greedy_text_unchanged(smollm_pair):
    native, f32 = smollm_pair

    def rows(engine, ids, n=24):  # the logits [vocab] of n greedy steps
        logits, cache = engine.prefill(ids, engine.new_cache(len(ids) + n))
        out = [logits[0]]
        while len(out) < n:
            out.append(engine.decode_step(out[-1].argmax().view(1), cache)[0])
        return out

    for prompt in PROMPTS:
        ids = f32.encode_prompt(prompt)
        ref = rows(f32, ids)
        tol = proofs.rounding_tolerance(max(float(r.abs().max()) for r in ref), f32.spec, f32.dtype)
        differ, note = proofs.greedy_agreement(rows(native, ids), ref, tol)
        assert differ == 0, (prompt, note)


@pytest.mark.slow
def test_native_proofs_hold(smollm_pair):
    native, _ = smollm_pair
    ids = native.encode_prompt(PROMPTS[0])
    checks = proofs.parallel_vs_sequential(native, ids) + proofs.chunked_vs_single(native, ids, 7)
    checks.append(proofs.kv_bytes_match_formula(native, len(ids)))
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]


def test_native_needs_a_quantized_file(tmp_path):
    from prefill.engine.weights import weights_choice
    from prefill.errors import BadInput

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BadInput, match="--weights native: the model file holds no quantized matrix"):
        weights_choice("native", tmp_path, "float32")
    assert weights_choice("auto", tmp_path, "float32").dtype == "float32"


@pytest.mark.skipif(not ops.available(), reason="the quantized kernels are not built")
@pytest.mark.parametrize("arch, qtype", [("llama", "Q4_1"), ("qwen2", "Q8_0"), ("gemma3", "Q5_0+Q8_0")])
@pytest.mark.parametrize(
    "path, kv", [("f32", "float32"), ("q8", "float32"), ("f32", "bfloat16"), ("f32", "float16"), ("f32", "q8_0")]
)
def test_decode_block_is_bitwise_the_block_op_by_op(arch, qtype, path, kv):
    """A forward of decode rows runs each block as one operator (decode_block); its logits are bitwise those of
    the same operators called one by one from Python, for rows of different context lengths in one batch, on
    either activation path (the fused operators read it from the weights' type ids), with K/V stored in the
    pool as float32, 16-bit (rounded to nearest even on both paths) or q8_0 rows (d_head 32: whole blocks)."""
    spec = replace(tiny_spec(arch), H_q=2, H_kv=1, d_head=32) if kv == "q8_0" else tiny_spec(arch)
    sd = tiny_state_dict(spec, qtype)
    whole, by_op = Engine.from_state_dict(spec, dict(sd)), Engine.from_state_dict(spec, dict(sd))
    whole.runner.set_kv_dtype(kv)
    by_op.runner.set_kv_dtype(kv)
    n_linear = 1 + 4 * spec.L  # the (tied) embedding, and each block's Q/K/V, O, gate/up, down
    assert set_activations(whole.model, path) == set_activations(by_op.model, path) == n_linear
    by_op.model.kernels.decode_block = None
    ran = []
    one = whole.model.kernels.decode_block
    whole.model.kernels.decode_block = lambda *a: ran.append(y := one(*a)) or y  # None: not a decode forward
    logits = {}
    for name, e in (("whole", whole), ("by_op", by_op)):
        with torch.inference_mode():
            caches = [e.new_cache(64), e.new_cache(64)]
            e.prefill([5, 17, 42, 99, 3, 150, 7, 64, 8, 21, 33, 40, 2, 19, 77, 101, 6, 9], caches[0])  # 18 tokens
            e.prefill([11, 12, 13], caches[1])
            tokens, steps = torch.tensor([4, 9]), []
            for _ in range(20):  # row 0 crosses a 16-token block boundary into a second block
                out = e.decode_step(tokens, caches)
                steps.append(out)
                tokens = out.argmax(-1)
            logits[name] = torch.stack(steps)  # [steps, 2, vocab]
    assert sum(y is not None for y in ran) == 20 * spec.L  # every block of every decode step, none of the prefills
    assert torch.equal(logits["whole"], logits["by_op"])
    if path == "q8":  # the path was taken: the same engine on float32 activations gives other logits
        q8 = whole.prefill([5, 17, 42])[0]
        set_activations(whole.model, "f32")
        assert not torch.equal(q8, whole.prefill([5, 17, 42])[0])
