"""The proofs' tolerance comes from the arithmetic, and a near-tie is the only token difference it forgives."""

import math

import torch

from prefill.costmodel.specs import ModelSpec
from prefill.engine.proofs import greedy_agreement, rounding_tolerance, top2_margin


def test_rounding_tolerance_is_u_sqrt_k_layers_magnitude():
    spec = ModelSpec.from_preset("smollm2-135m")
    u = 2.0**-24
    assert math.isclose(rounding_tolerance(25.0, spec, torch.float32), u * math.sqrt(1536) * 30 * 25.0)
    assert 1.5e-3 < rounding_tolerance(25.0, spec, torch.float32) < 2.0e-3
    assert rounding_tolerance(25.0, spec, torch.bfloat16) > 1e4 * rounding_tolerance(25.0, spec, torch.float32) / 2


def _row(*top: float) -> torch.Tensor:
    row = torch.full((8,), -10.0)
    row[: len(top)] = torch.tensor(top)
    return row


def test_greedy_agreement_forgives_only_near_ties():
    same = [_row(5.0, 1.0), _row(1.0, 4.0)]
    assert greedy_agreement(same, same, 1e-3) == (0, "")
    # The reference's top two differ by 1e-4 < tolerance: a coin toss of summation order, reported, not counted.
    ours, ref = [_row(5.0, 1.0), _row(3.0, 2.9999)], [_row(5.0, 1.0), _row(2.9999, 3.0)]
    n, note = greedy_agreement(ours, ref, 1e-3)
    assert n == 0 and "near-tie at step 1" in note
    # The same flip with a margin of 0.5: a real difference.
    ours, ref = [_row(5.0, 1.0), _row(3.0, 2.5)], [_row(5.0, 1.0), _row(2.5, 3.0)]
    n, note = greedy_agreement(ours, ref, 1e-3)
    assert n == 1 and "step 1" in note
    assert top2_margin(_row(2.5, 3.0)) == 0.5
