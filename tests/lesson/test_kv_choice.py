"""The page's step-through and KV-store controls, at the API: the attention rows of the decode steps (the answer's
tokens after the prompt), and compute or load at one prefix and one storage speed."""

from __future__ import annotations

import httpx
import pytest


def test_decode_rows_follow_the_prompt_rows(url, smollm):
    body = {"text": "AI is fast", "layer": 3, "head": 5}
    alone = httpx.post(f"{url}/api/attention", json=body, timeout=60).json()
    more = httpx.post(f"{url}/api/attention", json=body | {"answer": " and cheap", "answer_tokens": 2}, timeout=60)
    assert more.status_code == 200, more.text
    a = more.json()
    fed = smollm.tokenizer.encode(" and cheap")[:2]
    assert (a["P"], a["prompt_P"], a["prefill_rows"]) == (5, 3, 3)
    assert a["labels"][3:] == [smollm.tokenizer.decode([i]) for i in fed]
    for i in range(3):  # causal: the prompt's rows are the same whatever follows them
        assert a["weights"][i][:3] == pytest.approx(alone["weights"][i], abs=1e-5)
    assert all(abs(sum(row) - 1) < 1e-5 for row in a["weights"]) and a["upper_max"] == 0
    assert httpx.post(f"{url}/api/attention", json=body | {"answer_tokens": 65}).status_code == 400


def test_compute_or_load_at_one_prefix_and_speed(url, smollm):
    r = httpx.get(f"{url}/api/compute-or-load/at", params={"P": 2010, "rate": 1.25e8}, timeout=120)
    assert r.status_code == 200, r.text
    a = r.json()
    assert (a["asked"], a["n_tokens"], a["rate"]) == (2010, 2000, 1.25e8)  # whole blocks of 16
    assert a["predicted_load_s"] == pytest.approx(a["load_bytes"] / 1.25e8)
    assert a["choice"] == ("load" if a["predicted_load_s"] < a["predicted_compute_s"] else "compute")
    assert "2,000 tokens stored in 125 block files" in a["words"] and "2,010 tokens keep 2,000" in a["words"]
    names = [s["name"] for s in a["storage"]]
    assert names[:2] == ["NVMe SSD", "SATA SSD"] and "page cache here (measured)" in names
    slow = httpx.get(f"{url}/api/compute-or-load/at", params={"P": 2048, "rate": 1e6}, timeout=60).json()
    assert slow["choice"] == "compute" and slow["load_bytes"] / 1e6 == pytest.approx(slow["predicted_load_s"])
    for bad in ({"P": 0}, {"rate": 0}, {"P": smollm.spec.context_length + 1}):
        assert httpx.get(f"{url}/api/compute-or-load/at", params=bad).status_code == 400
