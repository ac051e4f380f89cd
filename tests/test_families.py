"""Random tiny models of every supported family, made and saved by transformers, load and match it exactly."""

import pytest
import torch

from prefill.engine import Engine

pytestmark = pytest.mark.slow

COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)  # fmt: skip


def families():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    yield "llama", LlamaConfig(**COMMON, tie_word_embeddings=False)
    yield "llama-tied", LlamaConfig(**COMMON, tie_word_embeddings=True)
    rope3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 64, "rope_theta": 500000.0}  # fmt: skip
    yield "llama3-rope-scaling", LlamaConfig(**COMMON, rope_parameters=rope3)
    yield "mistral", MistralConfig(**COMMON, sliding_window=None)
    yield "qwen2", Qwen2Config(**COMMON, tie_word_embeddings=True)
    yield "qwen3", Qwen3Config(**COMMON, head_dim=32)  # head_dim != d_model / H_q: must be read, not derived


@pytest.fixture(params=list(families()), ids=lambda p: p[0], scope="module")
def saved(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    name, config = request.param
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder, max_shard_size="200KB")  # sharded: an index and several files
    return name, model, folder


def test_tiny_family_matches_transformers(saved):
    name, ref, folder = saved
    assert len(list(folder.glob("*.safetensors"))) > 1, "expected a sharded checkpoint"
    engine = Engine.load(str(folder), progress=False)
    assert engine.tokenizer is None
    if name == "qwen3":
        assert engine.spec.d_head == 32 and engine.spec.qk_norm
    if name == "qwen2":
        assert engine.spec.qkv_bias
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = ref(ids, use_cache=True)
    ours, cache = engine.prefill(ids)
    assert ours.shape == (1, 300)
    assert float((ours - out.logits[:, -1]).abs().max()) <= 1e-4
    for i, layer in enumerate(out.past_key_values.layers):
        assert float((cache.k(i) - layer.keys).abs().max()) <= 1e-4
        assert float((cache.v(i) - layer.values).abs().max()) <= 1e-4
    # decode one more position from our cache vs the reference on the longer sequence
    nxt = ours.argmax(-1)  # [1]
    cache2 = engine.new_cache(41)
    engine.prefill(ids, cache2)
    step = engine.decode_step(nxt, cache2)
    with torch.inference_mode():
        ref_step = ref(torch.cat([ids, nxt[:, None]], dim=1)).logits[:, -1]
    assert float((step - ref_step).abs().max()) <= 1e-4


def test_tiny_family_batched_decode_equals_transformers_greedy(saved):
    """Three prompts of different lengths decoded in one batch give transformers' own greedy continuation of each."""
    _, ref, folder = saved
    engine = Engine.load(str(folder), progress=False)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (7, 23, 51)]
    pool = engine.new_pool(3 * 80)
    seqs = [pool.new_seq(len(p) + 6) for p in prompts]
    logits = torch.cat([engine.prefill(p, s)[0] for p, s in zip(prompts, seqs, strict=True)])  # [3, vocab]
    ours: list[list[int]] = [[] for _ in prompts]
    for _ in range(6):
        nxt = logits.argmax(-1)  # [3]
        for row, t in zip(ours, nxt.tolist(), strict=True):
            row.append(t)
        logits = engine.decode_step(nxt, seqs)  # one forward for the three rows
    with torch.inference_mode():
        for p, row in zip(prompts, ours, strict=True):
            out = ref.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, min_new_tokens=6)
            assert out[0, len(p) :].tolist() == row
