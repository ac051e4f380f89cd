"""The engine on the real embedded model (SmolLM2-135M-Instruct, float32): answers, proofs, cache, timings."""

import pytest
import torch

from prefill.costmodel import costs
from prefill.engine import proofs as verify
from prefill.engine.sampling import SamplingParams
from prefill.errors import BadInput

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


def test_answers_paris(smollm):
    gen = smollm.complete(QUESTION, max_new_tokens=20)
    assert gen.text == "The capital of France is Paris."
    assert gen.finish_reason == "stop"  # ended on <|im_end|>
    assert gen.P == 37


def test_chat_prompt_tokens_match_the_reference_tokenizer(smollm):
    # ids of transformers' apply_chat_template on the same GGUF (checked once by hand, fixed here)
    ids = smollm.encode_prompt(QUESTION)
    assert ids[:20] == [
        1,
        9690,
        198,
        2683,
        359,
        253,
        5356,
        5646,
        11173,
        3365,
        3511,
        308,
        34519,
        28,
        7018,
        411,
        407,
        19712,
        8182,
        2,
    ]
    assert len(ids) == 37


def test_parallel_prefill_equals_sequential(smollm):
    ids = smollm.encode_prompt(QUESTION)
    checks = verify.parallel_vs_sequential(smollm, ids)
    assert all(c.ok for c in checks), checks
    assert all(c.measured > 0 or c.measured == 0 for c in checks)


def test_chunked_prefill_equals_one_pass(smollm):
    ids = smollm.encode_prompt("Explain in one paragraph why the sky is blue, for a child of ten.")
    for chunk in (1, 5, 16):
        checks = verify.chunked_vs_single(smollm, ids, chunk)
        assert all(c.ok for c in checks), checks


def test_kv_cache_layout_and_bytes(smollm):
    ids = smollm.encode_prompt(QUESTION)
    logits, cache = smollm.prefill(ids)
    s = smollm.spec
    assert logits.shape == (1, s.vocab_size)
    assert len(cache.pool.k) == s.L == 30
    assert cache.k(0).shape == cache.v(29).shape == (1, s.H_kv, len(ids), s.d_head) == (1, 3, 37, 64)
    assert cache.shape() == (1, 3, 37, 64)
    assert cache.nbytes() == costs.kv_cache_bytes(30, 3, 64, 37, 4) == 1_704_960
    assert cache.reserved_bytes() == 3 * 16 * costs.kv_cache_bytes(30, 3, 64, 1, 4)  # 3 blocks of 16 tokens


def test_decode_appends_one_position(smollm):
    ids = smollm.encode_prompt(QUESTION)
    logits, cache = smollm.prefill(ids, smollm.new_cache(len(ids) + 2))
    assert cache.length == len(ids)
    smollm.decode_step(logits.argmax(-1), cache)
    assert cache.length == len(ids) + 1
    assert cache.nbytes() == costs.kv_cache_bytes(30, 3, 64, len(ids) + 1, 4)


def test_prefix_cache_reuse_matches_cold_prefill(smollm):
    ids = smollm.encode_prompt(QUESTION)
    cold, _ = smollm.prefill(ids)
    _, prefix = smollm.prefill(ids[:20], smollm.new_cache(len(ids)))
    warm, _ = smollm.prefill(ids[20:], prefix)
    assert float((cold - warm).abs().max()) <= 1e-4


def test_batched_decode_equals_each_alone(smollm_native):
    """8 prompts of 5..300 tokens decoded in one batch: the greedy tokens of each equal its own decode. On the
    native blocks (half the time of dense float32 here); tests/engine/test_cache_hit_greedy.py holds batched ==
    alone on every path auto can take."""
    smollm = smollm_native
    tok = smollm.tokenizer
    words = ["the", "river", "runs", "past", "the", "old", "mill", "and", "under", "the", "stone", "bridge"]
    prompts = [tok.encode(" ".join(words[i % len(words)] for i in range(n))) for n in (5, 12, 30, 61, 97, 150, 220)]
    prompts.append(tok.encode(" ".join(["history"] * 300))[:300])
    assert min(map(len, prompts)) >= 5 and max(map(len, prompts)) == 300
    checks = verify.batched_vs_alone(smollm, prompts, new_tokens=6)  # rows read their own blocks
    similar = [tok.encode(" ".join(words[i % len(words)] for i in range(n))) for n in (40, 44, 50, 57)]
    checks += verify.batched_vs_alone(smollm, similar, new_tokens=6)  # rows padded to one length, masked
    assert all(c.ok for c in checks), checks


def test_seeded_sampling_in_a_batch_equals_alone(smollm):
    """Per-row sampling: each request's seeded generator gives the same tokens whether it runs alone or in a
    batch with others (the step loop of the server)."""
    from prefill.engine.loop import StepLoop
    from prefill.engine.request import Generation, Request

    prompts = ["Tell me a story.", "Name three colours.", "What is two plus two?"]
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=s) for s in (1, 2, 3)]
    alone = [smollm.complete(p, max_new_tokens=6, sampling=sp).token_ids for p, sp in zip(prompts, params, strict=True)]
    done: dict[int, Generation] = {}
    loop = StepLoop(smollm.runner, smollm.new_pool(3 * 64), chunk_size=None)

    def keep(i: int):
        return lambda ev: done.__setitem__(i, ev) if isinstance(ev, Generation) else None

    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        loop.add(Request(smollm.encode_prompt(p), 6, sp, smollm.tokenizer, keep(i)))
    for _ in range(200):
        if not loop.busy:
            break
        loop.step()
    assert [done[i].token_ids for i in range(3)] == alone
    assert loop.pool.used_blocks == 0  # every block went back


def test_stop_string_and_max_new_tokens(smollm):
    gen = smollm.complete(QUESTION, max_new_tokens=20, stop=["France"])
    assert gen.text == "The capital of "
    assert gen.finish_reason == "stop"
    gen = smollm.complete(QUESTION, max_new_tokens=3)
    assert len(gen.token_ids) == 3 and gen.finish_reason == "length"
    assert len(gen.itl_s) == 2


def test_streamed_pieces_concatenate_to_the_text(smollm):
    events = list(smollm.generate("Name three colours.", max_new_tokens=12))
    gen = events[-1]
    assert "".join(e.text for e in events[:-1]) == gen.text
    assert gen.ttft_s >= gen.prefill_s > 0
    assert gen.total_s >= gen.ttft_s


def test_seeded_sampling_is_reproducible(smollm):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    a = smollm.complete("Tell me a story.", max_new_tokens=8, sampling=params)
    b = smollm.complete("Tell me a story.", max_new_tokens=8, sampling=params)
    assert a.token_ids == b.token_ids


def test_bfloat16_agrees_with_float32_within_bf16_error(smollm):
    from prefill.engine.llm import Engine

    bf16 = Engine.load(None, dtype="bfloat16", progress=False)
    ids = smollm.encode_prompt(QUESTION)
    ref, _ = smollm.prefill(ids)
    out, cache = bf16.prefill(ids)
    assert cache.k(0).dtype == torch.bfloat16
    assert cache.nbytes() == costs.kv_cache_bytes(30, 3, 64, len(ids), 2)
    # bf16 keeps ~3 significant digits; the logits spread over ~30 units
    assert float((out - ref).abs().max()) < 1.0
    # The first step is a near-tie ("The" vs "Paris"-style openings differ by ~0.1 in float32), so bf16 may pick
    # either: both engines must keep the same top two, and float32's winner within bf16 rounding of the top.
    assert set(out.topk(2).indices[0].tolist()) == set(ref.topk(2).indices[0].tolist())
    assert float(out.max() - out[0, int(ref.argmax())]) <= 0.25


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"prompt": ""}, "empty"),
        ({"prompt": "   "}, "empty"),
        ({"prompt": "hi", "max_new_tokens": -1}, "max_new_tokens"),
        ({"prompt": list(range(9000))}, "context length"),
    ],
)
def test_bad_requests_are_refused(smollm, kwargs, match):
    with pytest.raises(BadInput, match=match):
        smollm.complete(**kwargs)


def test_a_prefill_is_cold_the_first_time_its_thread_runs_that_many_tokens(smollm):
    """The first forward of a token count on a thread builds its kernels and touches its pools first: the
    request's timings say so, so that time is never taken for a warm one. A new thread has run nothing."""
    import threading

    ids = list(range(200, 229))  # 29 tokens
    seen: list[bool] = []

    def twice() -> None:
        for _ in range(2):
            seen.append(smollm.complete(ids, max_new_tokens=2).timings()["cold"])

    t = threading.Thread(target=twice)
    t.start()
    t.join()
    assert seen == [True, False]
