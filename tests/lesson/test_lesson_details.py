"""The page's last details (issue #53), in Chromium at 1280 px and (what a phone changes) at 390 px: a step-through that
never shows another prompt, the KV-store section's errors in the lesson's words, table-of-contents links that land,
quizzes that do not hand out the answer, short "why" texts, displays that agree with each other, a phone without hover
or sideways scrolling, and the next token's probabilities and prefill's GEMM on the real model's numbers. One server
(the embedded model) and one browser for the module; each width gets its own fresh page, and its tests run in file order
on it, as a student would use it; the last one checks that nothing failed in the browser."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from test_lesson_browser import full, wait_text
from test_lesson_browser import text as shown
from test_lesson_story import AT_1280
from test_lesson_story import run_prompt as run_story_prompt

from prefill.costmodel import costs
from prefill.costmodel.specs import PRESETS
from prefill.engine.weights import stored_bytes_per_weight
from prefill.lesson.routes import add_lesson
from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")

TIMEOUT_MS = 120_000
SHOTS = Path(tempfile.gettempdir()) / "page-shots"
LONG = " ".join(["the river flows past the old mill"] * 40)  # 280 tokens: 2 chunks of at most 256
# A raw prompt whose most likely next token (82 % here) is the end of the assistant's turn: a one-token answer.
ENDS_AT_ONCE = "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\nYes."
FOLDED_WORDS = 70  # the words a "why" text shows before its "more" (its first sentence)


@pytest.fixture(scope="module")
def url(smollm_native):
    """The server for this module's pages (conftest's `page`, one per width): the embedded model on its GGUF blocks
    with float32 activations, as `prefill lab` runs it."""
    cfg = ServeConfig(model_id_of(smollm_native), max_tokens_limit=512, kv_cache_mb=64)
    with BackgroundServer(add_lesson(create_app(smollm_native, cfg))) as root:
        yield root


def run_prompt(page, prompt: str, tokens: int = 2, cache: bool = True, chat: bool = False) -> None:
    page.locator("#chat").set_checked(chat)
    run_story_prompt(page, prompt, tokens, cache)


def width(page) -> int:
    return page.viewport_size["width"]


def shot(page, selector: str, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.locator(selector).screenshot(path=SHOTS / f"{name}-{width(page)}.png")


def test_the_table_of_contents_lands_on_its_section(page):
    """Item 3: the sections above "Compute or load" draw their content on scroll; the jump stays on its section."""
    page.click(".toc a[href='#tiers']")
    page.wait_for_selector("#tiers[data-shown]", state="attached", timeout=TIMEOUT_MS)
    page.wait_for_timeout(1500)  # what the jump set drawing (the sections passed on the way) has time to land
    top = page.evaluate("document.getElementById('tiers').getBoundingClientRect().top")
    assert abs(top) <= 2, f"'Compute or load' is {top:.0f} px from the top of the window after the jump"
    assert page.evaluate("location.hash") == "#tiers"


def test_the_kv_store_section_says_its_errors_in_the_lessons_words(page):
    """Item 2: beside the inputs, in their units, the tiles greyed; empty and 0 refused; no validator's text."""
    page.wait_for_selector("#tiers-pick[data-choice]", state="attached", timeout=TIMEOUT_MS)
    tiles = page.locator("#tiers-pick .tiles")
    cases = {
        "-5": "The stored prefix must be at least 1 token and at most 10,000,000 tokens; you typed -5 tokens",
        "": "Type the stored prefix: a whole number of tokens",
        "0": "you typed 0 tokens",
        "2.5": "The stored prefix is a whole number of tokens; you typed 2.5",
    }
    for typed, said in cases.items():
        page.locator("#tp-num").fill(typed)
        wait_text(page, "#tp-status", said)
        assert "stale" in tiles.get_attribute("class") and "Input should" not in full(page, "#tp-status")
    near = page.evaluate(
        "document.getElementById('tp-status').getBoundingClientRect().top"
        " - document.getElementById('tp-rate').getBoundingClientRect().bottom"
    )  # right under the inputs (the last of them, the read speed), at either width
    assert 0 <= near <= 40, f"the error sits {near:.0f} px under the inputs"
    shot(page, "#tiers-pick", "tiers-refused")
    page.locator("#tp-num").fill("2048")
    page.locator("#tp-rate").fill("1e9")  # a billion GB/s: said in GB/s, as typed, not in bytes per second
    wait_text(page, "#tp-status", "at most 10,000,000 GB/s; you typed 1,000,000,000 GB/s")
    page.locator("#tp-rate").fill("3")
    page.wait_for_function("() => !document.querySelector('#tiers-pick .tiles').classList.contains('stale')")
    assert full(page, "#tp-status") == "" and full(page, "#tp-text").startswith("2,048 tokens stored")
    for box, status in (("#ex-n", "#example-status"), ("#n-out", "#calc-status")):  # the other whole-number boxes
        page.locator(box).fill("2.5")
        wait_text(page, status, "Output tokens n is a whole number of tokens; you typed 2.5")
        assert "Input should" not in full(page, status)
        page.locator(box).fill("5")
        page.wait_for_function("s => document.querySelector(s).textContent === ''", arg=status)


@AT_1280
def test_the_quizzes_give_a_hint_not_the_answer_and_agree_with_the_simulation(page):
    """Item 4: a wrong choice gets a hint, never the answer; the queueing answer quotes the page's simulation."""
    givers = {"kv": ("A", "268,435,456"), "intensity": ("B", "2 · N · P"), "load": ("A", "1 / (1 − ρ)")}
    for quiz, (wrong, answer) in givers.items():
        page.click(f"[data-quiz='{quiz}'] [data-choice='{wrong}']")
        feedback = page.locator(f"[data-quiz='{quiz}'] .feedback")
        sync_api.expect(feedback).to_contain_text("Not quite")
        assert answer not in feedback.inner_text() and "try again" in feedback.inner_text()
    page.click("[data-quiz='predict'] [data-choice='A']")
    assert "each position's attention may only read" not in shown(page, "#predict .feedback")
    page.locator("#load").scroll_into_view_if_needed()
    page.wait_for_selector("#load[data-rate]", state="attached", timeout=TIMEOUT_MS)
    curve = page.evaluate("async () => (await (await fetch('/api/load')).json()).curve")
    page.click("[data-quiz='load'] [data-choice='C']")
    said = shown(page, "[data-quiz='load'] .feedback")
    assert said.startswith("Right:") and "ten times" not in said
    for u in (0.1, 0.9):  # the simulation's own p50 TTFT at 10 % and 90 % of capacity, as the curve says them
        point = min(curve, key=lambda c: abs(c["utilisation"] - u))
        assert f"{round(point['ttft_p50_s'] * 1e3):,} ms at {round(point['utilisation'] * 100)} %" in said, said


@AT_1280
def test_a_long_prompt_leaves_no_step_through_of_the_last_one(page):
    """Item 1: after a short prompt's steps, a 100-token prompt shows no controls, labels, rows or KV strip."""
    run_prompt(page, "AI is fast", 2)
    page.wait_for_function("document.getElementById('steps-label').textContent.startsWith('step 0 of')")
    run_prompt(page, " ".join(["tokens"] * 100), 2)
    wait_text(page, "#steps-what", "shown for prompts up to 64 tokens; this one has 100")
    for sel in ("#steps-controls", "#steps-prev", "#steps-grid", "#steps-kv"):
        assert not page.locator(sel).is_visible(), sel
    assert all(full(page, s) == "" for s in ("#steps-label", "#steps-row", "#steps-kv-text"))


def test_why_texts_show_one_sentence_and_the_rest_behind_more(page):
    """Item 5: a long "why" (the live prefill's, cold: a length this server never ran; the simulated load's) shows
    its first sentence; "more" opens the rest."""
    run_prompt(page, "AI is " + "very " * (3 if width(page) == 1280 else 4) + "fast", 2)
    for sel in ("#tl-why", "#load-text"):
        whole, seen = full(page, sel), shown(page, sel)
        assert whole.startswith(seen) and len(seen.split()) <= FOLDED_WORDS < len(whole.split()), (sel, seen)
        more = page.locator(f"{sel} + .more-btn")
        more.click()
        assert shown(page, sel) == whole and more.inner_text() == "less"
    assert "cold" in full(page, "#tl-why") and len(shown(page, "#roof-text").split()) <= FOLDED_WORDS


def test_the_calculator_follows_the_presets_dtype(page):
    """Item 6: Llama-3-8B at P = 2,048 holds 256 MiB (bfloat16), as the lesson says, after this server's float32."""
    page.select_option("#model-select", "loaded")
    assert page.input_value("#dtype-select") == "float32"
    page.select_option("#model-select", "llama-3-8b")
    page.locator("#p-num").fill("2048")
    lesson = costs.format_bytes(costs.kv_cache_bytes_for(PRESETS["llama-3-8b"], 2048, 2))
    wait_text(page, "#out-kv", lesson)
    assert (
        full(page, "#out-kv") == lesson and "= 256.0 MiB" in lesson and page.input_value("#dtype-select") == "bfloat16"
    )
    page.select_option("#model-select", "")
    page.locator("#p-num").fill("1000")


KV_SHAPES_JS = """() => {
  window.kvShapes = [];
  new MutationObserver(() => window.kvShapes.push(document.getElementById('kv-shape').textContent))
    .observe(document.getElementById('kv-shape'), { childList: true, characterData: true, subtree: true });
}"""


@AT_1280
def test_a_chunked_prefill_and_its_cached_rerun_are_drawn_as_they_ran(page):
    """Item 6: the KV tile counts only the positions written so far; the chunks' grid is below; a cached rerun is
    not drawn as chunks. Each width its own prompt (one server): the first run is a fresh, chunked prefill."""
    prompt = LONG if width(page) == 1280 else LONG.replace("old", "new")  # 280 tokens either way
    page.evaluate(KV_SHAPES_JS)
    run_prompt(page, prompt, 2)
    shapes = page.evaluate("window.kvShapes")
    assert "S = 0 of the 280 prompt positions, written so far" in shapes[0], shapes[0]
    held = [int(re.search(r"\[1, \d+, (\d+), \d+\]", s).group(1)) for s in shapes]
    assert held == sorted(held) and held[0] == 0, held  # S only grows, from the empty cache
    assert "The grid above" not in full(page, "#live")
    assert "chunk 2 tokens 256-279" in full(page, "#chunk-caption")
    run_prompt(page, prompt, 2)  # the same prompt again: its start from the prefix cache
    cached = int(page.get_attribute("#token-grid", "data-cached"))
    caption = full(page, "#chunk-caption")
    assert cached > 0 and f"the first {cached} tokens' K/V came from the prefix cache" in caption
    assert f"{280 - cached} tokens computed; {cached} came from the prefix cache, one pass" in caption
    assert "chunk 2" not in caption
    shot(page, "#tokens-box", "cached-rerun")


@AT_1280
def test_the_chat_template_and_a_one_token_answer_say_what_they_are(page):
    """Item 6: the template's own system prompt is said; an answer of only its end token is explained."""
    run_prompt(page, "AI is fast", 2, chat=True)
    caption = full(page, "#tokens-caption")
    assert "system prompt you did not write" in caption and "You are a helpful AI assistant" in caption
    P = int(caption.split()[0])
    mine = len(page.evaluate("async () => (await (await fetch('/api/tokens?text=AI%20is%20fast')).json()).ids"))
    assert f"adds {P - mine} tokens of its own" in caption
    run_prompt(page, ENDS_AT_ONCE, 4)
    assert full(page, "#answer") == ""
    note = full(page, "#answer-note")
    assert note.startswith("No text: the model's first answer token was '<|im_end|>'") and "finish: stop" in note


@AT_1280
def test_the_next_tokens_probabilities_from_the_real_model(page, url):
    """Item 8: where ' Paris' ranked and with what probability, beside the token chosen, from the model's logits."""
    run_prompt(page, "The capital of France is", 2)
    r = page.evaluate(
        "async () => (await (await fetch('/api/next-token', { method: 'POST', headers: {'Content-Type': "
        "'application/json'}, body: JSON.stringify({ text: 'The capital of France is', lookup: ' Paris' }) })).json())"
    )
    line = full(page, "#next-lookup-line")
    rank, p = r["lookup"]["rank"], r["lookup"]["p"]
    assert line.startswith(f"' Paris' ranked {rank} of {r['vocab']:,}, probability {100 * p:.1f} %"), line
    assert full(page, "#answer").startswith(r["chosen"]["token"])  # the token chosen is the answer's first
    assert page.locator("#next-list li").count() == 10
    assert f"Chosen: '{r['chosen']['token']}'" in full(page, "#next-chosen")
    page.locator("#next-lookup").fill(" London")
    page.click("#next-form button")
    wait_text(page, "#next-lookup-line", "' London' ranked")
    shot(page, "#next-box", "next-token")


def test_prefill_is_one_gemm_against_decodes_thin_one(page, smollm_native):
    """Item 8: the [P, d] · [d, n] product of prefill beside decode's [1, d] · [d, n], on the model's shapes."""
    s = smollm_native.spec
    P = int(full(page, "#tokens-caption").split()[0])
    n = (s.H_q + 2 * s.H_kv) * s.d_head  # the fused Q, K, V weight's columns
    wait_text(page, "#gemm-prefill", f"x [{P}, {s.d_model}] · W_QKV [{s.d_model}, {n}]")
    assert f"x [1, {s.d_model}] · W_QKV [{s.d_model}, {n}]" in full(page, "#gemm-decode")
    g = page.evaluate(f"async () => (await (await fetch('/api/gemm?P={P}')).json())")
    assert g["prefill"]["flops"] == pytest.approx(2 * P * s.d_model * n) and g["decode"]["flops"] == 2 * s.d_model * n
    per_weight = stored_bytes_per_weight(smollm_native.model)  # GGUF blocks as stored: their mean bytes a weight
    assert 20 / 32 <= per_weight <= 34 / 32  # the embedded file's Q4_1 and Q8_0 blocks, not float32's 4 bytes
    assert g["prefill"]["weight_bytes"] == g["decode"]["weight_bytes"]  # read once, whatever the rows
    assert g["decode"]["weight_bytes"] == pytest.approx(s.d_model * n * per_weight)
    assert f"{g['flops_ratio']:.0f} times the FLOPs" in full(page, "#gemm-text")
    assert page.locator("#gemm-prefill-mats .mat").count() == 3  # x · W = out
    shot(page, "#gemm-box", "gemm")


@AT_1280
def test_a_prompt_too_long_for_the_next_token_view_still_runs_and_says_why(page):
    """A prompt longer than /api/next-token reads (a 1,000-token prompt is ~5,000 characters): the live section
    still finishes, and the next-token box says why it is empty in the lesson's words, not a validator's."""
    from prefill.lesson.nexttoken import MAX_NEXT_TEXT

    prompt = " ".join(["tokens"] * 300)  # 2,099 characters, 300 tokens: two chunks
    assert len(prompt) > MAX_NEXT_TEXT
    run_prompt(page, prompt, 2)
    said = full(page, "#next-chosen")
    assert said == (
        f"The next token is shown for prompts of at most {MAX_NEXT_TEXT:,} characters (so that any text that long"
        f" fits the model's context, whatever its tokens); this one has {len(prompt):,}."
    ), said
    assert page.locator("#next-list li").count() == 0 and full(page, "#next-lookup-line") == ""
    assert full(page, "#answer") != "" and shown(page, "#tl-ttft") not in ("…", "–", "")


def test_the_phone_needs_no_hover_and_no_sideways_scrolling(page):
    """Item 7: a sweep row says its reason when tapped; the shell block wraps."""
    wide = page.locator("pre.shell").evaluate("p => p.scrollWidth - p.clientWidth")
    assert wide <= 0, f"the shell block scrolls {wide} px sideways"
    page.locator("#sweep").scroll_into_view_if_needed()
    page.wait_for_selector("#sweep[data-curve='1']", state="attached", timeout=TIMEOUT_MS)
    page.select_option("#sweep-max", "4")
    page.click("#sweep-btn")
    page.wait_for_selector("#sweep[data-done='1']", state="attached", timeout=TIMEOUT_MS)
    row = page.locator("#sweep-table tbody tr").first
    explain = row.get_attribute("title")
    row.dispatch_event("click")  # a tap: no hover on a touch screen
    assert full(page, "#sweep-note") == f"P = 1: {explain}" and row.get_attribute("aria-selected") == "true"
    shot(page, "#sweep", "sweep-tapped")
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page is {overflow}px wider than its viewport"


def test_nothing_failed_in_the_browser(page):
    assert page.problems == []
