"""A long prefill's real progress (prefill.lesson.progress): the step loop notes each chunk's forward as it runs,
and the lesson reads every chunk, in order, while the request is still prefilling."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from prefill.engine.loop import StepLoop
from prefill.engine.request import Request
from prefill.engine.sampling import SamplingParams
from prefill.lesson.progress import newest, progress_of

CHUNK = 16


def test_a_prompt_longer_than_a_chunk_reports_every_chunk_in_order(smollm):
    ids = smollm.encode_prompt(" ".join(["the river flows past the old mill"] * 8))
    P = len(ids)
    assert P > 3 * CHUNK
    loop = StepLoop(smollm.runner, smollm.new_pool(P + 4), chunk_size=CHUNK)
    req = Request(ids, 2, SamplingParams(), smollm.tokenizer, lambda ev: None)
    loop.add(req)
    assert progress_of(newest([*loop.waiting, *loop.running], P), P, CHUNK)["state"] == "queued"
    seen = []
    while req.seq is None or req.prefilling:
        loop.step()
        now = progress_of(newest([*loop.waiting, *loop.running], P), P, CHUNK)
        seen.append(now["chunks"][-1])  # the chunk that step ran, reported before the next one runs
        assert now["of"] == -(-P // CHUNK)
    want = [(k * CHUNK, min(P, (k + 1) * CHUNK) - 1) for k in range(-(-P // CHUNK))]
    assert [(c["first"], c["last"]) for c in seen] == want
    assert [c["k"] for c in seen] == list(range(1, len(want) + 1))
    times = [c["t_ms"] for c in seen]
    assert all(0 < a < b for a, b in zip(times, times[1:], strict=False))  # each chunk ends after the one before
    last = progress_of(req, P, CHUNK)
    assert last["state"] == "prefilled" and last["words"].startswith(f"chunk {len(want)} of {len(want)} done at ")
    assert f"(tokens {want[-1][0]}-{P - 1})" in last["words"]


def test_nothing_running_is_said_so(url):
    with urllib.request.urlopen(f"{url}/api/progress?P=300") as r:
        body = json.load(r)
    assert (body["state"], body["chunks"], body["words"]) == ("not seen", [], "no request of 300 tokens is running")
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(f"{url}/api/progress?P=-1")
    assert bad.value.code == 400
