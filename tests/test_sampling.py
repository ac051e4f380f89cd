import pytest
import torch

from prefill.errors import BadInput
from prefill.sampling import SamplingParams, sample

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
