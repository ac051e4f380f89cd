"""The KV store wired below the prefix cache, on the real model (slow): stored blocks loaded at admission give
the same greedy tokens and logits within the proofs' tolerance; a restart finds them; a corrupt block is a miss
with a warning; a directory that cannot be written is no store. And the torch-free decision."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch

from prefill.costmodel.kv_store import (
    BOTH_MARGIN,
    break_even_rate,
    choice_flips,
    compute_or_load,
    load_seconds,
    split_ends,
)
from prefill.engine.kv_store.files import BlockFiles
from prefill.engine.llm import Engine
from prefill.engine.proofs import rounding_tolerance
from prefill.engine.request import Request
from prefill.engine.sampling import SamplingParams
from prefill.errors import BadInput

PROMPT = "The history of Paris, told in short plain sentences for a school essay. " * 8
N_NEW = 8


# ---- the decision (torch-free) ------------------------------------------------------------------------------


def test_compute_or_load_picks_the_faster_and_says_by_how_much():
    calls = []

    def prefill_s(n: int, past: int) -> float:
        calls.append((n, past))
        return 1e-3 * n  # 1 ms a token

    d = compute_or_load(256, 32, 50_000_000, 1e9, prefill_s)  # 0.05 s to load, 0.256 s to compute
    assert (d.choice, d.load_s, d.compute_s) == ("load", 0.05, 0.256) and calls == [(256, 32)]
    assert d.saved_s == pytest.approx(0.206)
    slow = compute_or_load(16, 0, 50_000_000, 1e9, prefill_s)  # 0.05 s to load, 0.016 s to compute
    assert (slow.choice, slow.saved_s) == ("compute", 0.0)
    assert compute_or_load(0, 0, 0, 1e9, prefill_s).choice == "compute"
    assert compute_or_load(10, 0, 10_000, 1e6, lambda n, p: 0.01).choice == "compute"  # a tie computes
    assert load_seconds(3_000, 1_500.0) == 2.0
    with pytest.raises(BadInput):
        load_seconds(1, 0.0)


def test_both_ends_meet_where_computing_the_head_takes_as_long_as_loading_the_tail():
    calls = []

    def prefill_s(n: int, past: int) -> float:
        calls.append(n)
        return 0.25e-3 * n  # 4 ms a block of 16 tokens

    blocks = [16_000] * 64  # 1,024 tokens in 64 blocks: 2 ms a block at 8 MB/s (128 ms all), 256 ms computed
    split, both_s = split_ends(1024, 0, blocks, 8e6, prefill_s)
    # j blocks computed take 4j ms while the other 64 - j load in 2 (64 - j) ms: j = 21 (84 / 86 ms) beats 22 (88 / 84)
    assert (split, both_s) == (21 * 16, pytest.approx(0.086))
    assert len(calls) <= 2 * 6 + 4  # bisection over 63 splits, not a scan
    d = compute_or_load(1024, 0, sum(blocks), 8e6, prefill_s, blocks)
    assert (d.choice, d.split, d.seconds, d.load_s, d.compute_s) == ("both", 336, both_s, 0.128, 0.256)
    assert d.saved_s == pytest.approx(0.17)
    # loading alone (0.64 ms) beats computing one block (4 ms), so both cannot win: not even bisected
    calls.clear()
    fast = compute_or_load(1024, 0, sum(blocks), 1.6e9, prefill_s, blocks)
    assert (fast.choice, fast.both_s, calls) == ("load", None, [1024, 16])
    # computing all (0.256 s) beats loading the last block alone (1 s at 16 kB/s): both cannot win either
    slow = compute_or_load(1024, 0, sum(blocks), 16e3, prefill_s, blocks)
    assert (slow.choice, slow.both_s) == ("compute", None)
    assert split_ends(1024, 0, blocks, 16e3, prefill_s) == (63 * 16, pytest.approx(1.0))  # all but one computed
    # the tail's CPU work (its bytes at 32 MB/s, 31 ms for blocks 21..63) slows the head: the split moves back
    split, cpu_s = split_ends(1024, 0, blocks, 8e6, prefill_s, cpu_bytes_per_s=32e6)
    assert split < 21 * 16 and cpu_s > both_s
    # at 32 MB/s loading alone takes 32 ms, both 28.5 ms (7 blocks computed): 0.89 of it, short of BOTH_MARGIN
    near = compute_or_load(1024, 0, sum(blocks), 32e6, prefill_s, blocks)
    assert near.split == 7 * 16 and near.both_s == pytest.approx(0.0285)
    assert near.both_s > BOTH_MARGIN * near.load_s and near.choice == "load"
    assert compute_or_load(1024, 0, sum(blocks), 8e6, prefill_s).both_s is None  # not asked: not considered
    with pytest.raises(BadInput):
        split_ends(16, 0, [16_000], 8e6, prefill_s)


def test_choice_flips_finds_each_change_to_the_block():
    calls = []

    def loads(P: int) -> bool:  # load below 200 tokens and from 1,000 on, compute between
        calls.append(P)
        return P < 200 or P >= 1000

    grid = [16, 64, 256, 1024, 4096]
    assert choice_flips(grid, loads, 16) == [208, 1008]  # the first whole block on the new side of each change
    assert choice_flips(grid, lambda P: True, 16) == [] and choice_flips([16], loads, 16) == []
    assert len(calls) < 2 * len(grid) + 20  # bisection, not a scan of every block
    for bad in ([16, 24], [64, 16], [0, 16]):
        with pytest.raises(BadInput):
            choice_flips(bad, loads, 16)


def test_break_even_rate_is_the_slowest_read_that_wins_everywhere():
    sizes, compute = [1_000_000, 4_000_000, 16_000_000], [0.1, 0.2, 1.0]  # 10, 20, 16 MB/s to break even
    rate, at = break_even_rate(sizes, compute)
    assert rate == 20e6 and at == 1

    def choices(r: float) -> list[str]:
        return [compute_or_load(1, 0, n, r, lambda n_, p, s=s: s).choice for n, s in zip(sizes, compute, strict=True)]

    assert choices(rate * 1.01) == ["load"] * 3
    assert choices(rate * 0.99) == ["load", "compute", "load"]  # just below it, computing wins at 4 MB
    with pytest.raises(BadInput):
        break_even_rate([1], [0.0])


def test_the_decision_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, prefill.costmodel.kv_store; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# ---- on the real model -------------------------------------------------------------------------------------


def restarted(smollm_native, directory, force: str | None = "load") -> Engine:
    """A fresh engine over the session's weights with its own store object on `directory`: what a restarted
    process has (nothing of the store in memory, everything from the files)."""
    engine = Engine(smollm_native.runner, smollm_native.tokenizer, smollm_native.source)
    engine.attach_kv_store(directory, 256, force=force)
    return engine


def greedy(engine: Engine):
    gen = engine.complete(PROMPT, chat=False, max_new_tokens=N_NEW)
    if engine.kv_store is not None:
        engine.kv_store.flush()
    return gen


@pytest.fixture(scope="module")
def cold(smollm_native):
    return greedy(smollm_native)


@pytest.mark.slow
def test_a_restart_loads_the_stored_prefix_and_answers_the_same(smollm_native, cold, tmp_path):
    first = greedy(restarted(smollm_native, tmp_path))
    assert first.cached_tokens == 0 and first.token_ids == cold.token_ids
    assert first.kv_store.loaded_tokens == 0
    second = greedy(restarted(smollm_native, tmp_path))
    P, bs = second.P, 16
    assert second.cached_tokens == (P - 1) // bs * bs > 0  # every whole block but the last token's
    assert second.token_ids == cold.token_ids
    use = second.kv_store
    assert use.decision.choice == "load" and use.loaded_tokens == second.cached_tokens and use.bad_blocks == 0
    assert use.loaded_bytes == use.decision.load_bytes and use.loaded_bytes > use.loaded_tokens * 2 * 30 * 3 * 64 * 4
    assert second.timings()["kv_store"]["loaded_tokens"] == second.cached_tokens


@pytest.mark.slow
def test_a_prompt_of_whole_stored_blocks_computes_only_its_last_token(smollm_native, tmp_path):
    ids = smollm_native.encode_prompt(PROMPT, chat=False)
    ids = ids[: len(ids) // 16 * 16]
    cold_ids = smollm_native.complete(ids, max_new_tokens=N_NEW).token_ids
    first = restarted(smollm_native, tmp_path)
    first.complete(ids, max_new_tokens=N_NEW)
    first.kv_store.flush()
    gen = restarted(smollm_native, tmp_path).complete(ids, max_new_tokens=N_NEW)
    assert gen.kv_store.loaded_tokens == gen.cached_tokens == len(ids) - 1  # the last block loaded whole
    assert gen.kv_store.loaded_bytes == gen.kv_store.decision.load_bytes  # every stored block was read
    assert gen.token_ids == cold_ids


@pytest.mark.slow
def test_loaded_kv_gives_logits_within_the_rounding_tolerance(smollm_native, tmp_path):
    greedy(restarted(smollm_native, tmp_path))
    engine = restarted(smollm_native, tmp_path)
    ids = engine.encode_prompt(PROMPT, chat=False)
    ids = ids[: len(ids) // 16 * 16]  # whole blocks, every one stored: the last is loaded, its last token computed
    with torch.inference_mode():
        cold_logits, cold_cache = engine.prefill(ids)  # [1, vocab]
        seq = engine.new_cache(len(ids))
        req = Request(ids, 1, SamplingParams(), None, lambda ev: None)
        engine.kv_store.admit(req, seq, lambda needs: True, None)
        n = seq.length
        assert n == len(ids) - 1 and req.gen.kv_store.loaded_tokens == n
        warm_logits, warm = engine.prefill(ids[n:], seq)  # 1 token after n loaded
    tol = rounding_tolerance(float(cold_logits.abs().max()), engine.spec, engine.dtype)
    assert (warm_logits - cold_logits).abs().max().item() <= tol
    for layer in (0, engine.spec.L - 1):  # the loaded positions are the stored bytes: bitwise those computed
        assert torch.equal(warm.k(layer)[:, :, :n], cold_cache.k(layer)[:, :, :n])
        assert torch.equal(warm.v(layer)[:, :, :n], cold_cache.v(layer)[:, :, :n])


@pytest.mark.slow
def test_both_ends_give_the_same_answer_and_the_stored_bytes(smollm_native, cold, tmp_path):
    """Forced both: the head is computed while the tail loads on the loader thread; greedy tokens as cold, the
    tail's K/V bitwise the stored (computed) bytes, the first token's logits within the rounding tolerance."""
    greedy(restarted(smollm_native, tmp_path))
    gen = greedy(restarted(smollm_native, tmp_path, force="both"))
    use = gen.kv_store
    assert use.decision.choice == "both" and 0 < use.decision.split < use.decision.n_tokens
    assert use.loaded_tokens == use.decision.n_tokens - use.decision.split == gen.cached_tokens
    assert use.pending is None and use.load_s > 0 and use.bad_blocks == 0
    assert gen.token_ids == cold.token_ids
    engine = restarted(smollm_native, tmp_path, force="both")
    ids = engine.encode_prompt(PROMPT, chat=False)
    with torch.inference_mode():
        cold_logits, cold_cache = engine.prefill(ids)
        req = Request(ids, 1, SamplingParams(), None, lambda ev: None)
        seq = engine.new_cache(len(ids))
        engine.kv_store.admit(req, seq, lambda needs: True, None)
        req.start(seq)
        at = req.gen.kv_store.pending.at
        engine.prefill(ids[:at], seq)  # the head, while the tail loads
        end = (len(ids) - 1) // 16 * 16  # the stored whole blocks
        assert engine.kv_store.prefill_target(req, len(ids)) == len(ids) and seq.length == end
        warm_logits, _ = engine.prefill(ids[end:], seq)
    tol = rounding_tolerance(float(cold_logits.abs().max()), engine.spec, engine.dtype)
    assert (warm_logits - cold_logits).abs().max().item() <= tol
    for layer in (0, engine.spec.L - 1):
        assert torch.equal(seq.k(layer)[:, :, at:end], cold_cache.k(layer)[:, :, at:end])
        assert torch.equal(seq.v(layer)[:, :, at:end], cold_cache.v(layer)[:, :, at:end])


@pytest.mark.slow
def test_a_request_cancelled_while_its_tail_loads_gives_every_block_back(smollm_native, tmp_path):
    from prefill.engine.loop import StepLoop

    greedy(restarted(smollm_native, tmp_path))
    engine = restarted(smollm_native, tmp_path, force="both")
    ids = engine.encode_prompt(PROMPT, chat=False)
    pool = engine.new_pool(2 * len(ids))
    loop = StepLoop(engine.runner, pool, kv_tier=engine.kv_store)
    req = Request(ids, N_NEW, SamplingParams(), engine.tokenizer, lambda ev: None)
    loop.add(req)
    step = loop.step()  # admitted: the tail starts loading, the head is computed
    pending = req.gen.kv_store.pending
    assert step.rows == [(req, pending.at)] and pool.used_blocks == (len(ids) - 1) // 16  # the stored blocks, reserved
    req.cancelled = True
    loop.step()
    assert pending.done() and pool.used_blocks == 0 and not loop.busy


@pytest.mark.slow
def test_the_cost_model_decides_and_the_record_says_so(smollm_native, tmp_path):
    greedy(restarted(smollm_native, tmp_path))
    gen = greedy(restarted(smollm_native, tmp_path, force=None))
    d = gen.kv_store.decision
    assert d.n_tokens == (gen.P - 1) // 16 * 16 and d.load_s > 0 and d.compute_s > 0
    assert d.choice == ("load" if d.load_s < d.compute_s else "compute")
    assert gen.cached_tokens == (d.n_tokens if d.choice == "load" else 0)
    assert gen.token_ids == greedy(smollm_native).token_ids


@pytest.mark.slow
def test_a_corrupt_block_is_a_miss_with_a_warning_and_the_same_answer(smollm_native, cold, tmp_path, caplog):
    engine = restarted(smollm_native, tmp_path)
    greedy(engine)
    keys = engine.kv_store.store.keys(engine.encode_prompt(PROMPT, chat=False))
    path = BlockFiles(tmp_path).path(keys[3].digest)
    data = bytearray(Path(path).read_bytes())
    data[-100] ^= 0x01  # one bit of the fourth block's payload
    Path(path).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="prefill.kv_store"):
        gen = greedy(restarted(smollm_native, tmp_path))
    assert gen.cached_tokens == 3 * 16 and gen.kv_store.bad_blocks == 1  # the blocks before it still load
    assert gen.token_ids == cold.token_ids
    assert any("payload checksum mismatch" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_a_directory_that_cannot_be_written_is_no_store(smollm_native, cold, tmp_path, monkeypatch, caplog):
    def read_only(self):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(BlockFiles, "check_writable", read_only)
    engine = Engine(smollm_native.runner, smollm_native.tokenizer, smollm_native.source)
    with caplog.at_level(logging.WARNING, logger="prefill.kv_store"):
        assert engine.attach_kv_store(tmp_path, 256) is None
    assert any("running without a KV store" in r.getMessage() for r in caplog.records)
    gen = greedy(engine)
    assert gen.token_ids == cold.token_ids and gen.kv_store is None


@pytest.mark.slow
def test_a_size_of_zero_is_refused(smollm_native, tmp_path):
    with pytest.raises(BadInput, match="> 0 MiB"):
        Engine(smollm_native.runner, smollm_native.tokenizer).attach_kv_store(tmp_path, 0)


@pytest.mark.slow
def test_scoring_windows_load_their_unscored_context_and_score_the_same(smollm_native, tmp_path):
    from prefill.engine.scoring import perplexity

    ids = smollm_native.encode_prompt(PROMPT * 2, chat=False)  # ~260 tokens: windows of 128 every 64
    plain = perplexity(smollm_native.runner, ids, window=128, stride=64)
    first = restarted(smollm_native, tmp_path)
    perplexity(first.runner, ids, window=128, stride=64, kv_tier=first.kv_store)
    first.kv_store.flush()
    again = restarted(smollm_native, tmp_path)
    warm = perplexity(again.runner, ids, window=128, stride=64, kv_tier=again.kv_store)
    # every window after the first scores its last 64 tokens: its first 63 are context, in 4 blocks (the 4th
    # loaded whole, its last position computed again: its hidden state gives the first score)
    assert again.kv_store.store.stats().hit_blocks == 4 * (len(warm.windows) - 1)
    tol = rounding_tolerance(
        30.0, smollm_native.spec, smollm_native.dtype
    )  # log-probabilities of this model stay below 30
    diffs = [abs(a - b) for a, b in zip(plain.logprobs, warm.logprobs, strict=True) if a is not None]
    assert max(diffs) <= tol and warm.ppl == pytest.approx(plain.ppl, rel=1e-4)


@pytest.mark.slow
def test_the_store_continues_where_the_ram_prefix_cache_match_ends(smollm_native, cold, tmp_path):
    from prefill.engine.loop import StepLoop
    from prefill.engine.prefix_cache import RadixPrefixCache

    greedy(restarted(smollm_native, tmp_path))  # every whole block of the prompt is stored
    engine = restarted(smollm_native, tmp_path)
    ids = engine.encode_prompt(PROMPT, chat=False)
    pool = engine.new_pool(4 * len(ids))
    prefix = RadixPrefixCache(pool, 64 << 20)
    with torch.inference_mode():
        _, seq = engine.prefill(ids[:32], pool.new_seq())  # the RAM cache holds the first two blocks only
    prefix.insert_prefix(ids[:32], seq)
    seq.free()
    loop = StepLoop(engine.runner, pool, prefix, kv_tier=engine.kv_store)
    req = Request(ids, N_NEW, SamplingParams(), engine.tokenizer, lambda ev: None)
    loop.add(req)
    while not req.done:
        loop.step()
    use, gen = req.gen.kv_store, req.gen
    assert use.decision.past == 32 and use.loaded_tokens == (len(ids) - 1) // 16 * 16 - 32  # only beyond RAM's
    assert gen.cached_tokens == 32 + use.loaded_tokens
    assert gen.token_ids == cold.token_ids
    assert pool.used_blocks == prefix.n_blocks  # the request gave its blocks back; the tree keeps its own


def test_copy_into_a_fragmented_sequence_puts_each_block_where_its_positions_are():
    """Blocks loaded into a sequence whose pool blocks are not consecutive (another sequence took every other
    one) read back bitwise through copy_out: each run of consecutive blocks gets its own copies."""
    from prefill.costmodel.specs import ModelSpec
    from prefill.engine.kv_copy import copy_into, copy_out
    from prefill.engine.kvcache import KVPool

    spec = ModelSpec.from_preset("smollm2-135m")
    pool = KVPool.for_tokens(spec, 16 * 16, torch.float32, "cpu")
    ours, other = pool.new_seq(), pool.new_seq()
    for end in range(16, 16 * 6 + 1, 16):  # interleaved: ours gets blocks 0, 2, 4, ... (runs of one block)
        ours.reserve(end)
        other.reserve(end)
    ours.reserve(16 * 8)  # then two consecutive blocks: a run of two
    assert len(ours.runs(0, 0, 16 * 8)) == 7
    g = torch.Generator().manual_seed(0)
    shape = (spec.L, 2, spec.H_kv, 16, spec.d_head)
    blocks = [torch.randn(shape, generator=g) for _ in range(8)]
    copy_into(ours, 0, torch.stack(blocks))
    back = copy_out(ours, 0, 16 * 8)  # [L, 2, H_kv, 8 * 16, d_head]
    assert torch.equal(back, torch.cat(blocks, dim=3))


@pytest.mark.slow
def test_a_store_keeps_the_pools_kv_dtype_and_another_dtypes_blocks_are_a_miss(smollm_native, tmp_path):
    """--kv-dtype bfloat16: blocks are stored as the pool holds them (2 bytes a value) and load back into a
    bfloat16 pool with the cold run's answer; a float32 pool over the same directory finds none of them (the
    dtype is in the fingerprint every key is rooted in); q8_0 K/V cannot keep a store, said in one line."""
    from prefill.errors import BadInput

    try:
        smollm_native.runner.set_kv_dtype("bfloat16")
        cold_bf16 = greedy(smollm_native)
        greedy(restarted(smollm_native, tmp_path))
        second = greedy(restarted(smollm_native, tmp_path))
        use = second.kv_store
        assert use.loaded_tokens == second.cached_tokens > 0 and second.token_ids == cold_bf16.token_ids
        per_token = 2 * 30 * 3 * 64  # K and V values of one position, all layers
        assert use.loaded_tokens * per_token * 2 < use.loaded_bytes < use.loaded_tokens * per_token * 4  # 2 B a value
        smollm_native.runner.set_kv_dtype("float32")
        assert greedy(restarted(smollm_native, tmp_path)).kv_store.loaded_tokens == 0
        smollm_native.runner.set_kv_dtype("q8_0")
        with pytest.raises(BadInput, match="not q8_0: drop --kv-store"):
            restarted(smollm_native, tmp_path)
    finally:
        smollm_native.runner.set_kv_dtype(None)
