import pytest
import torch

from prefill.engine.sampling import SEED_MAX, SEED_MIN, NothingToSample, SamplingParams, sample
from prefill.errors import BadInput

LOGITS = torch.tensor([[0.0, 3.0, 1.0, 2.9, -1.0]])


def test_greedy_is_argmax():
    assert sample(LOGITS, SamplingParams()).tolist() == [1]


def test_top_k_1_and_tiny_top_p_are_greedy_even_when_hot():
    for params in (
        SamplingParams(temperature=5.0, top_k=1, seed=1),
        SamplingParams(temperature=5.0, top_p=1e-6, seed=1),
    ):
        draws = {int(sample(LOGITS, params, params.generator("cpu"))) for _ in range(20)}
        assert draws == {1}


def test_top_k_keeps_only_the_k_best():
    params = SamplingParams(temperature=10.0, top_k=2, seed=0)
    g = params.generator("cpu")
    assert {int(sample(LOGITS, params, g)) for _ in range(200)} == {1, 3}


def test_top_p_keeps_the_nucleus():
    # probabilities at T=1: token 1 and 3 hold ~0.46 + ~0.42; top_p 0.8 needs both, never the rest
    params = SamplingParams(temperature=1.0, top_p=0.8, seed=0)
    g = params.generator("cpu")
    assert {int(sample(LOGITS, params, g)) for _ in range(300)} == {1, 3}


def test_seed_reproduces_draws():
    params = SamplingParams(temperature=1.0, seed=42)
    a = [int(sample(LOGITS, params, g)) for g in [params.generator("cpu")] for _ in range(30)]
    b = [int(sample(LOGITS, params, g)) for g in [params.generator("cpu")] for _ in range(30)]
    assert a == b
    assert len(set(a)) > 1


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_params_refused(kw):
    with pytest.raises(BadInput):
        SamplingParams(**kw)


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": 5e-324, "seed": 1},
        {"temperature": 1e-45, "seed": 1},
        {"temperature": 1e-6},
        {"temperature": 1.0, "top_p": 1e-300, "seed": 1},
        {"temperature": 2.0, "top_p": 1e-45},
    ],
)
def test_tiny_temperature_or_top_p_is_the_greedy_token_not_nan(kw):
    params = SamplingParams(**kw)
    g = params.generator("cpu")
    assert {int(sample(LOGITS, params, g)) for _ in range(20)} == {1}


def test_nan_and_inf_logits_never_reach_the_draw():
    logits = torch.tensor([[float("nan"), 1.0, 0.5, float("nan"), -1.0], [0.0, float("inf"), 1.0, 2.0, float("nan")]])
    for params in (SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9, seed=3)):
        for _ in range(20):
            ids = sample(logits, params, params.generator("cpu")).tolist()
            assert ids[0] in (1, 2, 4) and ids[1] == 1
    with pytest.raises(NothingToSample):
        sample(torch.full((1, 5), float("nan")), SamplingParams(temperature=1.0))


def test_huge_logits_and_tiny_temperature_stay_finite():
    logits = torch.tensor([[3e38, -3e38, 1e38, 0.0]])
    params = SamplingParams(temperature=1e-5, seed=0)
    assert {int(sample(logits, params, params.generator("cpu"))) for _ in range(10)} == {0}


def test_logit_bias_bans_and_boosts_per_row():
    ban = SamplingParams(logit_bias=((1, -100.0),))
    assert sample(LOGITS, ban).tolist() == [3]  # greedy's token 1 banned: the runner-up
    assert sample(LOGITS.repeat(3, 1), ban).tolist() == [3, 3, 3]  # [B, vocab] rows alike
    boost = SamplingParams(temperature=1.0, seed=0, logit_bias=((4, 100.0),))
    g = boost.generator("cpu")
    assert {int(sample(LOGITS, boost, g)) for _ in range(50)} == {4}
    everything = SamplingParams(logit_bias=tuple((i, -100.0) for i in range(5)))
    with pytest.raises(NothingToSample):
        sample(LOGITS, everything)


@pytest.mark.parametrize(
    "kw",
    [{"seed": 2**64}, {"seed": -(2**63) - 1}, {"logit_bias": ((1, 101.0),)}, {"logit_bias": ((-1, 1.0),)}],
)
def test_seed_and_bias_out_of_range_refused(kw):
    with pytest.raises(BadInput):
        SamplingParams(**kw)


def test_seed_range_edges_are_accepted_by_torch():
    for seed in (SEED_MIN, SEED_MAX, 0):
        assert SamplingParams(temperature=1.0, seed=seed).generator("cpu") is not None


def test_greedy_rows_on_the_cpu_take_one_pass_and_pick_what_the_full_path_picks(monkeypatch):
    """A decode step's greedy rows are picked by one argmax on the CPU (the full path made 8 passes over the
    vocabulary: 1 ms of a 30 ms step); NaN, +inf, -inf and ties give the same picks and `ok` as the full path."""
    from prefill.engine import sampling

    inf, nan = float("inf"), float("nan")
    rows = [
        [0.5, 2.0, 2.0, -1.0, 0.0],  # a tie: the first
        [0.0, inf, 1.0, inf, -inf],  # +inf wins, the first of them
        [-inf, -inf, -inf, -inf, -inf],  # everything banned
        [1.0, nan, 3.0, 0.0, 2.0],  # NaN never wins
        [nan, nan, nan, nan, nan],  # nothing to draw
    ]
    fast_calls = []
    monkeypatch.setattr(sampling, "_greedy_cpu", lambda x, f=sampling._greedy_cpu: fast_calls.append(1) or f(x))
    for subset in ([0, 1, 2], [0, 1, 2, 3], [3, 4], [4]):
        logits = torch.tensor([rows[i] for i in subset])
        fast = sampling.sample_rows(logits, [SamplingParams()] * len(subset), [None] * len(subset))
        with monkeypatch.context() as m:
            m.setattr(sampling, "_greedy_cpu", lambda x: None)
            full = sampling.sample_rows(logits, [SamplingParams()] * len(subset), [None] * len(subset))
        assert torch.equal(fast[1], full[1]), subset
        ok = full[1]
        assert torch.equal(fast[0][ok], full[0][ok]), subset
    assert len(fast_calls) == 4
    tokens, ok = sampling.sample_rows(torch.tensor(rows[:3]), [SamplingParams()] * 3, [None] * 3)
    assert tokens[:2].tolist() == [1, 1] and ok.tolist() == [True, True, False]
