"""The causal rule: pair counts, the mask of "AI is fast", and parallel == sequential."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from prefill.costmodel.causal import causal_blocks, causal_mask, causal_pairs, prefill_matches_sequential


def test_causal_pairs_worked_numbers():
    assert causal_pairs(4) == 10
    assert causal_pairs(5) == 15
    assert causal_pairs(0) == 0 and causal_pairs(1) == 1


def test_mask_of_ai_is_fast():
    expected = np.array([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=bool)  # rows "AI", "is", "fast"
    mask = causal_mask(3)
    assert mask.dtype == bool and mask.shape == (3, 3)
    np.testing.assert_array_equal(mask, expected)
    assert mask[2].all()  # the last position ("fast") sees the whole prompt


@given(P=st.integers(0, 300))
def test_mask_is_lower_triangular_with_causal_pairs_true_cells(P):
    mask = causal_mask(P)
    assert mask.shape == (P, P)
    np.testing.assert_array_equal(mask, np.tril(mask))
    assert int(mask.sum()) == causal_pairs(P) == P * (P + 1) // 2
    rows, cols = np.nonzero(mask)
    assert (cols <= rows).all()


@pytest.mark.parametrize("bad", [-1, 2.5, True, "3"])
def test_bad_prompt_lengths(bad):
    with pytest.raises(ValueError):
        causal_pairs(bad)
    with pytest.raises(ValueError):
        causal_mask(bad)


finite = st.floats(-100, 100, allow_nan=False)


@given(data=st.data(), P=st.integers(1, 24), d=st.integers(1, 8))
def test_prefill_matches_sequential_on_random_inputs(data, P, d):
    X = data.draw(arrays(np.float64, (P, d), elements=finite))
    W = data.draw(arrays(np.float64, (d, d), elements=finite))
    assert prefill_matches_sequential(X, W)


def test_prefill_matches_sequential_on_toy_example():
    X = np.arange(6.0).reshape(3, 2)  # 3 positions, d = 2
    assert prefill_matches_sequential(X, np.eye(2))


@pytest.mark.parametrize(
    "X, W",
    [
        (np.ones(3), np.eye(3)),
        (np.ones((3, 2)), np.eye(3)),
        (np.ones((3, 2)), np.ones((2, 3))),
        (np.ones((2, 2, 2)), np.eye(2)),
    ],
)
def test_prefill_matches_sequential_rejects_wrong_shapes(X, W):
    with pytest.raises(ValueError, match="shape"):
        prefill_matches_sequential(X, W)


@pytest.mark.parametrize(("P", "scale"), [(10, 3), (9, 3), (7, 1), (5, 8), (0, 2)])
def test_scaled_blocks_are_the_mask_seen_in_cells(P, scale):
    """A long prompt's mask is drawn in cells of scale x scale tokens: '1' where every pair of the cell may attend,
    '0' where none may, 'd' where some may, as the pair-by-pair mask says."""
    full, n = causal_mask(P), -(-P // scale)
    expected = []
    for I in range(n):
        row = ""
        for J in range(n):
            cell = full[I * scale : (I + 1) * scale, J * scale : (J + 1) * scale]
            row += "1" if cell.all() else "0" if not cell.any() else "d"
        expected.append(row)
    assert causal_blocks(P, scale) == expected
    with pytest.raises(ValueError):
        causal_blocks(P, 0)
