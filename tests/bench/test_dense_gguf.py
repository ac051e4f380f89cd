"""The F32 and BF16 GGUFs written for the like-for-like llama.cpp peer hold exactly the source's weights."""

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from prefill.bench.dense_gguf import dense_gguf, dense_gguf_name
    from prefill.loading.resolve import default_model_path

    out = tmp_path_factory.mktemp("dense")
    src = default_model_path()
    return src, {dt: dense_gguf(src, dt, out / dense_gguf_name(src, dt)) for dt in ("float32", "bfloat16")}


@pytest.fixture(scope="module")
def readers(files):
    """The source's and each dense file's metadata and tensor table, parsed once for the module."""
    from prefill.costmodel.gguf_file import open_gguf

    src, dense = files
    return open_gguf(src), {dt: open_gguf(path) for dt, path in dense.items()}


def test_f32_gguf_gives_the_same_logits_as_the_original(files, smollm):
    from prefill.engine.llm import Engine

    src, dense = files
    a = smollm  # the embedded GGUF decoded to float32
    b = Engine.load(str(dense["float32"]), dtype="float32", progress=False)
    assert b.spec == a.spec
    for name, w in a.model.state_dict().items():
        assert torch.equal(w, b.model.state_dict()[name]), name
    ids = a.encode_prompt("What is the capital of France?")
    assert b.encode_prompt("What is the capital of France?") == ids  # same tokenizer and chat template
    la, _ = a.prefill(ids)
    lb, _ = b.prefill(ids)
    assert (la - lb).abs().max().item() <= 1e-5


def test_metadata_copied_and_types_changed(readers):
    r0, dense = readers
    for dt, ftype, matrix_type in (("float32", 0, "F32"), ("bfloat16", 32, "BF16")):
        r = dense[dt]
        assert r.fields["general.file_type"].contents() == ftype
        keys = set(r0.fields) - {"general.alignment"}
        assert keys <= set(r.fields)
        for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template", "llama.rope.freq_base"):
            assert r.fields[k].contents() == r0.fields[k].contents(), k
        assert [t.name for t in r.tensors] == [t.name for t in r0.tensors]
        types = {t.name: t.tensor_type.name for t in r.tensors}
        assert types["blk.0.ffn_up.weight"] == matrix_type and types["blk.0.attn_norm.weight"] == "F32"


def test_bf16_gguf_holds_the_rounded_weights(readers):
    from gguf.quants import dequantize

    r0, dense = readers
    t0 = {t.name: t for t in r0.tensors}
    for t in dense["bfloat16"].tensors[:12]:
        want = torch.from_numpy(np.array(dequantize(t0[t.name].data, t0[t.name].tensor_type), dtype=np.float32))
        got = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
        assert torch.equal(got.reshape(want.shape), want.to(torch.bfloat16).float()), t.name
