"""Model files in: the embedded GGUF, the rotary un-permutation, and every bad file a user can hand us."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prefill.costmodel.families import family_of
from prefill.engine.llm import Engine
from prefill.errors import ModelFileError
from prefill.loading import default_model_path
from prefill.loading.gguf import hf_name, unpermute_qk
from tiny_models import llama_cpp_permute

PREFILL = Path(sys.executable).parent / "prefill"


@pytest.mark.parametrize("shape,heads", [((12, 5), 3), ((64, 16), 4), ((8,), 2)])
def test_unpermute_inverts_llama_cpp_permute(shape, heads):
    w = np.random.default_rng(0).standard_normal(shape)
    assert np.array_equal(unpermute_qk(llama_cpp_permute(w, heads), heads), w)
    assert not np.array_equal(llama_cpp_permute(w, heads), w)


def test_gguf_names_map_to_hf_names():
    assert hf_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_gate.weight") == "model.layers.0.mlp.gate_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("rope_freqs.weight") is None
    # the same GGUF norm name means a different Hugging Face norm in a four-norm family
    gemma = family_of("gemma3")
    assert hf_name("blk.2.ffn_norm.weight") == "model.layers.2.post_attention_layernorm.weight"
    assert hf_name("blk.2.ffn_norm.weight", gemma) == "model.layers.2.pre_feedforward_layernorm.weight"
    assert hf_name("blk.2.post_attention_norm.weight", gemma) == "model.layers.2.post_attention_layernorm.weight"
    assert hf_name("blk.2.post_ffw_norm.weight", gemma) == "model.layers.2.post_feedforward_layernorm.weight"


def test_embedded_model_is_found_by_distribution_metadata():
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 90_000_000


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        Engine.load(str(tmp_path / "nope.gguf"), progress=False)


def test_truncated_gguf(tmp_path):
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(default_model_path().read_bytes()[:3_000_000])
    with pytest.raises(ModelFileError, match="truncated"):
        Engine.load(str(bad), progress=False)


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "text.gguf"
    bad.write_text("hello")
    with pytest.raises(ModelFileError):
        Engine.load(str(bad), progress=False)


def test_gguf_of_unknown_architecture(tmp_path):
    import gguf

    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    for key, value in [
        ("block_count", 1),
        ("embedding_length", 8),
        ("feed_forward_length", 16),
        ("context_length", 32),
        ("vocab_size", 10),
    ]:
        w.add_uint32(f"mamba.{key}", value)
    w.add_uint32("mamba.attention.head_count", 2)
    w.add_tensor("token_embd.weight", np.zeros((10, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="architecture 'mamba' is not supported"):
        Engine.load(str(path), progress=False)


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelFileError, match="no config.json"):
        Engine.load(str(tmp_path), progress=False)


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 8,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "intermediate_size": 16,
                "vocab_size": 10,
                "max_position_embeddings": 32,
            }
        )
    )
    with pytest.raises(ModelFileError, match="no \\*.safetensors"):
        Engine.load(str(tmp_path), progress=False)


def _cli(*args):
    return subprocess.run([str(PREFILL), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [(["run", ""], "empty"), (["run", "word " * 9000, "--raw"], "context length")])
def test_cli_bad_prompt_on_the_real_model(args, needle):
    r = _cli(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr + r.stdout
    assert needle in r.stderr
