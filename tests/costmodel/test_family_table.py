"""The family table (prefill.costmodel.families): lookups, attention patterns, and adding a family as one entry."""

import dataclasses

import pytest

from prefill.costmodel import families
from prefill.costmodel.families import Family, check_runnable, family_of, layer_windows
from prefill.costmodel.specs import ModelSpec
from prefill.errors import ModelFileError


def test_lookup_by_config_type_gguf_arch_or_name():
    assert family_of("gemma3_text") is family_of("gemma3") is family_of("gemma3")
    assert family_of("smollm2").name == "llama"
    assert family_of("qwen2").qkv_bias and family_of("qwen3").qk_norm
    gemma = family_of("gemma3")
    assert gemma.post_norms and gemma.norm_plus_one and gemma.embed_scale and gemma.activation == "gelu_tanh"
    assert gemma.embedding_scale(640) == pytest.approx(640**0.5) and family_of("llama").embedding_scale(640) == 1.0


def test_unknown_and_calculator_only_families_are_refused_by_the_decoder():
    assert not family_of("mamba").supported  # shapes still readable by the calculator
    with pytest.raises(ModelFileError, match="architecture 'mamba' is not supported"):
        check_runnable("mamba")
    with pytest.raises(ModelFileError, match="'gemma2' is not supported .*gemma3_text"):
        check_runnable("gemma2")


def test_attention_patterns():
    gemma3, gemma2, mistral, llama = (family_of(a) for a in ("gemma3", "gemma2", "mistral", "llama"))
    assert layer_windows(gemma3, 7, 512) == (512,) * 5 + (None, 512)  # every sixth layer global
    assert layer_windows(gemma3, 4, 512, pattern=2) == (512, None, 512, None)
    assert layer_windows(gemma3, 3, 8, ["full_attention", "sliding_attention", "full_attention"]) == (None, 8, None)
    assert layer_windows(gemma2, 4, 4096) == (4096, None, 4096, None)
    assert layer_windows(mistral, 3, 4096) == (4096,) * 3
    assert layer_windows(mistral, 3, None) == (None,) * 3
    assert layer_windows(llama, 3, 4096) == (None,) * 3  # a Llama config's window key means nothing
    with pytest.raises(ModelFileError, match="layer_types"):
        layer_windows(gemma3, 3, 8, ["full_attention"])


def test_a_llama_like_family_is_one_table_entry(monkeypatch):
    """What the README promises: one Family(...) line, and the spec reader and the decoder know the family."""
    from prefill.model.transformer import Transformer

    entry = Family("olmo2", ("olmo2",), ("olmo2",), qk_norm=True)
    monkeypatch.setattr(families, "FAMILIES", (*families.FAMILIES, entry))
    config = {
        "model_type": "olmo2",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "max_position_embeddings": 128,
    }
    spec = ModelSpec.from_hf_config(config)
    assert spec.family is entry and spec.qk_norm and not spec.windowed
    model = Transformer(spec)
    assert model.layers[0].q_norm is not None and model.layers[0].attn_post_norm is None
    assert dataclasses.replace(spec, qk_norm=False).N == spec.N - 2 * 2 * 16  # q/k norm weights counted
