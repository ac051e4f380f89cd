"""Parity with the reference implementation: Hugging Face transformers on the same GGUF weights."""

import pytest

from prefill.engine import proofs as verify

pytestmark = pytest.mark.slow


def test_logits_kv_and_greedy_tokens_match_transformers(smollm, smollm_reference):
    ids = smollm.encode_prompt("What is the capital of France?")
    checks = verify.parity_with_reference(smollm, smollm_reference, ids, new_tokens=8)
    names = [c.name for c in checks]
    assert any("K and V" in n for n in names)
    for c in checks:
        assert c.ok, (c.name, c.measured)


def test_reference_answers_paris_like_us(smollm, smollm_reference):
    import torch

    ids = smollm.encode_prompt("What is the capital of France?")
    out = smollm_reference.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)
    ref_text = smollm.tokenizer.decode(out[0, len(ids) :].tolist())
    assert ref_text.startswith("The capital of France is Paris.")


def test_gguf_tokenizer_matches_transformers_tokenizer(smollm):
    from pathlib import Path

    from transformers import AutoTokenizer

    path = Path(smollm.source)
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in [
        "What is the capital of France?",
        "Numbers: 12345 and 3.14159, year 2026!",
        "café, naïve, 日本語, emoji 🙂",
        "  leading spaces\n\nnew lines\ttabs",
        "<|im_start|>user\nhi<|im_end|>\n",
        "don't won't they'll I'm",
    ]:
        assert smollm.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False), text
        assert smollm.tokenizer.decode(smollm.tokenizer.encode(text), skip_special=False) == text
