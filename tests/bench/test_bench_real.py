"""A tiny sweep on the embedded SmolLM2 with its peers: every engine timed on the same tokens."""

import pytest

from prefill.bench.peers import llamacpp_available
from prefill.bench.results import OURS, BenchConfig
from prefill.bench.runner import run_bench


@pytest.mark.slow
def test_tiny_sweep_on_the_embedded_model_with_peers():
    cfg = BenchConfig(
        prompt_lengths=(32, 64),
        dtypes=("float32",),
        repeats=1,
        warmup=0,
        peers=("transformers", "llamacpp"),
        threads=1,  # the xdist worker's one core (two threads on it wait on each other: 99 s, not 37)
        llama_dense=False,
    )
    # llama_dense=False: the F32 copy for llama.cpp is tested in test_dense_gguf.py
    result = run_bench(cfg)
    assert result.spec.L == 30 and result.spec.d_model == 576  # SmolLM2-135M
    engines = {m.engine for m in result.measurements}
    assert {OURS, "transformers"} <= engines
    if llamacpp_available():
        assert "llamacpp" in engines
        assert result.find("llamacpp", "gguf", 32).mfu is None  # its own quantized types: no dtype to compare
    else:
        assert any("llama-cpp-python is not installed" in n for n in result.notes)
    for P in (32, 64):
        ours, hf = result.find(OURS, "float32", P), result.find("transformers", "float32", P)
        assert ours.flops == hf.flops  # the same prompt, the same FLOPs: only the seconds differ
        assert result.speedup("transformers", "float32", P) == pytest.approx(hf.median_s / ours.median_s)
    assert result.machine["threads"] == 1 and result.machine["transformers"]
