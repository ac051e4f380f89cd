"""Bytes per weight of every storage, and what a spec's weights and a decode step weigh in each."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefill.costmodel import costs
from prefill.costmodel.specs import ModelSpec
from prefill.costmodel.storage import (
    GGUF_BLOCKS,
    GGUF_BYTES_PER_WEIGHT,
    bytes_per_weight,
    decode_step_bytes,
    decode_weight_bytes,
    projection_params,
    weight_bytes,
)
from prefill.errors import BadInput

SMOLLM = ModelSpec.from_preset("smollm2-135m")


def test_bytes_per_weight_of_the_block_formats():
    assert bytes_per_weight("Q4_0") == 18 / 32
    assert bytes_per_weight("q4_1") == 20 / 32 == 0.625  # 5.0 bits a weight
    assert bytes_per_weight("Q8_0") == 34 / 32
    assert bytes_per_weight("Q4_K") == 144 / 256 == 0.5625  # 4.5 bits
    assert bytes_per_weight("Q5_K") == 176 / 256
    assert bytes_per_weight("Q6_K") == 210 / 256
    assert bytes_per_weight("F16") == bytes_per_weight("bf16") == 2
    assert bytes_per_weight("float32") == bytes_per_weight("F32") == 4
    with pytest.raises(BadInput, match="unknown weight storage"):
        bytes_per_weight("Q3_X")


def test_smollm_weight_bytes_as_stored_in_the_embedded_file():
    # 30 layers of Q/K/V/O and the MLP: 30 * (576 * 960 + 576 * 576 + 3 * 576 * 1536) = 106,168,320 weights.
    assert projection_params(SMOLLM) == 106_168_320
    # Q4_1 projections, a Q8_0 tied embedding (49,152 x 576), float32 norms (61 x 576).
    expected = 106_168_320 * 0.625 + 49_152 * 576 * 34 / 32 + 61 * 576 * 4
    assert weight_bytes(SMOLLM, "Q4_1", "Q8_0") == round(expected) == 96_576_768
    assert weight_bytes(SMOLLM, "float32") == 4 * SMOLLM.N == 538_060_032
    assert weight_bytes(SMOLLM, "bfloat16") == 2 * SMOLLM.N
    # Tied: the step reads the embedding matrix as the unembedding, so a decode step reads every byte.
    assert decode_weight_bytes(SMOLLM, "Q4_1", "Q8_0") == 96_576_768


def test_an_untied_embedding_is_not_read_by_a_decode_step():
    spec = ModelSpec.from_preset("llama-3-8b")
    emb = spec.vocab_size * spec.d_model
    assert not spec.tied_embeddings
    assert weight_bytes(spec, "Q4_K") - decode_weight_bytes(spec, "Q4_K") == round(emb * 144 / 256)


def test_decode_step_bytes_add_the_kv_cache_read():
    kv = costs.kv_cache_bytes_for(SMOLLM, 1024, 4)
    assert kv == 2 * 30 * 3 * 1024 * 64 * 4  # 47.2 MB of float32 K/V at 1,024 tokens
    assert decode_step_bytes(SMOLLM, "Q4_1", "Q8_0", 1024, 4) == 96_576_768 + kv


@given(st.sampled_from(sorted(GGUF_BLOCKS)))
def test_every_block_format_is_smaller_than_float32_and_bytes_grow_with_bits(qtype):
    assert 0 < GGUF_BYTES_PER_WEIGHT[qtype] <= 4
    assert weight_bytes(SMOLLM, qtype) <= weight_bytes(SMOLLM, "float32")
