"""The logprobs wire format (vLLM's and OpenAI's), on hand-made numbers: no model needed."""

import torch

from prefill.engine.request import TokenEvent
from prefill.engine.scores import Scores
from prefill.server.logprobs import (
    FLOOR,
    CompletionLogprobs,
    TokenLogprob,
    chat_content,
    generated_entries,
    prompt_entries,
)

VOCAB = {0: "<s>", 1: "The", 2: " cat", 3: " sat", 4: " dog", 5: "é"}


def decode(i: int) -> str:
    return VOCAB[i]


def test_prompt_entries_leave_the_first_token_unscored():
    scores = Scores(
        ids=[1, 2, 3],
        start=1,
        logprobs=torch.tensor([-1.5, -0.25]),  # [P - 1]
        is_argmax=torch.tensor([False, True]),
        top_ids=torch.tensor([[4, 2], [3, 4]]),  # [P - 1, k]
        top_logprobs=torch.tensor([[-0.5, -1.5], [-0.25, -2.0]]),
        next_logits=torch.zeros(6),
    )
    entries = prompt_entries(scores)
    assert entries[0] == TokenLogprob(1, None)
    assert entries[1] == TokenLogprob(2, -1.5, ((4, -0.5), (2, -1.5)))
    assert entries[2] == TokenLogprob(3, -0.25, ((3, -0.25), (4, -2.0)))


def test_completion_block_as_vllm_writes_it():
    entries = [
        TokenLogprob(1, None),
        TokenLogprob(2, -1.5, ((4, -0.5), (2, -1.5))),
        TokenLogprob(3, -0.25, ((3, -0.25),)),
    ]
    block = CompletionLogprobs(decode, k=2).block(entries)
    assert block["tokens"] == ["The", " cat", " sat"]
    assert block["token_logprobs"] == [None, -1.5, -0.25]
    # The chosen token first, then the k most likely: k + 1 keys when the chosen one is not among them.
    assert block["top_logprobs"] == [None, {" cat": -1.5, " dog": -0.5}, {" sat": -0.25}]
    assert list(block["top_logprobs"][1]) == [" cat", " dog"]
    assert block["text_offset"] == [0, 3, 7]


def test_k_zero_reports_the_chosen_token_only_and_offsets_run_across_chunks():
    fmt = CompletionLogprobs(decode, k=0, offset=10)
    a = fmt.block([TokenLogprob(2, -0.75, ((4, -0.5),))])
    b = fmt.block([TokenLogprob(5, float("-inf"), ())])
    assert a == {"tokens": [" cat"], "token_logprobs": [-0.75], "top_logprobs": [{" cat": -0.75}], "text_offset": [10]}
    assert b["text_offset"] == [14] and b["token_logprobs"] == [FLOOR] and b["top_logprobs"] == [{"é": FLOOR}]


def test_generated_entries_come_from_the_events_that_carry_a_logprob():
    events = [
        TokenEvent(2, " cat", 0.1, logprob=-0.5, top_logprobs=[(2, -0.5), (4, -1.0)]),
        TokenEvent(-1, "held-back text", 0.2),  # a flushed tail: no token, no logprob
        TokenEvent(0, "", 0.3, logprob=-2.0, top_logprobs=[]),
    ]
    assert generated_entries(events) == [TokenLogprob(2, -0.5, ((2, -0.5), (4, -1.0))), TokenLogprob(0, -2.0, ())]


def test_chat_content_has_bytes_and_exactly_k_alternatives():
    entries = [TokenLogprob(5, -0.5, ((5, -0.5), (2, -1.0), (4, -3.0)))]
    content = chat_content(entries, decode, k=2)
    e_acute = {"token": "é", "logprob": -0.5, "bytes": [195, 169]}
    cat = {"token": " cat", "logprob": -1.0, "bytes": [32, 99, 97, 116]}
    assert content == [{**e_acute, "top_logprobs": [e_acute, cat]}]
    assert chat_content(entries, decode, k=0)[0]["top_logprobs"] == []
