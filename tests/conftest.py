"""Shared fixtures: the embedded model is loaded once per test session (it takes seconds, not minutes)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm():
    """The embedded SmolLM2-135M-Instruct in float32 on the CPU."""
    from prefill.engine import Engine

    return Engine.load(None, dtype="float32", progress=False)


@pytest.fixture(scope="session")
def smollm_reference(smollm):
    """The same GGUF weights in Hugging Face transformers (float32), the reference implementation."""
    from prefill.verify import load_reference

    return load_reference(smollm.source)
