"""Tiny model files for the tests, made offline: a SentencePiece vocabulary trained on a few sentences, and
GGUF files written with gguf.GGUFWriter from transformers-made random models (Llama and Gemma 3 layouts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.",
    "Prefill runs every prompt token in one pass, then decode emits one token at a time.",
    "Café au lait, naïve façade, Zürich, São Paulo, crème brûlée: accents everywhere.",
    "你好，世界。日本語のテキストも少し。中文分词测试。",
    "Numbers 0123456789 and 2026-11-30, 3.14159, 1,000,000 tokens.",
    "    indented code\n\tand tabs\n\nnew paragraphs   with   runs of spaces",
]
# Control tokens (type 3), the unknown token (2), one user-defined token (4), then the 256 byte tokens (6).
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<tool>"]
_TYPES = {"<unk>": 2, "<tool>": 4}
NORMAL, CONTROL, BYTE = 1, 3, 6


def spm_vocab(style: str, size: int = 420) -> tuple[list[str], list[float], list[int]]:
    """tokens, scores, token types of a SentencePiece-style BPE vocabulary (pieces start with "▁").

    style "gemma": runs of spaces are pieces written with real spaces, as in Gemma GGUFs; "llama": as "▁"s.
    Scores fall with the id, so merge order == vocabulary order in both styles.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.normalizer = normalizers.Replace(" ", "▁")
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    t.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(vocab_size=size, show_progress=False))
    learned = sorted(t.get_vocab(), key=t.get_vocab().get)
    runs = ["▁▁", "▁▁▁", "▁▁▁▁"] if style == "llama" else ["  ", "   ", "    "]
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + runs + [p for p in learned if p not in runs]
    types = [_TYPES.get(p, CONTROL) for p in SPECIALS] + [BYTE] * 256 + [NORMAL] * (len(tokens) - 263)
    scores = [0.0] * 263 + [-float(i) for i in range(len(tokens) - 263)]
    return tokens, scores, types


def add_spm_tokenizer(writer, style: str, chat_template: str | None = None) -> int:
    """Write the vocabulary of spm_vocab(style) into a GGUFWriter as llama.cpp does; returns its size."""
    tokens, scores, types = spm_vocab(style)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(style == "llama")
    if chat_template:
        writer.add_chat_template(chat_template)
    return len(tokens)


def finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert script does to Q/K rows of Llama models (interleaved-pair rotary order)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf_from_hf(path: Path, model, arch: str, style: str, chat_template: str | None = None) -> Path:
    """A GGUF of a transformers model (Llama or Gemma 3 text), with a SentencePiece vocabulary of `style`,
    written the way llama.cpp's converter writes it (Gemma norms as 1 + w, Llama Q/K rows permuted)."""
    import gguf

    from prefill.costmodel.families import family_of

    c = model.config
    fam = family_of(arch)
    back = {hf: g for g, hf in fam.gguf_layer_names.items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if arch == "gemma3":
        w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
        w.add_sliding_window(c.sliding_window)
    else:
        w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    add_spm_tokenizer(w, style, chat_template)
    for name, t in model.state_dict().items():
        a = t.detach().float().numpy().copy()
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            g = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }[name]
        else:
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            g = f"blk.{i}.{back[rest]}"
        if fam.norm_plus_one and g.endswith("norm.weight"):
            a = a + 1.0
        if fam.gguf_permuted_qk and (".attn_q." in g or ".attn_k." in g):
            a = llama_cpp_permute(a, c.num_attention_heads if ".attn_q." in g else c.num_key_value_heads)
        w.add_tensor(g, a)
    finish(w)
    return path


GEMMA3_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]


def gemma3_config(window: int, softcaps: bool = False, **kw):
    """A tiny Gemma 3 text config: 4 layers (local, global, local, local) with windows of `window` tokens."""
    from transformers import Gemma3TextConfig

    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
    }
    base = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        sliding_window=window,
        layer_types=GEMMA3_TYPES,
        rope_parameters=rope,
        query_pre_attn_scalar=20,
        attn_logit_softcapping=30.0 if softcaps else None,
        final_logit_softcapping=3.0 if softcaps else None,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    )
    return Gemma3TextConfig(**{**base, **kw})


def random_gemma3(config):
    """A transformers Gemma 3 with random weights; norms perturbed so that 1 + w is not 1."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.5)
            elif "embed" in name:
                p.normal_(0.0, 0.2)  # sqrt(d_model) scales these: keep the activations moderate
    return model


def random_gemma3_engine(folder: Path, window: int, context: int):
    """Our engine over a random tiny Gemma 3 saved by transformers in `folder` (windows of `window` tokens)."""
    from prefill.engine.llm import Engine

    random_gemma3(gemma3_config(window, max_position_embeddings=context)).save_pretrained(folder)
    return Engine.load(str(folder), progress=False)
