"""The per-operation time model's shape: bytes set a memory-bound operation's time and FLOPs a compute-bound one's,
predictions grow with P and with context, windows cap attention's reads, FLOPs agree with costs, and a catalog GPU
runs the same model. Synthetic profiles with round numbers: no timing anywhere."""

import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefill.costmodel.costs import prefill_flops_exact, scoring_flops_exact
from prefill.costmodel.hardware import get_hardware
from prefill.costmodel.ops import Row, forward_ops, visible_keys
from prefill.costmodel.profile import GemmCurve, MachineProfile, catalog_profile, wave_efficiency
from prefill.costmodel.specs import PRESETS
from prefill.costmodel.timemodel import (
    extra_launches,
    layout_for,
    predict_decode,
    predict_prefill,
    predict_scoring,
    predict_step,
)

SMOLLM2, LLAMA3, GEMMA3 = PRESETS["smollm2-135m"], PRESETS["llama-3-8b"], PRESETS["gemma-3-1b"]
FP32 = layout_for("float32", gathers_kv=False)


def flat(rate: float = 100e9, bandwidth: float = 10e9, overhead: float = 0.0, **kw) -> MachineProfile:
    """A machine whose GEMMs and attention run at `rate` at every size (so compute time is FLOPs / rate)."""
    return MachineProfile(
        "flat", "float32", rate, bandwidth, overhead, "synthetic", attention=((1, rate), (4096, rate)), **kw
    )


def test_a_memory_bound_decode_step_follows_bytes():
    # One row: every weight read for 2 FLOPs each. Halving the bytes per weight halves the GEMMs' time.
    p32 = predict_decode(SMOLLM2, [64], flat(), FP32).by_op()
    p16 = predict_decode(SMOLLM2, [64], flat(), layout_for("float32", weights="bfloat16", gathers_kv=False)).by_op()
    for name in ("qkv", "o", "gate_up", "down", "unembed"):
        assert p32[name].side == "memory" and p32[name].seconds == pytest.approx(p32[name].memory_s)
        weights32, weights16 = p32[name].weight_bytes, p16[name].weight_bytes
        assert weights16 == weights32 / 2
        assert p32[name].memory_s - p16[name].memory_s == pytest.approx(weights16 / 10e9)
    assert predict_decode(SMOLLM2, [64], flat(), FP32).dominant == "memory"


def test_a_compute_bound_prefill_follows_flops():
    p1, p2 = (predict_prefill(SMOLLM2, P, flat(), FP32).by_op() for P in (2048, 4096))
    for name in ("qkv", "o", "gate_up", "down"):
        assert p1[name].side == "compute" and p1[name].seconds == pytest.approx(p1[name].flops / 100e9)
        assert p2[name].seconds == pytest.approx(2 * p1[name].seconds)  # linear FLOPs double with P
    # causal attention: P(P+1)/2 pairs, so about 4x for 2x the prompt
    assert p2["attention"].seconds / p1["attention"].seconds == pytest.approx(4097 * 4096 / (2049 * 2048))
    assert predict_prefill(SMOLLM2, 4096, flat(), FP32).dominant == "compute"


def test_a_cpu_gemm_curve_streamed_from_memory_is_the_gemms_whole_time():
    """A CPU probe times its GEMMs with their weights streamed from memory: a GEMM takes its curve's time even
    where its bytes at a (fitted, lower) bandwidth would take longer; a GPU's curves are timed hot, so there the
    bytes stay a second limit."""
    curve = tuple(GemmCurve(K, N, ((1, 20e9), (4096, 20e9))) for K, N in ((576, 960), (576, 576), (576, 3072)))
    cpu = replace(flat(bandwidth=1e9), gemm=curve + (GemmCurve(1536, 576, ((1, 20e9), (4096, 20e9))),))
    assert cpu.gemm_streams_weights and not replace(cpu, overlap_launches=True).gemm_streams_weights
    for profile, curve_time in ((cpu, True), (replace(cpu, overlap_launches=True), False)):
        gate_up = predict_decode(SMOLLM2, [64], profile, FP32).by_op()["gate_up"]
        weights_s = gate_up.weight_bytes / 1e9  # 7 MB at 1 GB/s: 7 ms, where the curve says 0.18 ms
        assert gate_up.compute_s == pytest.approx(gate_up.flops / 20e9) and weights_s > 10 * gate_up.compute_s
        assert gate_up.seconds == pytest.approx(gate_up.compute_s if curve_time else gate_up.memory_s)


def test_launch_overhead_dominates_a_tiny_model():
    tiny = replace(SMOLLM2, d_model=64, d_ff=128, H_q=1, H_kv=1, d_head=64, vocab_size=256)
    p = predict_prefill(tiny, 1, flat(overhead=5e-6), FP32)
    assert p.dominant == "overhead"
    assert p.parts()["overhead"] == pytest.approx(
        sum(extra_launches(o, flat()) * o.count for o in forward_ops(tiny, [Row(1)], FP32)) * 5e-6
    )


def test_fused_blocks_launch_once_a_layer_for_decode_and_twice_plus_attention_for_a_short_prefill():
    """Blocks kept as GGUF blocks run as fused operators below `fused_below` tokens (prefill.model.quant.fused):
    a decode forward launches one operator a layer; a prefill one before attention and one after, plus the K/V
    write's and attention's own; past fused_below, every launch. Every family's block: Gemma 3's q/k norms, its
    norms after attention and the MLP and its GELU gate run inside the operators too."""
    fused = layout_for("float32", 0.625, gathers_kv=False, fused_below=1024)
    plain = layout_for("float32", 0.625, gathers_kv=False)

    def launches(spec, rows, lay):  # of the L blocks (an operation once per layer or more; not the embedding's)
        return sum(o.launches * o.count for o in forward_ops(spec, rows, lay) if o.count > 1)

    L = SMOLLM2.L
    assert launches(SMOLLM2, [Row(1, 64), Row(1, 300)], fused) == L
    attention_and_kv_write = L * (1 + 4)
    assert launches(SMOLLM2, [Row(64)], fused) == 2 * L + attention_and_kv_write
    assert launches(SMOLLM2, [Row(2000)], fused) == launches(SMOLLM2, [Row(2000)], plain)
    assert launches(GEMMA3, [Row(1, 64)], fused) == GEMMA3.L < launches(GEMMA3, [Row(1, 64)], plain)
    # An operation inside another's launch costs no launch of its own, never a negative one (attention's rate
    # is measured here with its dispatch included): the fused decode step pays the L block launches, the
    # embedding's, the final norm's and the unembedding's.
    outside = sum(o.launches for o in forward_ops(SMOLLM2, [Row(1, 64)], fused) if o.count == 1)  # not per layer
    p_fused = predict_decode(SMOLLM2, [64], flat(overhead=1e-4), fused)
    assert p_fused.parts()["overhead"] == pytest.approx((L + outside) * 1e-4)


@pytest.mark.parametrize("spec", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])  # gemma: two windows a step
def test_a_cpu_step_models_seconds_are_predict_steps_exactly(spec):
    """StepModel.seconds on a CPU layout (attention one operation a row, blocks fused below fused_below tokens)
    remembers every operation but attention by the step's shape and gives predict's seconds to the last bit:
    fused decode steps, fused and unfused prefills, mixed steps, a scoring row."""
    import random

    from prefill.costmodel.timemodel import StepModel

    lay = layout_for("float32", 0.625, gathers_kv=False, fused_below=1024)
    model = StepModel(spec, flat(overhead=2e-6), lay)
    rng = random.Random(0)
    shapes = [[Row(1, c) for c in (10, 5000)], [Row(512, 0)], [Row(2000, 100)], [Row(64, 100, logits=64), Row(1, 50)]]
    shapes += [[Row(1, rng.randint(1, 4000)) for _ in range(rng.randint(1, 16))] for _ in range(30)]
    shapes += [[Row(1, 900), Row(rng.randint(2, 1500), rng.randint(0, 900))] for _ in range(20)]
    for rows in shapes:
        assert model.seconds(rows) == model.predict(rows).seconds, rows
    assert len(model._steps) < len(shapes)  # shapes of one (tokens, unembedded, decode only) share their timing


def test_flops_agree_with_the_cost_models_exact_count():
    # The GEMMs and attention of the time model are costs.prefill_flops_exact, less the norms' weights (which
    # N_non_embedding counts as multiply-adds).
    for spec in (SMOLLM2, LLAMA3, GEMMA3):
        for P, past in ((1, 0), (300, 0), (100, 900)):
            exact = prefill_flops_exact(spec, P, past).total
            got = predict_prefill(spec, P, flat(), FP32, past=past).flops
            norms = 2 * P * (spec.L * (4 if spec.family.post_norms else 2) + 1) * spec.d_model
            assert got == pytest.approx(exact - norms, rel=1e-3)
    assert predict_scoring(SMOLLM2, 64, flat(), FP32).flops == pytest.approx(
        scoring_flops_exact(SMOLLM2, 64).total - 2 * 64 * 61 * SMOLLM2.d_model, rel=1e-6
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 1000))
def test_monotone_in_prompt_length(P, extra):
    prof = flat(overhead=2e-6)
    assert predict_prefill(SMOLLM2, P + extra, prof, FP32).seconds > predict_prefill(SMOLLM2, P, prof, FP32).seconds


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 8000), st.integers(1, 1000), st.integers(1, 8))
def test_monotone_in_context_and_rows(S, extra, B):
    prof, lay = flat(overhead=2e-6), layout_for("float32")
    assert (
        predict_decode(SMOLLM2, [S + extra] * B, prof, lay).seconds
        > predict_decode(SMOLLM2, [S] * B, prof, lay).seconds
    )
    assert (
        predict_decode(SMOLLM2, [S] * (B + 1), prof, lay).seconds > predict_decode(SMOLLM2, [S] * B, prof, lay).seconds
    )


def test_windows_cap_attentions_reads():
    W = GEMMA3.windows[0]
    assert visible_keys(1, 10_000, W) == W and visible_keys(1, 10_000, None) == 10_001

    def attention(spec, S):
        return predict_decode(spec, [S], flat(), FP32).by_op()["attention"]

    full = SMOLLM2
    assert attention(full, 8000).bytes > 7 * attention(full, 1000).bytes
    windowed = replace(GEMMA3, windows=(W,) * GEMMA3.L)  # every layer local
    assert attention(windowed, 8000).bytes == attention(windowed, 4 * W).bytes  # reads stop growing at W
    assert attention(GEMMA3, 8000).bytes < attention(replace(GEMMA3, windows=()), 8000).bytes


def test_gathering_kv_costs_two_more_passes_over_it():
    a = predict_decode(SMOLLM2, [4096], flat(), layout_for("float32", gathers_kv=True)).by_op()["attention"]
    b = predict_decode(SMOLLM2, [4096], flat(), FP32).by_op()["attention"]
    kv = 2 * SMOLLM2.L * SMOLLM2.H_kv * 4097 * SMOLLM2.d_head * 4
    assert a.bytes - b.bytes == pytest.approx(2 * kv)


def test_chunked_prefill_attends_the_same_pairs_and_reads_the_weights_per_chunk():
    one = predict_prefill(SMOLLM2, 1024, flat(), FP32)
    chunked = predict_prefill(SMOLLM2, 1024, flat(), FP32, chunk_size=256)
    assert chunked.steps == 4 and one.steps == 1
    assert chunked.by_op()["attention"].flops == pytest.approx(one.by_op()["attention"].flops)
    assert chunked.by_op()["qkv"].weight_bytes == 4 * one.by_op()["qkv"].weight_bytes
    # a prefix-cache hit is the suffix's prefill against the cached context
    hit = predict_prefill(SMOLLM2, 24, flat(), FP32, past=1000)
    assert hit.seconds < predict_prefill(SMOLLM2, 1024, flat(), FP32).seconds
    assert hit.by_op()["attention"].flops == pytest.approx(4 * 9 * 64 * 30 * (24 * 1000 + 24 * 25 / 2))


def test_tensor_parallelism_splits_the_gemms_and_adds_all_reduces():
    hw = get_hardware("h100")
    one = predict_prefill(LLAMA3, 2048, catalog_profile(hw, "bf16"), layout_for("bfloat16", gathers_kv=False))
    two = predict_prefill(LLAMA3, 2048, catalog_profile(hw, "bf16"), layout_for("bfloat16", tp=2, gathers_kv=False))
    assert two.by_op()["gate_up"].flops == pytest.approx(one.by_op()["gate_up"].flops / 2)
    ring = 2 * LLAMA3.L * 2048 * LLAMA3.d_model * 2 * (2 * (2 - 1) / 2)  # 2 all-reduces a layer, ring bytes
    assert two.by_op()["allreduce"].bytes == pytest.approx(ring)
    assert two.by_op()["allreduce"].seconds == pytest.approx(ring / hw.link_bytes_per_s)
    assert one.seconds / 2 < two.seconds < one.seconds


def test_wave_quantization():
    assert wave_efficiency(512, 4096, 132) == pytest.approx(64 / 132)  # 4 x 16 tiles of 128 x 256 on 132 SMs
    assert wave_efficiency(2048, 4096, 132) == pytest.approx(256 / 264)
    assert wave_efficiency(7, 7, None) == 1.0


def test_a_few_queries_over_a_long_past_attend_at_least_at_one_querys_rate():
    # a CPU's shape: the causal prefill kernel is slow for a few queries, one decode query over many keys is not
    p = MachineProfile(
        "cpu", "float32", 100e9, 10e9, 0.0, "synthetic",
        attention=((16, 3.5e9), (1024, 64e9)), attention_decode=((64, 9e9), (1024, 24e9)),
    )  # fmt: skip
    assert p.attention_rate(1, 512) == p.attention_rate(12, 512) > 5 * p.attention_rate(12, 12)
    assert p.attention_rate(1024, 1024) == 64e9  # a long chunk: the prefill curve, above the decode one
    after = predict_prefill(SMOLLM2, 12, p, FP32, past=528)
    attention = [o for o in after.ops if o.kind == "attention"]
    assert attention and all(o.flops / o.compute_s >= 0.99 * p.attention_rate(1, 528) for o in attention)


def test_a_profile_round_trips_through_json():
    p = flat(gemm=(GemmCurve(576, 960, ((1, 1e10), (64, 8e10))),), cache_bytes=2**25, cache_bandwidth_bytes_per_s=5e10)
    assert MachineProfile.from_json(p.to_json()) == p


def test_rows_are_checked():
    with pytest.raises(ValueError, match="new >= 1"):
        Row(0)
    with pytest.raises(ValueError, match="at least one row"):
        predict_step(SMOLLM2, [], flat(), FP32)


def test_the_time_model_imports_no_torch():
    code = (
        "import sys; from prefill.costmodel import timemodel, fit, ops, profile; from prefill.costmodel.specs "
        "import PRESETS; from prefill.costmodel.hardware import get_hardware; "
        "p = profile.catalog_profile(get_hardware('h200'), 'bf16'); "
        "timemodel.predict_prefill(PRESETS['llama-3-8b'], 512, p, timemodel.layout_for('bf16')); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
