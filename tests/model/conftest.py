"""The kernels' instruction sets, each forced in turn: a test taking `isa` runs once per set (AVX-512 VNNI, AVX2,
scalar), and where this CPU lacks one it is skipped with the reason."""

from __future__ import annotations

import pytest

from prefill.model.quant import ops
from quant_blocks import ISAS, MISSING, runnable


@pytest.fixture(params=ISAS)
def isa(request):
    """The kernels on one instruction set for the test (restored to the best after it)."""
    if not ops.available():
        pytest.skip("the quantized kernels are not built")
    if request.param not in runnable():
        pytest.skip(MISSING[request.param])
    yield ops.set_isa(request.param)
    ops.set_isa("auto")
