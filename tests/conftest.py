"""Shared fixtures: the embedded model is loaded once per test session (it takes seconds, not minutes)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on the machine's cores: one thread each
    os.environ["OMP_NUM_THREADS"] = "1"  # also for the commands the tests start as subprocesses
    import torch

    torch.set_num_threads(1)


# The files that take longest (pytest --durations), started first: the two workers then end on short files
# together instead of one of them alone on a long one. Each file's tests stay together and in their order.
HEAVY_FIRST = ("server/test_serve_openapi.py", "cli/test_cli_engine.py", "bench/test_bench_real.py",
               "engine/test_scoring.py", "server/test_lm_eval.py", "engine/test_engine.py", "cli/test_cli_score.py",
               "bench/test_dense_gguf.py", "engine/test_deterministic.py", "server/test_serve_robust.py")  # fmt: skip


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0].removeprefix("tests/"), len(rank)))


@pytest.fixture(scope="session")
def smollm():
    """The embedded SmolLM2-135M-Instruct in float32 on the CPU."""
    from prefill.engine.llm import Engine

    return Engine.load(None, dtype="float32", weights="float32", progress=False)


@pytest.fixture(scope="session")
def smollm_reference(smollm, tmp_path_factory):
    """The same GGUF weights in Hugging Face transformers (float32), the reference implementation.

    transformers converts the GGUF itself (its own reader and dequantization, independent of ours) in ~30 s here;
    the first xdist worker to need it saves what it converted as safetensors in the run's shared temporary folder,
    and the other worker loads that copy in a second or two."""
    from filelock import FileLock
    from safetensors.torch import save_model

    from prefill.engine.proofs import load_reference

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the parent is this run's own
    folder = shared / "smollm-reference"
    with FileLock(f"{folder}.lock"):
        if (folder / "model.safetensors").is_file():
            return load_reference(str(folder))
        model = load_reference(smollm.source)
        tmp = shared / f"smollm-reference.{os.getpid()}"
        tmp.mkdir()
        model.config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        tmp.rename(folder)
        return model


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
