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


def test_gguf_tokenizer_matches_transformers_tokenizer(smollm, smollm_reference_tokenizer):
    ref = smollm_reference_tokenizer
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


def test_quick_gguf_parsing_changes_nothing_transformers_loads(tmp_path):
    """The reference and the transformers peer load GGUFs under quick_gguf_parsing: the same weights, bitwise, and
    the same vocabulary as transformers' own unpatched load (a tiny Llama GGUF with a SentencePiece vocabulary)."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from prefill.costmodel.gguf_file import quick_gguf_parsing
    from tiny_models import spm_vocab, write_gguf_from_hf

    shape = dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    config = LlamaConfig(vocab_size=len(spm_vocab("llama")[0]), max_position_embeddings=256, **shape)
    torch.manual_seed(0)
    path = write_gguf_from_hf(tmp_path / "tiny.gguf", AutoModelForCausalLM.from_config(config), "llama", "llama")

    def load():
        model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
        return model, AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)

    plain_model, plain_tokenizer = load()
    original = gguf.GGUFReader
    with quick_gguf_parsing():
        assert gguf.GGUFReader is not original
        quick_model, quick_tokenizer = load()
    assert gguf.GGUFReader is original  # put back when the scope ends
    a, b = plain_model.state_dict(), quick_model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert plain_tokenizer.get_vocab() == quick_tokenizer.get_vocab()
