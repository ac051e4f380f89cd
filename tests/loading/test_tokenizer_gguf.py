"""SentencePiece GGUF tokenizers (tokenizer model 'llama'), built from the file's own vocabulary with the
`tokenizers` library, equal to transformers' tokenizer for the same file."""

import gguf
import numpy as np
import pytest

from prefill.costmodel.gguf_file import open_gguf
from prefill.errors import ModelFileError
from prefill.loading.tokenizer import tokenizer_from_gguf
from tiny_models import add_spm_tokenizer, finish

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "0123456789 and 2026-11-30, 3.14159",  # digits
    "Café au lait, naïve façade, Zürich, São Paulo",  # accents
    "你好，世界。日本語のテキスト",  # CJK
    "emoji 🙂🚀 and ☃",  # not in the vocabulary: UTF-8 byte fallback
    "  leading spaces",
    "runs    of     spaces\n\n\tand tabs   ",  # whitespace runs
    "<start_of_turn>user\nhi there<end_of_turn>\n<start_of_turn>model\n",  # control tokens
    "a<tool>b",  # a user-defined token
    " ",
]


def tokenizer_gguf(folder, arch: str, style: str, chat_template: str | None = None):
    """A GGUF holding a SentencePiece vocabulary and the few model keys transformers needs to read it."""
    path = folder / f"{arch}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    keys = {
        "context_length": 64,
        "embedding_length": 8,
        "block_count": 1,
        "feed_forward_length": 16,
        "attention.head_count": 2,
        "attention.head_count_kv": 1,
    }
    for key, value in keys.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    n = add_spm_tokenizer(w, style, chat_template)
    w.add_tensor("token_embd.weight", np.zeros((n, 8), dtype=np.float32))
    finish(w)
    return path


@pytest.fixture(scope="module", params=[("gemma3", "gemma"), ("llama", "llama")], ids=lambda p: p[0])
def pair(request, tmp_path_factory):
    """(ours, transformers') tokenizers of one SentencePiece GGUF."""
    from transformers import AutoTokenizer

    arch, style = request.param
    path = tokenizer_gguf(tmp_path_factory.mktemp(arch), arch, style)
    return tokenizer_from_gguf(open_gguf(path)), AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_gguf_matches_transformers(pair, text):
    ours, ref = pair
    assert ours.encode(text) == ref(text, add_special_tokens=False).input_ids
    assert ours.encode(text, add_special_tokens=True) == ref(text).input_ids  # BOS first
    ids = ours.encode(text)
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special=False) == ref.decode(ids, skip_special_tokens=False)


@pytest.mark.slow
def test_sentencepiece_pieces_merge_and_fall_back_to_bytes(pair):
    ours, _ = pair
    pieces = [ours.tok.id_to_token(i) for i in ours.encode("The quick brown fox 🙂")]
    assert "▁quick" in pieces and "▁brown" in pieces  # merged pieces, not letters
    assert pieces[-4:] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]  # U+1F642 as its UTF-8 bytes
    assert ours.encode("<start_of_turn>") == [4] and ours.add_bos_id == 2 and ours.eos_ids == {1}
    assert ours.decode(ours.encode("Zürich 🙂 你好")) == "Zürich 🙂 你好"


def test_gemma_spaces_are_pieces_and_no_prefix_space(tmp_path):
    gemma = tokenizer_from_gguf(open_gguf(tokenizer_gguf(tmp_path, "gemma3", "gemma")))
    llama = tokenizer_from_gguf(open_gguf(tokenizer_gguf(tmp_path, "llama", "llama")))
    assert "▁▁▁▁" in [gemma.tok.id_to_token(i) for i in gemma.encode("fox    jumps")]  # stored as "    "
    assert gemma.tok.id_to_token(gemma.encode("The")[0]) == "The"  # Gemma adds no "▁" in front
    assert llama.tok.id_to_token(llama.encode("The")[0]) == "▁The"


def test_unknown_tokenizer_model_is_a_clear_error(tmp_path):
    path = tmp_path / "t5.gguf"
    w = gguf.GGUFWriter(str(path), "t5")
    w.add_tokenizer_model("t5")
    w.add_token_list(["<pad>", "a"])
    finish(w)
    with pytest.raises(ModelFileError, match="tokenizer model 't5' is not supported"):
        tokenizer_from_gguf(open_gguf(path))
