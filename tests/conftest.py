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
# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
HEAVY_FIRST = ("plan/test_gpu_validation.py", "engine/test_cache_hit_greedy.py", "server/test_serve_openapi.py",
               "plan/test_fit_live.py", "lesson/test_lesson_openapi.py", "cli/test_cli_engine.py",
               "engine/test_scoring.py", "engine/test_engine.py", "cli/test_cli_score.py", "server/test_lm_eval.py",
               "engine/test_deterministic.py", "engine/test_kv_tier.py", "bench/test_bench_real.py",
               "lesson/test_lesson_browser.py", "server/test_serve_robust.py")
# fmt: on


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0].removeprefix("tests/"), len(rank)))


@pytest.fixture(scope="session")
def smollm():
    """The embedded SmolLM2-135M-Instruct in float32 on the CPU."""
    from prefill.engine.llm import Engine

    return Engine.load(None, dtype="float32", weights="float32", progress=False)


def converted_once(tmp_path_factory, name: str, convert, save, load):
    """What `convert()` returns, made once per run: the first xdist worker to need it saves it (`save(it, folder)`)
    in the run's shared temporary folder under `name`, and every later user (this worker or the other) gets
    `load(folder)` instead of converting again."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the parent is this run's own
    folder = shared / name
    with FileLock(f"{folder}.lock"):
        if folder.is_dir():
            return load(str(folder))
        made = convert()
        tmp = shared / f"{name}.{os.getpid()}"
        tmp.mkdir()
        save(made, tmp)
        tmp.rename(folder)
        return made


@pytest.fixture(scope="session")
def smollm_native():
    """The same model on the GGUF's own quantized blocks (Q8_0 + Q4_1; activations and KV cache float32). A decode
    step reads about a quarter of float32's bytes, so the decode-heavy proofs whose property does not depend on
    how weights are stored (scheduling, preemption) run on it in a third of the time."""
    from prefill.engine.llm import Engine

    return Engine.load(None, dtype="float32", weights="native", progress=False)


@pytest.fixture(scope="session")
def smollm_reference(smollm, tmp_path_factory):
    """The same GGUF weights in Hugging Face transformers (float32), the reference implementation.

    transformers converts the GGUF itself (gguf's reader and dequantization, independent of ours) in ~6 s here,
    once per run; the copy saved as safetensors loads in a second, bitwise the same weights."""
    from safetensors.torch import save_model

    from prefill.engine.proofs import load_reference

    def save(model, folder):
        model.config.save_pretrained(folder)
        save_model(model, str(folder / "model.safetensors"))

    return converted_once(
        tmp_path_factory, "smollm-reference", lambda: load_reference(smollm.source), save, load_reference
    )


@pytest.fixture(scope="session")
def smollm_reference_tokenizer(smollm, tmp_path_factory):
    """transformers' own tokenizer of the embedded GGUF (built from the file's vocabulary by transformers, ~3 s),
    once per run; the saved tokenizer.json loads in well under a second and tokenizes the same."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from prefill.costmodel.gguf_file import quick_gguf_parsing

    path = Path(smollm.source)

    def convert():
        with quick_gguf_parsing():
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    def save(tokenizer, folder):
        tokenizer.save_pretrained(folder)

    return converted_once(tmp_path_factory, "smollm-reference-tokenizer", convert, save, AutoTokenizer.from_pretrained)


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """Probe rates and compile verdicts go to the run's own folder, not the user's ~/.cache/prefill: one folder for
    both xdist workers (the run's shared temporary folder), so a path probed by one is read by the other, as two
    processes of one user share ~/.cache/prefill. Its files are written whole (prefill.device.cache.write_json);
    a test that needs an empty cache sets PREFILL_CACHE_DIR to its own tmp_path."""
    import os

    old = os.environ.get("PREFILL_CACHE_DIR")
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "prefill-cache"
    folder.mkdir(exist_ok=True)
    os.environ["PREFILL_CACHE_DIR"] = str(folder)
    yield
    if old is None:
        os.environ.pop("PREFILL_CACHE_DIR", None)
    else:
        os.environ["PREFILL_CACHE_DIR"] = old
