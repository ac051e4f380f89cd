"""The cost model: the lessons' worked numbers exactly, and properties of every formula."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefill.costmodel import costs, parallel, roofline
from prefill.costmodel.costs import (
    Calibration,
    FlopCount,
    calibrated_prefill_seconds,
    decode_rate,
    kv_cache_bytes,
    kv_cache_bytes_for,
    prefill_flops,
    prefill_flops_exact,
    prefill_seconds,
    request_output_rate,
    request_seconds,
    ttft_seconds,
)
from prefill.costmodel.specs import PRESETS, ModelSpec
from prefill.errors import BadInput

LLAMA3_8B = PRESETS["llama-3-8b"]
SMOLLM2 = PRESETS["smollm2-135m"]


# ---- worked numbers from the lessons -----------------------------------------------------------------


def test_prefill_flops_7b_1000_tokens():
    assert prefill_flops(7e9, 1000) == 1.4e13


def test_prefill_seconds_300_tflops_half_mfu_is_93_ms():
    s = prefill_seconds(7e9, 1000, 300e12, 0.5)
    assert s == pytest.approx(0.09333333, rel=1e-6)
    assert round(s, 4) == 0.0933 and round(s * 1e3, 1) == 93.3


def test_prefill_seconds_interactive_lesson_0_28_s():
    assert prefill_seconds(7e9, 1000, 1e14, 0.5) == pytest.approx(0.28, rel=1e-12)
    assert prefill_seconds(7e9, 1000, 5e13) == pytest.approx(0.28, rel=1e-12)


@pytest.mark.parametrize("utilization", [0, -0.1, 1.5, math.nan, math.inf])
def test_prefill_seconds_rejects_bad_utilization(utilization):
    with pytest.raises(ValueError):
        prefill_seconds(7e9, 1000, 1e14, utilization)


@pytest.mark.parametrize(
    "N, P, rate",
    [
        (0, 10, 1e14),
        (-1, 10, 1e14),
        (7e9, -1, 1e14),
        (7e9, 10, 0),
        (7e9, 10, -1e14),
        (math.nan, 10, 1e14),
        (7e9, math.inf, 1e14),
        (7e9, 10, math.nan),
    ],
)
def test_prefill_seconds_rejects_bad_arguments(N, P, rate):
    with pytest.raises(ValueError):
        prefill_seconds(N, P, rate)


def test_utilization_one_is_allowed_and_p_zero_costs_nothing():
    assert prefill_seconds(1e9, 100, 1e12, 1.0) == pytest.approx(0.2)
    assert prefill_seconds(1e9, 0, 1e12) == 0


def test_kv_cache_exercise_2():
    n = kv_cache_bytes(L=32, H_kv=8, d_head=128, P=2048, bytes_per_element=2)
    assert n == 268_435_456
    assert costs.bytes_to_mib(n) == 256.0
    assert round(costs.bytes_to_mb(n), 1) == 268.4
    assert costs.format_bytes(n) == "268,435,456 B = 256.0 MiB = 268.4 MB"


def test_kv_cache_of_llama3_8b_preset_matches_exercise():
    assert kv_cache_bytes_for(LLAMA3_8B, 2048, costs.dtype_bytes("bf16")) == 268_435_456


def test_kv_cache_scales_with_batch_and_rejects_nonsense():
    assert kv_cache_bytes(32, 8, 128, 2048, 2, B=4) == 4 * 268_435_456
    with pytest.raises(ValueError):
        kv_cache_bytes(32, 0, 128, 2048, 2)
    with pytest.raises(ValueError):
        kv_cache_bytes(32, 8, 128, -1, 2)


def test_request_timing_worked_example():
    total = request_seconds(ttft_s=0.20, n_out=5, itl_s=0.05)
    assert total == pytest.approx(0.40)
    assert decode_rate(0.05) == pytest.approx(20.0)
    assert request_output_rate(5, total) == pytest.approx(12.5)


def test_ttft_is_network_plus_tokenization_plus_prefill():
    assert ttft_seconds(0.0933, network_s=0.02, tokenize_s=0.001) == pytest.approx(0.1143)
    assert ttft_seconds(0.5) == 0.5
    with pytest.raises(ValueError):
        ttft_seconds(0.1, network_s=-1)
    with pytest.raises(ValueError):
        request_seconds(0.2, 0, 0.05)


def test_dtype_bytes_and_aliases():
    names = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "fp8", "int8")
    assert [costs.dtype_bytes(d) for d in names] == [4, 4, 2, 2, 2, 2, 1, 1]
    assert costs.canonical_dtype("torch.bfloat16") == "bfloat16"
    with pytest.raises(BadInput, match="unknown dtype"):
        costs.dtype_bytes("fp7")


def test_achieved_rate_is_peak_times_mfu_and_checks_both():
    assert costs.achieved_flops_per_s(3e14, 0.5) == 1.5e14
    for peak, u in ((0.0, 0.5), (3e14, 0.0), (3e14, 1.5), (float("nan"), 0.5)):
        with pytest.raises(ValueError):
            costs.achieved_flops_per_s(peak, u)


def test_mfu_inverts_prefill_seconds():
    s = prefill_seconds(7e9, 1000, 300e12, 0.5)
    assert costs.mfu(prefill_flops(7e9, 1000), s, 300e12) == pytest.approx(0.5)


# ---- exact FLOPs -------------------------------------------------------------------------------------


def test_exact_flops_of_llama3_8b_1000_tokens():
    count = prefill_flops_exact(LLAMA3_8B, 1000)
    assert count.linear == 2 * 6_979_588_096 * 1000
    # 4 * L * H_q * d_head * P(P+1)/2 = 4 * 32 * 32 * 128 * 500500
    assert count.attention == 4 * 32 * 32 * 128 * 500_500 == 262_406_144_000
    assert count.unembed == 2 * 4096 * 128256  # last position only
    assert count.total == count.linear + count.attention + count.unembed


def test_exact_flops_attention_counts_the_triangle_not_the_square():
    one = prefill_flops_exact(SMOLLM2, 1).attention  # one token attends to itself
    assert one == 4 * 30 * 9 * 64
    assert prefill_flops_exact(SMOLLM2, 100).attention == one * 5050  # 100*101/2 pairs, not 100^2


def test_exact_flops_with_cached_past_and_batch():
    # 10 new tokens after 90 cached: 10*90 + 55 pairs
    assert prefill_flops_exact(SMOLLM2, 10, past=90).attention == 4 * 30 * 9 * 64 * (900 + 55)
    one, four = prefill_flops_exact(SMOLLM2, 64), prefill_flops_exact(SMOLLM2, 64, B=4)
    assert four.total == 4 * one.total


def test_flop_count_as_a_dict():
    assert FlopCount(3.0, 2.0, 1.0).to_dict() == {"linear": 3.0, "attention": 2.0, "unembed": 1.0, "total": 6.0}


def test_flop_count_total():
    assert FlopCount(linear=1.0, attention=2.0, unembed=3.0).total == 6.0


# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
spec_strategy = st.builds(
    lambda L, H_kv, group, d_head, d_ff, vocab, tied: ModelSpec(
        name="random", arch="llama", L=L, d_model=H_kv * group * d_head, H_q=H_kv * group, H_kv=H_kv,
        d_head=d_head, d_ff=d_ff, vocab_size=vocab, context_length=4096, tied_embeddings=tied,
        rope_theta=10000.0, norm_eps=1e-5,
    ),
    st.integers(1, 80), st.integers(1, 16), st.integers(1, 8), st.sampled_from([32, 64, 128, 256]),
    st.integers(1, 50_000), st.integers(1, 300_000), st.booleans(),
)
# fmt: on


@given(spec=spec_strategy, P=st.integers(0, 100_000), past=st.integers(0, 100_000))
def test_exact_body_flops_exceed_2_n_non_embedding_p_by_exactly_the_attention(spec, P, past):
    count = prefill_flops_exact(spec, P, past=past)
    body = count.linear + count.attention
    assert body - 2 * spec.N_non_embedding * P == count.attention
    assert count.attention == 4 * spec.L * spec.H_q * spec.d_head * (P * past + P * (P + 1) // 2)


@given(N=st.integers(1, 10**12), P=st.integers(0, 10**6), k=st.integers(1, 1000))
def test_prefill_flops_linear_in_n_and_p(N, P, k):
    assert prefill_flops(k * N, P) == k * prefill_flops(N, P)
    assert prefill_flops(N, k * P) == k * prefill_flops(N, P)
    assert prefill_flops(N, P + k) == prefill_flops(N, P) + prefill_flops(N, k)


@given(
    N=st.floats(1e6, 1e12),
    P=st.integers(0, 10**6),
    rate=st.floats(1e9, 1e16),
    u=st.floats(0.01, 1.0),
)
def test_prefill_seconds_is_flops_over_achieved_rate(N, P, rate, u):
    assert prefill_seconds(N, P, rate, u) == pytest.approx(prefill_flops(N, P) / (rate * u))


# ---- intensity and the roofline ----------------------------------------------------------------------


def test_decode_intensity_is_two_over_b():
    assert roofline.decode_intensity(2) == 1.0  # bf16
    assert roofline.decode_intensity(1) == 2.0  # fp8/int8
    assert roofline.decode_intensity(0.5) == 4.0  # 4-bit


def test_ridge_point_and_bound():
    ridge = roofline.ridge_point(989.4e12, 3.35e12)
    assert ridge == pytest.approx(295.34, abs=0.01)
    assert roofline.bound(1.0, ridge) == "memory-bound"
    assert roofline.bound(ridge, ridge) == "compute-bound"


def test_prefill_bytes_moved_counts_weights_activations_and_kv():
    P, b = 1000, 2
    expected = LLAMA3_8B.N * b + 2 * 32 * P * 4096 * b + kv_cache_bytes_for(LLAMA3_8B, P, b)
    assert roofline.prefill_bytes_moved(LLAMA3_8B, P, b) == expected


@given(P=st.integers(1, 200_000))
def test_prefill_intensity_grows_with_p(P):
    assert roofline.prefill_intensity(LLAMA3_8B, P + 1, 2) > roofline.prefill_intensity(LLAMA3_8B, P, 2)


def test_prefill_intensity_without_shapes_counts_weights_only():
    assert roofline.prefill_intensity(None, 1000, 2) == 1000.0
    assert roofline.prefill_intensity(None, 1000, 2, B=4) == 4000.0


def test_compute_bound_prompt_length_is_the_crossover():
    ridge = roofline.ridge_point(989.4e12, 3.35e12)
    P = roofline.compute_bound_prompt_length(LLAMA3_8B, 2, ridge)
    assert roofline.prefill_intensity(LLAMA3_8B, P, 2) >= ridge > roofline.prefill_intensity(LLAMA3_8B, P - 1, 2)
    assert 250 < P < 400  # at ~2 FLOP per weight byte per token, ridge 295 needs ~300 tokens
    # weights only: 2 * P / b >= ridge  <=>  P >= ridge
    assert roofline.compute_bound_prompt_length(None, 2, 100.0) == 100
    assert roofline.compute_bound_prompt_length(None, 2, 1e30, max_P=2**20) is None


# ---- tensor parallelism ------------------------------------------------------------------------------


def test_tensor_parallel_split_of_flops_and_kv():
    assert parallel.tp_flops_per_gpu(8e12, 4) == 2e12
    full = kv_cache_bytes_for(LLAMA3_8B, 2048, 2)
    assert parallel.tp_kv_cache_bytes_per_gpu(LLAMA3_8B, 2048, 2, T=2) == full // 2
    assert parallel.tp_kv_cache_bytes_per_gpu(LLAMA3_8B, 2048, 2, T=8) == full // 8
    # 16 GPUs but only 8 KV heads: each GPU keeps a whole head
    assert parallel.tp_kv_cache_bytes_per_gpu(LLAMA3_8B, 2048, 2, T=16) == full // 8
    with pytest.raises(ValueError):
        parallel.tp_flops_per_gpu(1.0, 0)
    assert [parallel.tp_kv_heads_per_gpu(8, T) for T in (1, 2, 3, 8, 16)] == [8, 4, 3, 1, 1]


def test_tensor_parallel_prefill_is_each_share_plus_the_allreduces():
    # 8e15 FLOPs over 4 GPUs at 1e15 FLOP/s x 0.5: 4 s of compute each, then 0.25 s of all-reduces
    assert parallel.tp_prefill_seconds(8e15, 4, 1e15, 0.5, allreduce_s=0.25) == pytest.approx(4.25)
    assert parallel.tp_prefill_seconds(8e15, 1, 1e15) == pytest.approx(8.0)
    with pytest.raises(ValueError):
        parallel.tp_prefill_seconds(8e15, 4, 1e15, 0.5, allreduce_s=-1.0)


def test_allreduce_bytes_and_seconds():
    payload = parallel.tp_allreduce_payload_bytes(LLAMA3_8B, P=1000, bytes_per_element=2)
    assert payload == 2 * 32 * 1000 * 4096 * 2  # 2 all-reduces per layer of [B, P, d_model]
    assert parallel.ring_allreduce_bytes_per_gpu(payload, 1) == 0
    assert parallel.ring_allreduce_bytes_per_gpu(payload, 2) == payload
    assert parallel.ring_allreduce_bytes_per_gpu(payload, 4) == 1.5 * payload
    assert parallel.tp_allreduce_seconds(payload, 2, 450e9) == pytest.approx(payload / 450e9)


# ---- calibration -------------------------------------------------------------------------------------


def test_calibrated_prefill_seconds():
    cal = Calibration(
        overhead_s=0.01, linear_flops_per_s=1e11, attention_flops_per_s=5e10, dtype="float32", threads=2, source="test"
    )
    count = FlopCount(linear=1e11, attention=5e10, unembed=1e10)
    assert calibrated_prefill_seconds(count, cal) == pytest.approx(0.01 + 1.1 + 1.0)


# ---- sliding windows ---------------------------------------------------------------------------------


def global_layers(L: int, pattern: int = 6) -> list[int]:
    """Gemma 3's full-attention layers by hand: every pattern-th layer, counting from 1."""
    return [i for i in range(L) if (i + 1) % pattern == 0]


@pytest.mark.parametrize(
    "preset, P, expected",
    [
        # 18 layers: 3 global (5, 11, 17) hold P = 2048, 15 local hold W = 512; H_kv 1, d_head 256, bf16
        ("gemma-3-270m", 2048, 2 * 1 * 256 * 2 * (15 * 512 + 3 * 2048)),  # 14,155,776 B (37.7 MB without)
        ("gemma-3-1b", 2048, 2 * 1 * 256 * 2 * (22 * 512 + 4 * 2048)),
        ("gemma-3-4b", 2048, 2 * 4 * 256 * 2 * (29 * 1024 + 5 * 2048)),
        ("gemma-3-12b", 2048, 2 * 8 * 256 * 2 * (40 * 1024 + 8 * 2048)),
        ("gemma-3-27b", 2048, 2 * 16 * 128 * 2 * (52 * 1024 + 10 * 2048)),
        ("gemma-3-27b", 512, 2 * 16 * 128 * 2 * 62 * 512),  # shorter than the window: every layer holds P
        ("mistral-7b-v0.1", 8192, 2 * 8 * 128 * 2 * 32 * 4096),  # every layer stops at W = 4096
        ("mistral-7b-v0.1", 4096, 2 * 8 * 128 * 2 * 32 * 4096),
        ("gemma-2-9b", 8192, 2 * 8 * 256 * 2 * (21 * 4096 + 21 * 8192)),  # even layers local, odd global
    ],
)
def test_window_aware_kv_bytes_of_each_windowed_preset(preset, P, expected):
    spec = PRESETS[preset]
    assert kv_cache_bytes_for(spec, P, 2) == expected
    assert kv_cache_bytes_for(spec, P, 2, B=3) == 3 * expected


def test_gemma3_270m_kv_bytes_at_2048_and_its_layer_pattern():
    spec = PRESETS["gemma-3-270m"]
    assert [i for i, w in enumerate(spec.windows) if w is None] == global_layers(18) == [5, 11, 17]
    assert set(spec.windows) == {512, None}
    assert kv_cache_bytes_for(spec, 2048, 2) == 14_155_776
    assert kv_cache_bytes(spec.L, spec.H_kv, spec.d_head, 2048, 2) == 37_748_736  # the full-attention count
    for name, L in (("gemma-3-1b", 26), ("gemma-3-4b", 34), ("gemma-3-12b", 48), ("gemma-3-27b", 62)):
        assert [i for i, w in enumerate(PRESETS[name].windows) if w is None] == global_layers(L)


def test_window_pairs_by_hand():
    # W = 4, 10 tokens: positions see 1, 2, 3, 4, 4, 4, 4, 4, 4, 4 keys
    assert costs.attended_pairs(10, window=4) == 1 + 2 + 3 + 4 * 7 == 34
    # 3 new tokens at positions 5, 6, 7 after 5 cached: 4 keys each
    assert costs.attended_pairs(3, past=5, window=4) == 12
    assert costs.attended_pairs(3, past=1, window=4) == 2 + 3 + 4  # positions 1, 2, 3
    assert costs.attended_pairs(10, window=None) == 55


@given(P=st.integers(0, 60), past=st.integers(0, 60), W=st.integers(1, 70))
def test_window_pairs_count_the_mask(P, past, W):
    import numpy as np

    t = np.arange(past, past + P)[:, None]  # [P, 1]: absolute positions of the new queries
    j = np.arange(past + P)[None, :]  # [1, past + P]: every key
    assert costs.attended_pairs(P, past, W) == int(((j <= t) & (j > t - W)).sum())


@given(
    spec=spec_strategy, P=st.integers(0, 5000), past=st.integers(0, 5000), extra=st.integers(0, 10_000), data=st.data()
)
def test_windows_at_least_as_long_as_the_context_give_todays_numbers(spec, P, past, extra, data):
    import dataclasses

    wide = max(1, past + P + extra)  # every window covers the whole context (and a window is >= 1 token)
    windows = tuple(data.draw(st.sampled_from([None, wide, wide + 1])) for _ in range(spec.L))
    windowed = dataclasses.replace(spec, windows=windows)
    assert prefill_flops_exact(windowed, P, past) == prefill_flops_exact(spec, P, past)
    assert kv_cache_bytes_for(windowed, past + P, 2) == kv_cache_bytes(spec.L, spec.H_kv, spec.d_head, past + P, 2)
    assert prefill_flops_exact(spec, P, past).attention == 4 * spec.L * spec.H_q * spec.d_head * (
        P * past + P * (P + 1) // 2
    )


def test_windowed_attention_flops_of_gemma3_270m():
    spec = PRESETS["gemma-3-270m"]
    P = 2048
    band = 512 * 513 // 2 + (P - 512) * 512  # a local layer: the triangle to W, then W keys per row
    triangle = P * (P + 1) // 2
    per_pair = 4 * spec.H_q * spec.d_head
    assert prefill_flops_exact(spec, P).attention == per_pair * (15 * band + 3 * triangle)
    assert prefill_flops_exact(spec, 100, past=1948).attention == per_pair * (15 * 100 * 512 + 3 * 100 * (1948 + 50.5))


def test_longest_context_with_windows():
    full = costs.max_context_tokens_for(LLAMA3_8B, 24 * 2**30, 2)
    assert full == costs.max_context_tokens(24 * 2**30, kv_cache_bytes_for(LLAMA3_8B, 1, 2)) == 196_608
    gemma = PRESETS["gemma-3-270m"]
    n = costs.max_context_tokens_for(gemma, 2**30, 2)
    assert kv_cache_bytes_for(gemma, n, 2) <= 2**30 < kv_cache_bytes_for(gemma, n + 1, 2)
    assert costs.max_context_tokens_for(PRESETS["mistral-7b-v0.1"], 2**30, 2) is None  # stops growing at W
    assert costs.max_context_tokens_for(PRESETS["mistral-7b-v0.1"], 2**20, 2) == 2**20 // (2 * 8 * 128 * 2 * 32)


# ---- scoring: the unembedding over every position ----------------------------------------------------


def test_scoring_flops_of_smollm2_1024_tokens():
    count = costs.scoring_flops_exact(SMOLLM2, 1024)
    assert count.linear == 2 * 106_203_456 * 1024 == 217_504_677_888
    assert count.attention == 4 * 30 * 9 * 64 * 524_800 == 36_274_176_000  # 1024*1025/2 pairs
    assert count.unembed == 2 * 576 * 49_152 * 1024 == 57_982_058_496  # all 1024 positions, not the last
    assert count.total == 311_760_912_384
    assert count.unembed_share == pytest.approx(0.18598, abs=1e-5)
    # The same prompt prefilled for generation unembeds one position: scoring costs 22.8% more.
    generation = prefill_flops_exact(SMOLLM2, 1024)
    assert count.total - generation.total == 2 * 576 * 49_152 * 1023
    assert count.total / generation.total == pytest.approx(1.2282, abs=1e-4)


def test_scoring_unembedding_share_of_smollm2_falls_from_21_percent_as_attention_grows():
    # 2*d_model*vocab / (2*N_non_embedding + 2*d_model*vocab) per token before attention counts: 21.05%
    assert costs.scoring_flops_exact(SMOLLM2, 1).unembed_share == pytest.approx(56_623_104 / 269_099_136, rel=1e-3)
    assert costs.scoring_flops_exact(SMOLLM2, 128).unembed_share == pytest.approx(0.20704, abs=1e-5)
    assert costs.scoring_flops_exact(SMOLLM2, 8192).unembed_share == pytest.approx(0.10254, abs=1e-5)
    # Llama-3-8B: a 128k vocabulary, but 7 B body parameters: the unembedding is a small share.
    assert costs.scoring_flops_exact(LLAMA3_8B, 1024).unembed_share == pytest.approx(0.06877, abs=1e-5)


def test_scoring_flops_with_fewer_unembedded_positions_and_a_batch():
    full, some = costs.scoring_flops_exact(SMOLLM2, 100), costs.scoring_flops_exact(SMOLLM2, 100, unembedded=1)
    assert some == prefill_flops_exact(SMOLLM2, 100)
    assert costs.scoring_flops_exact(SMOLLM2, 100, B=3).total == 3 * full.total
    assert FlopCount(0, 0, 0).unembed_share == 0.0
    with pytest.raises(ValueError, match="unembedded"):
        costs.scoring_flops_exact(SMOLLM2, 10, unembedded=11)
