"""Every common GGUF type loads: with native weights (the default where blocks can run) a matrix whose type has a
kernel stays blocks, any other quantized matrix is dequantized once at load with one line saying so, and either
way the weights are bitwise the gguf package's own decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from prefill.costmodel.specs import ModelSpec
from prefill.loading.gguf import load_gguf_state_dict
from prefill.model.quant import KERNEL_TYPES, QuantWeight
from quant_blocks import gguf_dequant, random_blocks

QUANTIZED = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
DENSE = {"F32": np.float32, "F16": np.float16}  # BF16 below: numpy has no bfloat16
N, K = 8, 512  # two K-quant blocks a row


def write_one_matrix_per_type(path) -> dict[str, np.ndarray | torch.Tensor]:
    """A GGUF whose layer i's ffn_down is a [N, K] matrix of the i-th type; returns each type's data."""
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(len(QUANTIZED) + len(DENSE) + 1)
    data: dict = {}
    rng = np.random.default_rng(0)
    for i, qtype in enumerate((*QUANTIZED, *DENSE, "BF16")):
        name = f"blk.{i}.ffn_down.weight"
        if qtype in DENSE:
            data[qtype] = (rng.standard_normal((N, K)) * 0.1).astype(DENSE[qtype])
            w.add_tensor(name, data[qtype])
        else:  # raw bytes: quantized blocks, or bfloat16's
            if qtype == "BF16":
                data[qtype] = torch.randn(N, K, generator=torch.Generator().manual_seed(i)).bfloat16()
                raw = data[qtype].view(torch.uint8).numpy()
            else:
                data[qtype] = random_blocks(qtype, N, K, seed=i)
                raw = data[qtype].numpy()
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return data


def test_every_common_type_loads_native_or_dequantized_once(tmp_path, capsys):
    data = write_one_matrix_per_type(tmp_path / "types.gguf")
    spec = ModelSpec("types", "llama", 13, K, 2, 2, K // 2, N, 16, 64, True, 10_000.0, 1e-6)
    sd = load_gguf_state_dict(GGUFReader(tmp_path / "types.gguf"), spec, torch.float32, native=True)
    for i, qtype in enumerate((*QUANTIZED, *DENSE, "BF16")):
        got = sd[f"model.layers.{i}.mlp.down_proj.weight"]
        if qtype in KERNEL_TYPES:
            assert isinstance(got, QuantWeight) and got.qtype == qtype
            got = got.dequantize()
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == (N, K), qtype
        if qtype in QUANTIZED:
            want = gguf_dequant(data[qtype], qtype, N, K)
        else:
            want = torch.as_tensor(np.asarray(data[qtype])).float() if qtype != "BF16" else data[qtype].float()
        assert torch.equal(got, want), qtype
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("weights:")]
    decoded = [t for t in QUANTIZED if t not in KERNEL_TYPES]
    which = ", ".join(f"1 {t}" for t in decoded)
    assert lines == [f"weights: no kernel here for {which} matrices: dequantized to float32 at load"]


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q5_K"])
def test_the_probe_times_given_blocks_of_types_gguf_cannot_make(qtype, capsys):
    # gguf-py quantizes no K-quant: the probe takes a model file's own blocks (given by the loader), repeated to
    # the shape it times, or else zero blocks, said once; it never raises.
    from prefill.machine import probe

    probe._GIVEN.pop(qtype, None)
    probe._SAID.discard(qtype)
    zeros = probe._random_blocks(4, 512, qtype)
    assert not zeros.any() and "timing zero blocks" in capsys.readouterr().err
    given = random_blocks(qtype, 2, 256, seed=3)
    probe.give_blocks(qtype, given.numpy())
    tiled = probe._random_blocks(4, 512, qtype)  # 8 blocks from the 2 given, in turn
    assert torch.equal(tiled.reshape(8, -1), given.reshape(2, -1).repeat(4, 1))
    probe._GIVEN.pop(qtype, None)


def test_the_probe_asks_gguf_once_for_a_type_it_cannot_make(monkeypatch):
    # gguf-py draws the weights before it refuses a K-quant: asked for every copy of every shape, that was 9 s of
    # a Q4_K_M file's probe
    from prefill.machine import probe

    asked = []

    def cannot(N, K, qtype):
        asked.append(qtype)
        raise NotImplementedError(qtype)

    monkeypatch.setattr(probe, "_quantized", cannot)
    monkeypatch.setattr(probe, "_UNMADE", set())
    for _ in range(3):
        probe._random_blocks(4, 512, "Q6_K")
    assert asked == ["Q6_K"]
