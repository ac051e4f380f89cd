"""The KV store under a model with sliding-window layers (a random tiny Gemma 3: windows of 32 tokens in layers
0, 2 and 3, full attention in layer 1): a stored block keeps only the windowed layers that still held it; a
repeated prompt of any length loads its stored blocks and gives the logits of a cold prefill within the
rounding tolerance, however long the first request decoded; layers kept by different requests add up."""

from __future__ import annotations

import pytest
import torch

from prefill.costmodel import costs
from prefill.engine.kv_store.format import PEEK_BYTES, parse_header
from prefill.engine.llm import Engine
from prefill.engine.proofs import rounding_tolerance
from prefill.engine.request import Request
from prefill.engine.sampling import SamplingParams

WINDOW, BS = 32, 16
FULL = (1,)  # the full-attention layer of tiny_models.GEMMA3_TYPES


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    from tiny_models import random_gemma3_engine

    return random_gemma3_engine(tmp_path_factory.mktemp("gemma3"), window=WINDOW, context=512)


def restarted(engine: Engine, directory) -> Engine:
    """A fresh engine over the same weights with its own store object on `directory` (always loading)."""
    fresh = Engine(engine.runner, engine.tokenizer, engine.source)
    fresh.attach_kv_store(directory, 64, force="load")
    return fresh


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def stored_layers(engine: Engine, ids: list[int]) -> list[tuple[int, ...]]:
    """The layers each stored block of ids holds, read from the files' headers."""
    store = engine.kv_store.store
    out = []
    for key in store.keys(ids):
        peeked = store.files.peek(key.digest, PEEK_BYTES)
        if peeked is None:
            break
        out.append(parse_header(peeked[0], peeked[1], store.fp, key).layers)
    return out


def reload(engine: Engine, ids: list[int]):
    """Admit ids into a fresh sequence from the store, prefill the rest; (logits [1, vocab], seq, loaded)."""
    seq = engine.new_cache(len(ids))
    req = Request(ids, 1, SamplingParams(), None, lambda ev: None)
    engine.kv_store.admit(req, seq, lambda needs: True, None)
    loaded = seq.length
    logits, seq = engine.prefill(ids[loaded:], seq)
    return logits, seq, loaded


@pytest.mark.slow
@pytest.mark.parametrize("P", [81, 87, 95, 96])  # the last block 1, 7, 15 and 16 tokens long
def test_a_repeated_prompt_loads_its_blocks_after_a_long_decode(gemma, tmp_path, P):
    ids = prompt(P, seed=P)
    with torch.inference_mode():
        cold, cold_seq = gemma.prefill(ids)  # [1, vocab]
        first = restarted(gemma, tmp_path)
        first.complete(ids, max_new_tokens=WINDOW + BS)  # decode gives the prompt's window back before it ends
        first.kv_store.flush()
        warm, seq, loaded = reload(restarted(gemma, tmp_path), ids)
    assert loaded == min(P - 1, P // BS * BS)  # every whole block, less the last token when P is whole blocks
    tol = rounding_tolerance(float(cold.abs().max()), gemma.spec, gemma.dtype)
    assert (warm - cold).abs().max().item() <= tol
    for layer in range(gemma.spec.L):  # loaded positions are the stored bytes, bitwise those computed
        start_s, start_c = P - seq.held_positions(layer), P - cold_seq.held_positions(layer)
        a = max(start_s, start_c)  # the first position both hold
        assert a <= (0 if layer in FULL else max(0, loaded - WINDOW + 1))  # the loaded window is all there
        for warm_t, cold_t in ((seq.k(layer), cold_seq.k(layer)), (seq.v(layer), cold_seq.v(layer))):
            assert torch.equal(
                warm_t[:, :, a - start_s : loaded - start_s], cold_t[:, :, a - start_c : loaded - start_c]
            )


def test_a_block_keeps_the_windowed_layers_that_still_held_it(gemma, tmp_path):
    ids = prompt(200)
    engine = restarted(gemma, tmp_path)
    engine.complete(ids, max_new_tokens=1)
    engine.kv_store.flush()
    layers = stored_layers(engine, ids)
    assert len(layers) == 200 // BS
    first_windowed = costs.kv_window_start(200, WINDOW, BS) // BS  # blocks before it: full attention only
    assert all(held == FULL for held in layers[:first_windowed])
    assert all(held == (0, 1, 2, 3) for held in layers[first_windowed:])
    stored = sum(len(h) for h in layers) * costs.kv_cache_bytes(1, 2, 24, BS, 4)
    assert stored < costs.kv_cache_bytes(4, 2, 24, 200 // BS * BS, 4) / 2  # far below every layer's blocks


def test_layers_kept_by_two_requests_add_up(gemma, tmp_path):
    """A long prompt stored first keeps no windowed layer near the end of its 96-token prefix, so that prefix
    cannot be continued from the store and is computed; its own store merges its windows into the same files,
    and the next time it loads."""
    long, short = prompt(200, seed=1), prompt(200, seed=1)[:96]
    engine = restarted(gemma, tmp_path)
    engine.complete(long, max_new_tokens=1)
    engine.kv_store.flush()
    with torch.inference_mode():
        assert reload(restarted(gemma, tmp_path), short)[2] == 0
        again = restarted(gemma, tmp_path)
        again.complete(short, max_new_tokens=1)
        again.kv_store.flush()
        cold = gemma.prefill(short)[0]
        warm, _, loaded = reload(restarted(gemma, tmp_path), short)
    assert loaded == 95
    layers = stored_layers(again, long)
    assert layers[4] == (0, 1, 2, 3) and layers[-1] == (0, 1, 2, 3)  # the short prompt's window, the long one's
    assert layers[0] == FULL
    assert (warm - cold).abs().max().item() <= rounding_tolerance(float(cold.abs().max()), gemma.spec, gemma.dtype)
