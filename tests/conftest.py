"""Shared fixtures: the embedded model is loaded once per test session (it takes seconds, not minutes)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on the machine's cores: one thread each
    os.environ["OMP_NUM_THREADS"] = "1"  # also for the commands the tests start as subprocesses
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm():
    """The embedded SmolLM2-135M-Instruct in float32 on the CPU."""
    from prefill.engine.llm import Engine

    return Engine.load(None, dtype="float32", weights="float32", progress=False)


@pytest.fixture(scope="session")
def smollm_reference(smollm):
    """The same GGUF weights in Hugging Face transformers (float32), the reference implementation."""
    from prefill.engine.proofs import load_reference

    return load_reference(smollm.source)


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """Probe rates and compile verdicts go to a per-session folder, not the user's ~/.cache/prefill."""
    import os

    old = os.environ.get("PREFILL_CACHE_DIR")
    os.environ["PREFILL_CACHE_DIR"] = str(tmp_path_factory.mktemp("prefill-cache"))
    yield
    if old is None:
        os.environ.pop("PREFILL_CACHE_DIR", None)
    else:
        os.environ["PREFILL_CACHE_DIR"] = old
