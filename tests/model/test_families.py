"""Random tiny models of every supported family, made and saved by transformers, load and match it exactly."""

import pytest
import torch

from prefill.engine.llm import Engine
from tiny_models import gemma3_config, random_gemma3

pytestmark = pytest.mark.slow

# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)
# fmt: on


def families():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    yield "llama", LlamaConfig(**COMMON, tie_word_embeddings=False)
    yield "llama-tied", LlamaConfig(**COMMON, tie_word_embeddings=True)
    rope3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 500000.0,
    }
    yield "llama3-rope-scaling", LlamaConfig(**COMMON, rope_parameters=rope3)
    yield "mistral", MistralConfig(**COMMON, sliding_window=None)
    yield "qwen2", Qwen2Config(**COMMON, tie_word_embeddings=True)
    yield "qwen3", Qwen3Config(**COMMON, head_dim=32)  # head_dim != d_model / H_q: must be read, not derived


# The names alone at collection: families() imports transformers, which a run that needs none of these pays for
FAMILIES = ("llama", "llama-tied", "llama3-rope-scaling", "mistral", "qwen2", "qwen3")


@pytest.fixture(params=FAMILIES, scope="module")
def saved(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    name = request.param
    config = dict(families())[name]
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
    seqs = [pool.new_seq() for _ in prompts]
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


# ---- Gemma 3: sliding windows, local and global layers -----------------------------------------------


@pytest.fixture(scope="module", params=[(5, False), (12, False), (8, True)], ids=["W5", "W12", "W8-softcaps"])
def gemma3(request, tmp_path_factory):
    """(transformers model, our engine) of a tiny Gemma 3 saved by transformers and loaded by us."""
    window, softcaps = request.param
    ref = random_gemma3(gemma3_config(window, softcaps))
    folder = tmp_path_factory.mktemp(f"gemma3-w{window}")
    ref.save_pretrained(folder)
    return ref, Engine.load(str(folder), progress=False)


PROMPT = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(7))  # longer than every window


def test_gemma3_spec_from_the_saved_config(gemma3):
    ref, engine = gemma3
    spec = engine.spec
    assert spec.family.name == "gemma3" and spec.d_head == 24 != spec.d_model // spec.H_q
    W = ref.config.sliding_window
    assert spec.windows == (W, None, W, W) and spec.rope_local_theta == 10000.0
    assert spec.rope_scaling["factor"] == 2.0 and spec.attention_scale == 20**-0.5
    # Gemma 3 applies a final soft-cap from its config, and (like transformers) no attention soft-cap
    assert spec.attn_softcap is None and spec.final_softcap == ref.config.final_logit_softcapping


def test_gemma3_logits_and_every_layers_window_of_kv_match_transformers(gemma3):
    ref, engine = gemma3
    P = PROMPT.shape[1]
    with torch.inference_mode():
        out = ref(PROMPT, use_cache=True)
    ours, cache = engine.prefill(PROMPT)
    assert float((ours - out.logits[:, -1]).abs().max()) <= 1e-4
    for i, layer in enumerate(out.past_key_values.layers):
        n = layer.keys.shape[2]  # transformers keeps W - 1 positions of a windowed layer, all P of a global one
        assert n == (P if engine.spec.windows[i] is None else engine.spec.windows[i] - 1)
        k, v = cache.k(i), cache.v(i)  # [1, H_kv, held, d_head]: the positions the pool still holds, up to P - 1
        assert k.shape[2] >= n  # a windowed layer holds at least its window (whole blocks of it)
        assert float((k[:, :, -n:] - layer.keys).abs().max()) <= 1e-4
        assert float((v[:, :, -n:] - layer.values).abs().max()) <= 1e-4


def test_gemma3_greedy_continuation_matches_transformers(gemma3):
    ref, engine = gemma3
    P = PROMPT.shape[1]
    logits, cache = engine.prefill(PROMPT, engine.new_cache(P + 8))
    seq = PROMPT
    for _ in range(8):
        with torch.inference_mode():
            ref_logits = ref(seq).logits[:, -1]  # the whole sequence again: no cache on the reference side
        assert float((logits - ref_logits).abs().max()) <= 1e-4
        token = logits.argmax(-1)  # [1]
        assert int(token) == int(ref_logits.argmax(-1))
        seq = torch.cat([seq, token[:, None]], dim=1)
        logits = engine.decode_step(token, cache)


@pytest.mark.parametrize("chunk", [3, 4, 7, 11])
def test_gemma3_chunked_prefill_straddling_the_window_equals_one_pass(gemma3, chunk):
    _, engine = gemma3
    one, full = engine.prefill(PROMPT)
    chunked, cache = engine.prefill(PROMPT, chunk_size=chunk)
    assert float((one - chunked).abs().max()) <= 1e-4
    for i in range(engine.spec.L):
        assert float((full.k(i) - cache.k(i)).abs().max()) <= 1e-4


def test_gemma3_parallel_equals_sequential(gemma3):
    _, engine = gemma3
    ids = PROMPT[0, :20].tolist()
    par, _ = engine.prefill(ids)
    cache = engine.new_cache(len(ids))
    for t in ids:
        seq = engine.decode_step(torch.tensor([t]), cache)
    assert float((par - seq).abs().max()) <= 1e-4


def test_gemma3_multimodal_checkpoint_names(tmp_path):
    """A Gemma 3 4B-style folder: config.json with text_config, weights under model.language_model."""
    import json

    from safetensors.torch import save_file

    ref = random_gemma3(gemma3_config(6))
    sd = {k.replace("model.", "model.language_model.", 1): v.contiguous() for k, v in ref.state_dict().items()}
    sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    sd["model.vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(4, 3, 2, 2)
    save_file(sd, str(tmp_path / "model.safetensors"))
    text = json.loads(ref.config.to_json_string())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text}))
    engine = Engine.load(str(tmp_path), progress=False)
    with torch.inference_mode():
        expected = ref(PROMPT).logits[:, -1]
    assert float((engine.prefill(PROMPT)[0] - expected).abs().max()) <= 1e-4


def test_tiny_gemma3_gguf_runs_like_transformers(tmp_path):
    """A 6-layer Gemma 3 written as llama.cpp writes it (norms stored as 1 + w, no pattern key: every sixth
    layer global, local rotary base 10,000), with a SentencePiece vocabulary and no chat template."""
    from tiny_models import spm_vocab, write_gguf_from_hf

    vocab = len(spm_vocab("gemma")[0])
    config = gemma3_config(
        7, vocab_size=vocab, num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=24, rope_parameters=None
    )
    ref = random_gemma3(config)
    path = write_gguf_from_hf(tmp_path / "tiny-gemma3.gguf", ref, "gemma3", "gemma")
    engine = Engine.load(str(path), progress=False)
    assert engine.spec.windows == (7, 7, 7, 7, 7, None)
    assert engine.tokenizer is not None and engine.tokenizer.chat_template is None
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. Café 你好 🙂", add_special_tokens=True)
    assert len(ids) > 7 and ids[0] == 2
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[:, -1]
    assert float((engine.prefill(ids)[0] - expected).abs().max()) <= 1e-4


def test_cli_runs_a_gguf_without_chat_template_raw_and_refuses_chat(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from tiny_models import spm_vocab, write_gguf_from_hf

    vocab = len(spm_vocab("gemma")[0])
    ref = random_gemma3(gemma3_config(4, vocab_size=vocab, num_hidden_layers=6, layer_types=None, rope_parameters=None))
    path = write_gguf_from_hf(tmp_path / "tiny.gguf", ref, "gemma3", "gemma")
    prefill = Path(sys.executable).parent / "prefill"
    run = [str(prefill), "run", "The quick brown fox", "-m", str(path), "-n", "3"]
    ok = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "no chat template, so the prompt runs raw" in ok.stdout
    refused = subprocess.run([*run, "--chat"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "has no chat template" in refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in refused.stderr  # after the notes on the dtype and weights


def test_gemma3_batched_decode_of_rows_longer_than_the_window_equals_transformers(gemma3):
    """Rows of different lengths decoded in one forward (padded and masked to each row's window)."""
    ref, engine = gemma3
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (9, 14, 17, 30)]
    pool = engine.new_pool(4 * 48)
    seqs = [pool.new_seq() for _ in prompts]
    logits = torch.cat([engine.prefill(p, s)[0] for p, s in zip(prompts, seqs, strict=True)])  # [4, vocab]
    ours: list[list[int]] = [[] for _ in prompts]
    for _ in range(6):
        nxt = logits.argmax(-1)  # [4]
        for row, t in zip(ours, nxt.tolist(), strict=True):
            row.append(t)
        logits = engine.decode_step(nxt, seqs)
    with torch.inference_mode():
        for p, row in zip(prompts, ours, strict=True):
            out = ref.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, min_new_tokens=6)
            assert out[0, len(p) :].tolist() == row


def test_gemma3_proofs_hold_with_windows(gemma3):
    """prefill verify's checks on a windowed model: KV bytes held == the window-aware formula for every K/V
    dtype a pool is built in, parity with transformers (every layer's window of K/V, greedy continuation)."""
    from prefill.costmodel import costs
    from prefill.costmodel.costs import KV_DTYPES
    from prefill.engine.proofs import kv_bytes_match_formula, parity_with_reference

    ref, engine = gemma3
    for kv in (kv for kv in KV_DTYPES if kv != "q8_0"):  # d_head 24: no whole q8_0 block
        check = kv_bytes_match_formula(engine, 40, kv)
        assert check.ok and kv in check.name, check.detail
    W = engine.spec.windows[0]
    per_position = 2 * engine.spec.H_kv * engine.spec.d_head * 4  # K and V, float32
    assert costs.kv_cache_bytes_for(engine.spec, 40, 4) == per_position * (3 * W + 40) < per_position * 4 * 40
    for c in parity_with_reference(engine, ref, PROMPT[0].tolist()):
        assert c.ok, (c.name, c.measured)


def test_gemma3_attention_probe_follows_the_window(gemma3):
    """The lesson's probe on a windowed model: its K is the cache's, A @ V is the model's attention output, and
    a windowed layer's weights are zero outside the window."""
    from prefill.lesson.probe import attention_weights, layer_qkv
    from prefill.model.attention import causal_attention

    _, engine = gemma3
    ids = PROMPT[0, :30].tolist()
    _, cache = engine.prefill(ids)
    W = engine.spec.windows[2]
    for layer in (1, 2):  # global, windowed
        t = layer_qkv(engine.model, ids, layer)
        held = cache.k(layer)  # [1, H_kv, held, d_head]: a windowed layer's pool keeps only its window's blocks
        torch.testing.assert_close(t.k[:, :, -held.shape[2] :], held, rtol=1e-5, atol=1e-5)
        A = attention_weights(engine.model, ids, layer, 3)  # [P, P]
        block = engine.model.layers[layer]
        o = causal_attention(t.q, t.k, t.v, 0, block.window, block.scale)[0, 3]  # [P, d_head]
        torch.testing.assert_close(A @ t.v[0, 1], o, rtol=1e-4, atol=1e-4)
        assert bool(torch.all(A.tril(-W) == 0)) == (layer == 2)  # only the windowed layer forgets the old
