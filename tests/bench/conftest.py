"""The benchmark tests' shared fixture: a tiny random Llama folder, quick to load and to sweep."""

import json

import pytest
import torch
from safetensors.torch import save_file

# big enough that the matmuls, not Python, dominate a 1024-token prefill (so calibration has signal)
# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 1024,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "float32",
}
# fmt: on


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A Hugging Face-style folder: config.json + model.safetensors with random weights (no tokenizer)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    g = torch.Generator().manual_seed(0)
    d, f, kv, v = 256, 1024, 2 * 64, 256

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    sd = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": torch.ones(d), "lm_head.weight": w(v, d)}
    for i in range(2):
        p = f"model.layers.{i}."
        sd |= {
            p + "input_layernorm.weight": torch.ones(d),
            p + "post_attention_layernorm.weight": torch.ones(d),
            p + "self_attn.q_proj.weight": w(d, d),
            p + "self_attn.k_proj.weight": w(kv, d),
            p + "self_attn.v_proj.weight": w(kv, d),
            p + "self_attn.o_proj.weight": w(d, d),
            p + "mlp.gate_proj.weight": w(f, d),
            p + "mlp.up_proj.weight": w(f, d),
            p + "mlp.down_proj.weight": w(d, f),
        }
    save_file(sd, str(folder / "model.safetensors"))
    return folder
