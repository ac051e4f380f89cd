"""The quality rule on a short text: a path that only sums in another order passes bounds set from float32's
roundoff, and the same path with an error planted in one layer's weights fails them; the rule's arithmetic on
rows made up so the answer is known."""

from __future__ import annotations

import math

import pytest
import torch

from prefill.bench.quality import (
    QUALITY_TOKENS,
    Limits,
    QualityRow,
    Scores,
    engine_logits,
    held_out_ids,
    measure_quality,
    worse_than,
)

# Bounds for a path that differs from the reference by float32 roundoff alone (dense float32 weights decoded from
# the same blocks, summed in another order): its logits differ by ~1e-5..1e-4 (u = 6e-8 times sqrt(K) and L
# layers of growth), so KL ~ 1/2 E[(delta logit)^2] ~ 1e-8. These bounds leave 1000x room and still fail any
# path whose logits move by ~0.01 or more.
ROUNDOFF = Limits(mean_kl=1e-5, p99_kl=1e-4, top1=0.99, ppl_drift=1e-3)
SHORT, WINDOW = 512, 256  # two windows, 256 scored positions


def test_the_held_out_text_is_long_enough(smollm):
    ids = held_out_ids(smollm.tokenizer, QUALITY_TOKENS)
    assert len(ids) == QUALITY_TOKENS >= 10_000


@pytest.mark.slow
def test_a_planted_error_fails_the_rule(smollm_native, smollm):
    ids = held_out_ids(smollm.tokenizer, SHORT)
    ref = engine_logits(smollm_native)
    (clean,) = measure_quality(ref, {"dense float32": engine_logits(smollm)}, ids, WINDOW)
    assert clean.positions == 256 and ROUNDOFF.check(clean) == []
    w = smollm.model.layers[3].w_down.weight  # [d_model, d_ff]
    saved = w.detach().clone()
    g = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():  # a kernel that gets 3% of one layer's products wrong
            w.add_(torch.randn(w.shape, generator=g) * 0.03 * saved.abs().mean())
        (planted,) = measure_quality(ref, {"planted": engine_logits(smollm)}, ids, WINDOW)
    finally:
        with torch.no_grad():
            w.copy_(saved)
    broken = ROUNDOFF.check(planted)
    assert broken and broken[0].startswith("mean KL")
    assert planted.mean_kl > 100 * clean.mean_kl


def _row(mean_kl=1e-3, p99_kl=1e-2, top1=0.97, ppl=10.1, ref_ppl=10.0):
    return QualityRow("x", mean_kl, p99_kl, top1, ppl, ref_ppl, 1000)


def test_the_rule_is_no_worse_than_the_bound_on_every_measure():
    bound = Limits.of(_row())
    assert bound.ppl_drift == pytest.approx(0.01)
    assert bound.check(_row()) == []
    assert bound.check(_row(mean_kl=0.5e-3, top1=0.99, ppl=9.95)) == []  # better on each: passes
    assert bound.check(_row(mean_kl=2e-3))[0].startswith("mean KL 2.00e-03 > 1.00e-03")
    assert bound.check(_row(p99_kl=2e-2))[0].startswith("p99 KL")
    assert bound.check(_row(top1=0.96))[0].startswith("top-1 96.00% < 97.00%")
    assert bound.check(_row(ppl=9.8))[0].startswith("perplexity ratio 0.9800 drifts")  # lower is a drift too


def test_kl_and_agreement_of_known_distributions():
    p_logits = torch.zeros(4, 8)
    p_logits[:, 1] = 1.0  # p: token 1 the likeliest
    q_logits = p_logits.clone()
    q_logits[:, 0] = 3.0  # q: token 0 the likeliest

    def ref(w, lo, hi):
        return p_logits[lo:hi]

    def other(w, lo, hi):
        return q_logits[lo:hi]

    same, moved = measure_quality(ref, {"same": ref, "moved": other}, [5, 1, 1, 1], 4)
    assert same.mean_kl == 0 and same.top1 == 1 and same.ppl_ratio == 1
    # KL = sum p (l_p - l_q) - log Z_p + log Z_q = -3 p_0 + log(Z_q / Z_p), Z_p = e + 7, Z_q = e^3 + e + 6
    z_p, z_q = math.e + 7, math.e**3 + math.e + 6
    assert moved.mean_kl == pytest.approx(-3 / z_p + math.log(z_q / z_p), rel=1e-5)
    assert moved.positions == 2 and moved.top1 == 0
    # the scored tokens are 1 and 1 (the window's second half): NLL under p is log(Z_p / e), under q log(Z_q / e)
    assert moved.ppl_ratio == pytest.approx(z_q / z_p, rel=1e-5)


def _scored(kl: torch.Tensor, agree: float = 0.97, nll_shift: float = 0.0) -> QualityRow:
    """A row from made-up per-window scores: KL as given [windows, n], agreement on the first `agree` share of
    each window's positions, NLL 2.3 nats (+ nll_shift) against the reference's 2.3."""
    w, n = kl.shape
    agree_t = (torch.arange(n) < round(agree * n)).float().expand(w, n)
    ref = torch.full((w, n), 2.3)
    s = Scores(kl, agree_t, ref + nll_shift, ref)
    mean_kl, p99, top1, ratio = s.measures(torch.arange(w)).tolist()
    return QualityRow("x", mean_kl, p99, top1, ratio * 10.0, 10.0, w * n, s)


def test_worse_than_counts_only_what_the_noise_cannot_explain():
    g = torch.Generator().manual_seed(1)
    base = torch.rand(20, 256, generator=g) * 2e-3  # llama.cpp's made-up KL: 20 windows, 256 positions each
    bound = _scored(base)
    assert worse_than(bound, bound) == []  # equal scores: no difference
    # 5% more KL at every position of every window: a difference no resample of the windows can hide
    worse = worse_than(_scored(base * 1.05), bound)
    assert [w.split(" worse")[0] for w in worse] == ["mean KL", "p99 KL"]
    # the same mean excess, but in two windows only and none elsewhere: the mean is within what the windows' spread
    # allows (the p99, which those two windows now set, is not)
    lumpy = base.clone()
    lumpy[:2] *= 1.5  # +50% in 2 of 20 windows: +5% overall
    assert lumpy.mean() > base.mean()
    assert [w.split(" worse")[0] for w in worse_than(_scored(lumpy), bound)] == ["p99 KL"]
    # fewer agreements in every window, and a perplexity drift in every window, are worse too
    assert worse_than(_scored(base, agree=0.95), bound)[0].startswith("top-1 worse by 0.0195")
    assert worse_than(_scored(base, nll_shift=0.01), bound)[0].startswith("perplexity drift worse")
    assert worse_than(_scored(base, nll_shift=-0.01), bound)[0].startswith("perplexity drift worse")  # either way


def test_one_window_compares_the_figures_as_they_are():
    base = torch.full((1, 256), 1e-3)
    bound = _scored(base)
    assert worse_than(_scored(base * 1.001), bound)[0].startswith("mean KL 1.00e-03 > 1.00e-03")
    assert worse_than(_scored(base), bound) == []


def test_rows_of_different_windows_cannot_be_compared():
    with pytest.raises(ValueError, match="different windows"):
        worse_than(_scored(torch.ones(3, 4)), _scored(torch.ones(2, 4)))


# K/V stored at 16 bits against float32 K/V (the reference), on the native blocks. Rounding a K or V value to
# nearest even moves it by at most u of itself: u = 2^-9 for bfloat16, 2^-12 for float16. A logit moves in
# proportion to u, and KL ~ 1/2 E[(delta logit)^2] in proportion to u^2: float16's KL is (2^-3)^2 = 1/64 of
# bfloat16's. On this text bfloat16 K/V measured mean KL 2.9e-5 and p99 2.2e-4; the bounds leave ~4x room,
# and float8 e4m3 K/V (u = 2^-4: 32x bfloat16's, so ~1000x its KL) breaks them. q8_0 rounds each value to a
# step of its block's largest |x| / 127: an error up to 2^-8 of that largest value, not of the value itself, so
# for the typical value (a few times smaller than its block's largest) ~10-40x bfloat16's KL: measured mean
# 4.7e-4, p99 4.4e-3, top-1 99.6%, PPL ratio 1.003; its bounds leave ~4x room, and float8 K/V breaks them too.
BF16_KV = Limits(mean_kl=1.2e-4, p99_kl=1e-3, top1=0.98, ppl_drift=2e-3)
Q8_0_KV = Limits(mean_kl=2e-3, p99_kl=2e-2, top1=0.98, ppl_drift=1e-2)


@pytest.mark.slow
def test_16bit_and_q8_0_kv_pass_bounds_from_their_rounding_and_coarser_kv_fails_them(smollm_native, monkeypatch):
    from prefill.model.batch import ForwardBatch

    ids = held_out_ids(smollm_native.tokenizer, SHORT)
    ref = engine_logits(smollm_native)
    paths = {kv: engine_logits(smollm_native, kv) for kv in ("bfloat16", "float16", "q8_0")}
    bf16, f16, q8_0 = measure_quality(ref, paths, ids, WINDOW)
    assert BF16_KV.check(bf16) == [] and bf16.mean_kl > 0  # the rounding is there, and within its bound
    assert f16.mean_kl < bf16.mean_kl / 16  # u^2 says 1/64
    assert Q8_0_KV.check(q8_0) == [] and q8_0.mean_kl > 4 * bf16.mean_kl

    store, fp8 = ForwardBatch.store, engine_logits(smollm_native)

    def coarse(self, layer, k, v):  # K/V rounded to float8 e4m3 before the pool stores them
        return store(self, layer, k.to(torch.float8_e4m3fn).float(), v.to(torch.float8_e4m3fn).float())

    def planted(w, lo, hi):
        with monkeypatch.context() as m:
            m.setattr(ForwardBatch, "store", coarse)
            return fp8(w, lo, hi)

    (coarse_row,) = measure_quality(ref, {"fp8 K/V": planted}, ids, WINDOW)
    for limits in (BF16_KV, Q8_0_KV):
        broken = limits.check(coarse_row)
        assert broken and broken[0].startswith("mean KL")
