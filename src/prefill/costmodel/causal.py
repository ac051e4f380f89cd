"""The causal rule of prefill: which positions a token may attend, how many pairs that is, and a toy proof
that processing all positions at once gives what one position at a time gives. Numpy only."""

from __future__ import annotations

import numpy as np


def _prompt_length(P: int) -> int:
    if isinstance(P, bool) or not isinstance(P, (int, np.integer)) or P < 0:
        raise ValueError(f"prompt length P must be an integer >= 0, got {P!r}")
    return int(P)


def causal_pairs(P: int) -> int:
    """The (token, earlier-or-same token) pairs causal attention computes for P tokens: P(P+1)/2."""
    P = _prompt_length(P)
    return P * (P + 1) // 2


def causal_mask(P: int) -> np.ndarray:
    """A (P, P) bool array, True where query position row may attend key position column (column <= row)."""
    return np.tril(np.ones((_prompt_length(P), P), dtype=bool))  # [P, P]


def causal_blocks(P: int, scale: int) -> list[str]:
    """The causal mask of P tokens seen in cells of `scale` x `scale` tokens (the last row and column of cells
    hold what is left), one string per row of cells: '1' where every pair may attend (the cell's keys all come
    before its queries), '0' where none may, 'd' on the diagonal (each query its own and the earlier keys; '1' for
    a cell of one token)."""
    P = _prompt_length(P)
    if scale < 1:
        raise ValueError(f"a cell holds at least one token, got scale {scale}")
    n = -(-P // scale)
    diagonal = ["d" if min(scale, P - I * scale) > 1 else "1" for I in range(n)]  # a cell of one token: its pair
    return ["".join("1" if J < I else diagonal[I] if J == I else "0" for J in range(n)) for I in range(n)]


def prefill_matches_sequential(X: np.ndarray, W: np.ndarray) -> bool:
    """True iff a causal running sum of X @ W computed for all positions at once (np.cumsum) equals the
    same sum built one position at a time, as decode would.

    X is (P, d) prompt vectors and W a (d, d) matrix; other shapes raise ValueError.
    """
    X, W = np.asarray(X, dtype=float), np.asarray(W, dtype=float)
    if X.ndim != 2 or W.ndim != 2 or W.shape != (X.shape[1], X.shape[1]):
        raise ValueError(f"need X of shape (P, d) and W of shape (d, d); got X {X.shape} and W {W.shape}")
    parallel = np.cumsum(X @ W, axis=0)  # [P, d]: row i sums positions 0..i
    sequential = np.zeros_like(parallel)  # [P, d]
    running = np.zeros(X.shape[1])  # [d]
    for i in range(X.shape[0]):
        running = running + X[i] @ W  # only position i is new; earlier ones are already in the sum
        sequential[i] = running
    return bool(np.allclose(parallel, sequential))
