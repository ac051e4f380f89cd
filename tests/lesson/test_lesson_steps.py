"""Prefill shown as it runs (issue #45), in Chromium at 1280 px and (what a phone changes) at 390 px: a long prefill's
chunks as the server reports them, the prefill/decode stepper over the real model's attention, and the KV-store
section's own prefix and storage-speed controls. The server, browser and pages are test_lesson_story's (one per module
and width)."""

from __future__ import annotations

import re

import pytest
import test_lesson_story as story
from test_lesson_browser import text, wait_text

from prefill.costmodel import costs

pytestmark = pytest.mark.slow
url = story.url  # the story module's server for this module too; the browser and the pages are conftest's
LONG, TIMEOUT_MS, run_prompt, AT_1280 = story.LONG, story.TIMEOUT_MS, story.run_prompt, story.AT_1280

# Every line the status shows and every value of the grid's computed rows, as they change (not sampled).
RECORD = """() => {
  window.seen = {status: [], computed: []};
  const status = document.getElementById('live-status'), grid = document.getElementById('token-grid');
  new MutationObserver(() => window.seen.status.push(status.textContent))
    .observe(status, {childList: true, characterData: true, subtree: true});
  new MutationObserver(() => window.seen.computed.push(grid.dataset.computed))
    .observe(grid, {attributes: true, attributeFilter: ['data-computed']});
}"""


@AT_1280
def test_a_long_prefill_shows_each_chunk_as_the_server_reports_it(page):
    page.evaluate(RECORD)
    run_prompt(page, LONG, 2, cache=False)
    P = int(text(page, "#tokens-caption").split()[0])
    assert 256 < P <= 512  # two chunks of at most 256
    caption = text(page, "#chunk-caption")
    times = re.search(r"chunk 1 \(tokens 0-255\) at ([\d,]+) ms, chunk 2 \(tokens 256-(\d+)\) at ([\d,]+) ms", caption)
    assert times and int(times.group(2)) == P - 1, caption
    t1, t2 = (int(times.group(k).replace(",", "")) for k in (1, 3))
    assert 0 < t1 < t2
    seen = page.evaluate("window.seen")
    lines = [s.split(". The server")[0] for s in seen["status"]]
    assert "prefilling chunk 1 of 2 (tokens 0-255)" in lines
    # the server's own report of chunk 1, while chunk 2 ran: the same milliseconds the final timings give
    assert f"prefilling chunk 2 of 2 (tokens 256-{P - 1}): chunk 1 done at {t1:,} ms (tokens 0-255)" in lines
    assert "256" in seen["computed"] and seen["computed"][-1] == str(P)  # rows filled chunk by chunk, then all
    assert page.get_attribute("#prefill-progress", "data-seen").startswith(f"1:0-255@{t1}")
    assert page.locator("#prefill-progress").is_hidden()


def steps_state(page) -> dict:
    return {
        "label": text(page, "#steps-label"),
        "now": page.locator("#steps-grid .cell.now").count(),
        "later": page.locator("#steps-grid .cell.later").count(),
        "held": int(page.get_attribute("#steps-kv", "data-held")),
    }


def test_the_stepper_computes_all_prompt_rows_at_once_then_one_row_a_step(page, smollm_native):
    run_prompt(page, "Paris is the capital of", 6)
    page.wait_for_function("document.getElementById('steps-grid').dataset.step === '0'")
    body = {
        "text": "Paris is the capital of",
        "chat": False,
        "layer": int(page.input_value("#layer-select")),
        "head": int(page.input_value("#head-select")),
        "answer": text(page, "#answer"),
        "answer_tokens": 5,
    }
    a = page.evaluate(
        "async (b) => (await fetch('/api/attention', {method: 'POST', headers: "
        "{'Content-Type': 'application/json'}, body: JSON.stringify(b)})).json()",
        body,
    )
    P, S = a["prefill_rows"], a["P"]
    assert (P, S) == (5, 10)  # 5 prompt tokens, then the 5 decode steps' inputs
    assert steps_state(page) == {"label": "step 0 of 5: prefill", "now": 15, "later": 6 + 7 + 8 + 9 + 10, "held": 5}
    assert "ONE forward computes all 5 rows at once" in text(page, "#steps-what")
    top = max(range(5), key=lambda j: a["weights"][4][j])
    assert f"{100 * a['weights'][4][top]:.1f} % on '{a['labels'][top]}' ({top})" in text(page, "#steps-row")
    page.click("#steps-next")
    page.click("#steps-next")
    page.wait_for_function("document.getElementById('steps-grid').dataset.step === '2'")
    assert steps_state(page) == {"label": "step 2 of 5: decode 2", "now": 7, "later": 8 + 9 + 10, "held": 7}
    assert f"feeds '{a['labels'][6]}' (position 6), computes ONE new row against the 7 cached keys" in text(
        page, "#steps-what"
    )
    kv = costs.kv_cache_bytes_for(smollm_native.spec, 7, 4)
    wait_text(page, "#steps-kv-text", f"= {kv:,} B")
    page.click("#steps-next")
    page.click("#steps-next")  # step 4: play has one step left to take (PLAY_MS a step), then stops on the last
    page.wait_for_function("document.getElementById('steps-grid').dataset.step === '4'")
    page.click("#steps-play")
    page.wait_for_function("document.getElementById('steps-grid').dataset.step === '5'", timeout=TIMEOUT_MS)
    assert steps_state(page) == {"label": "step 5 of 5: decode 5", "now": 10, "later": 0, "held": 10}
    assert page.locator("#steps-next").is_disabled() and text(page, "#steps-play") == "▶ play"
    page.click("#steps-prev")
    assert steps_state(page)["label"] == "step 4 of 5: decode 4"


def test_the_kv_store_section_takes_a_prefix_and_a_storage_speed(page):
    page.locator("#tiers").scroll_into_view_if_needed()
    page.wait_for_selector("#tiers-pick[data-choice]", state="attached", timeout=TIMEOUT_MS)
    page.locator("#tp-num").fill("2010")
    wait_text(page, "#tp-text", "2,000 tokens stored in 125 block files")
    api = page.evaluate("async () => (await fetch('/api/compute-or-load/at?P=2010&rate=3000000000')).json()")
    assert (text(page, "#tp-load"), text(page, "#tp-compute"), text(page, "#tp-bytes")) == (
        api["human"]["load"],
        api["human"]["compute"],
        api["human"]["bytes"],
    )
    page.select_option("#tp-storage", label="network, 1 Gbit/s")
    assert page.input_value("#tp-rate") == "0.125"
    wait_text(page, "#tp-text", "read at 125 MB/s")
    page.locator("#tp-rate").fill("0.001")
    wait_text(page, "#tp-text", "read at 1 MB/s")
    slow = page.evaluate("async () => (await fetch('/api/compute-or-load/at?P=2010&rate=1000000')).json()")
    assert page.input_value("#tp-storage") == "custom"
    assert text(page, "#tp-choice") == slow["choice"] and text(page, "#tp-load") == slow["human"]["load"]
    width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1]  # nothing wider than the screen, at 390 px too
    assert page.problems == []
