"""A harness nobody here wrote: EleutherAI's lm-eval scores through our server, offline.

`local-completions` (with `tokenizer_backend=remote`: it counts tokens with the server's /tokenize) runs a
five-question multiple-choice task from tests/data/lm_eval; its per-choice log-likelihoods must equal the ones
transformers computes directly on the same texts. `local-chat-completions` runs a three-question generate_until task.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = pytest.mark.slow
lm_eval = pytest.importorskip("lm_eval")

TASKS = Path(__file__).parents[1] / "data" / "lm_eval"


@pytest.fixture(scope="module")
def server(smollm):
    cfg = ServeConfig(model_id_of(smollm), chunk_size=64)
    with BackgroundServer(create_app(smollm, cfg)) as url:
        yield url, cfg.model_id


def evaluate(monkeypatch, model: str, model_args: dict, task: str, **kw) -> dict:
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(TASKS)  # the YAML names its JSONL relative to here
    tasks = TaskManager(include_path=str(TASKS), include_defaults=False)  # lm-eval's own 10,000 YAMLs: 30 s
    args = {**model_args, "num_concurrent": 1, "max_retries": 1}
    return lm_eval.simple_evaluate(
        model=model, model_args=args, tasks=[task], task_manager=tasks, log_samples=True, **kw
    )


def transformers_loglikelihood(reference, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context) with lm-eval's split (trailing spaces of the context move to the continuation),
    computed by transformers from the same GGUF: log_softmax of its logits at the continuation's positions."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    ctx = tokenizer(context, add_special_tokens=False).input_ids
    with torch.inference_mode():
        logits = reference(torch.tensor([whole])).logits[0].float()  # [P, vocab]
    lp = torch.log_softmax(logits[len(ctx) - 1 : -1], dim=-1)  # rows predicting the continuation's tokens
    return float(lp.gather(1, torch.tensor(whole[len(ctx) :])[:, None]).sum())


def test_multiple_choice_loglikelihoods_equal_transformers(
    server, smollm_reference, smollm_reference_tokenizer, monkeypatch
):
    url, model = server
    args = {"base_url": f"{url}/v1/completions", "model": model, "tokenizer_backend": "remote"}
    out = evaluate(monkeypatch, "local-completions", args, "prefill_capitals")
    samples = out["samples"]["prefill_capitals"]
    assert len(samples) == 5
    tokenizer = smollm_reference_tokenizer
    worst = 0.0
    for sample in samples:
        assert len(sample["arguments"]) == 4 == len(sample["filtered_resps"])
        for (context, continuation), (loglikelihood, _greedy) in zip(
            sample["arguments"], sample["filtered_resps"], strict=True
        ):
            expected = transformers_loglikelihood(smollm_reference, tokenizer, context, continuation)
            worst = max(worst, abs(loglikelihood - expected))
            assert loglikelihood < 0
    assert worst <= 1e-3
    assert 0.0 <= out["results"]["prefill_capitals"]["acc,none"] <= 1.0


def test_generate_until_through_chat_completions(server, smollm, monkeypatch):
    url, model = server
    args = {"base_url": f"{url}/v1/chat/completions", "model": model}
    out = evaluate(monkeypatch, "local-chat-completions", args, "prefill_arithmetic", apply_chat_template=True)
    samples = out["samples"]["prefill_arithmetic"]
    assert len(samples) == 3
    for sample in samples:
        question = sample["doc"]["question"]
        # Greedy, so the harness sees the engine's own answer to the same chat prompt, cut at the first newline.
        ours = smollm.complete(f"What is {question}? Answer with the number only.", max_new_tokens=12, stop=["\n"])
        assert sample["resps"][0][0] == ours.text and ours.text
    assert "exact_match,last_number" in out["results"]["prefill_arithmetic"]
