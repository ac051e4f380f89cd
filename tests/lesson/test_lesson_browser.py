"""The lesson page in a real browser: Debian's Chromium driven by Playwright against the real server with the
embedded model. One server and one browser for the module; the tests run in file order on one page, as a
student would use it, and the last one checks that nothing failed along the way.

Screenshots land in page-shots/ under the temporary folder, to look at: the page's, and those of the P sweep and
the simulated load at 1280 and 390 px. `PREFILL_SCREENSHOTS=docs` writes the page's into docs/ instead (the README
shows them), so a run no longer leaves the tracked images rewritten."""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from prefill.costmodel import costs
from prefill.lesson.routes import add_lesson
from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip(
        "no Chromium found: install the Debian package `chromium` (make test does as root)", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(tempfile.gettempdir()) / "page-shots"
DOCS = ROOT / os.environ["PREFILL_SCREENSHOTS"] if os.environ.get("PREFILL_SCREENSHOTS") else SHOTS
TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def url(smollm_native):
    cfg = ServeConfig(model_id_of(smollm_native), max_tokens_limit=512, kv_cache_mb=64)
    smollm_native.warmup()  # as `prefill lab` does: the page's timeline shows the steady state, not first-call set-up
    with BackgroundServer(add_lesson(create_app(smollm_native, cfg))) as root:
        yield root


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def problems():
    """Everything that went wrong in the browser during the module: console errors, page errors, failed requests."""
    return []


@pytest.fixture(scope="module")
def page(browser, url, problems):
    pg = browser.new_page(viewport={"width": 1280, "height": 800})
    pg.set_default_timeout(TIMEOUT_MS)
    pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    # A fetch the page cancels on purpose (a newer slider value replaced it) is not a failure.
    pg.on(
        "requestfailed",
        lambda r: None if r.failure == "net::ERR_ABORTED" else problems.append(f"request failed: {r.url} {r.failure}"),
    )
    pg.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    pg.goto(url + "/")
    pg.wait_for_function("document.getElementById('model-badge').textContent.startsWith('this server runs')")
    yield pg
    pg.close()


def text(page, selector: str) -> str:
    return page.locator(selector).inner_text()


def full(page, selector: str) -> str:
    """An element's whole text: a "why" text's rest, folded behind its "more" button, included."""
    return page.locator(selector).text_content()


def wait_text(page, selector: str, expected: str) -> None:
    page.wait_for_function(
        "([s, t]) => document.querySelector(s).textContent.includes(t)", arg=[selector, expected], timeout=10_000
    )


def slide(page, selector: str, value) -> None:
    """Move a range slider (or type into a number box) as a user would: the page sees an input event."""
    page.locator(selector).fill(str(value))


def test_first_paint_shows_the_seed_lines(page):
    assert text(page, "#line-flops") == "FLOPs ≈ 2 · N · P = 2 · 7e9 · 1,000 = 1.40e+13"
    assert text(page, "#line-time") == "time ≈ 1.40e+13 / 5.0e+13 = 0.28 s"


def log_position(value: float, lo: float, hi: float) -> int:
    """Where a value sits on the page's log-scaled N and P sliders (1,000 positions from lo to hi)."""
    return round(1000 * math.log(value / lo) / math.log(hi / lo))


def test_sliders_give_the_seed_worked_numbers(page):
    # N and P sliders are log-scaled: the seed's N = 7 and P = 1,000 sit mid-track, not at 1.4% and 3%
    assert page.input_value("#n-range") == str(log_position(7, 0.1, 500)) == "499"
    assert page.input_value("#p-range") == str(log_position(1000, 1, 32768)) == "664"
    slide(page, "#n-num", 70)
    slide(page, "#p-num", 4000)
    slide(page, "#u-range", 0.2)
    wait_text(page, "#line-flops", "2 · 7e10 · 4,000 = 5.60e+14")
    assert page.input_value("#n-range") == str(log_position(70, 0.1, 500))  # the slider follows the box
    slide(page, "#p-range", 1000)  # the far end of the track: 32,768 tokens
    wait_text(page, "#line-flops", "2 · 7e10 · 32,768 = ")
    slide(page, "#n-range", log_position(7, 0.1, 500))
    slide(page, "#p-range", log_position(1000, 1, 32768))
    slide(page, "#u-range", 0.5)
    wait_text(page, "#line-time", "time ≈ 1.40e+13 / 5.0e+13 = 0.28 s")
    assert text(page, "#line-flops") == "FLOPs ≈ 2 · N · P = 2 · 7e9 · 1,000 = 1.40e+13"
    slide(page, "#peak-num", 300)
    wait_text(page, "#out-seconds", "93.3 ms")
    assert text(page, "#out-flops") == "14 TFLOP"
    assert text(page, "#line-time") == "time ≈ 1.40e+13 / 1.5e+14 = 0.0933 s"


def test_a_refused_calculator_input_greys_out_the_results_it_no_longer_matches(page, problems):
    before = text(page, "#out-seconds")
    slide(page, "#n-num", 0)
    wait_text(page, "#calc-status", "parameters must be at least 0.001 billion")
    assert "last input that could be computed" in text(page, "#calc-status")
    assert "stale" in page.get_attribute("#calc .tiles", "class")
    assert text(page, "#out-seconds") == before  # kept, greyed, and said to be the last valid input's
    SHOTS.mkdir(exist_ok=True)
    page.locator("#calc").screenshot(path=SHOTS / "calc-refused-1280.png")
    slide(page, "#n-num", 7)
    page.wait_for_function("() => !document.querySelector('#calc .tiles').classList.contains('stale')")
    assert text(page, "#calc-status") == "" and "stale" not in page.get_attribute("#calc .worked", "class")
    refused = [p for p in problems if p.startswith("HTTP 400: ") and "/api/estimate?N=0&" in p]
    assert refused  # the API said no (400), as it should to N = 0; the page's other requests must not fail
    logged = "console error: Failed to load resource: the server responded with a status of 400 (Bad Request)"
    for p in refused:  # each refused response, and the browser's own console line for it (not the page's)
        problems.remove(p)
        if logged in problems:
            problems.remove(logged)


def test_choosing_a_model_and_hardware_shows_exact_flops_kv_and_the_bound(page):
    page.select_option("#model-select", "llama-3-8b")
    page.select_option("#hw-select", "h100-sxm")
    wait_text(page, "#out-kv", "MiB")
    P = int(page.locator("#p-num").input_value())
    from prefill.costmodel.specs import PRESETS

    assert text(page, "#out-kv") == costs.format_bytes(costs.kv_cache_bytes_for(PRESETS["llama-3-8b"], P, 2))
    assert "compute-bound" in text(page, "#out-bound") and "memory-bound" in text(page, "#out-bound")
    assert page.locator("#peak-num").input_value() == "989.4"
    page.select_option("#model-select", "")
    page.select_option("#hw-select", "")
    slide(page, "#n-num", 7)
    wait_text(page, "#line-time", "time ≈ 1.40e+13 / 5.0e+13 = 0.28 s")


def test_mask_grid_at_demo_length_5(page):
    slide(page, "#demo-range", 9)
    wait_text(page, "#mask-caption", "45 pairs for 9 tokens")
    slide(page, "#demo-range", 5)
    wait_text(page, "#mask-caption", "15 pairs for 5 tokens")
    assert page.locator("#mask-grid .cell.allowed").count() == 15
    assert page.locator("#mask-grid .cell.masked").count() == 10
    page.hover("#mask-grid .cell[data-i='2'][data-j='0']")
    assert text(page, "#mask-hover") == "token 2 may use token 0"  # numbered from 0, as the live grid
    page.hover("#mask-grid .cell[data-i='1'][data-j='3']")
    assert text(page, "#mask-hover") == "masked: 3 is in 1's future"


def answer(page, question: str, typed: str) -> str:
    form = page.locator(f"form[data-question='{question}']")
    form.locator("input").fill(typed)
    form.locator("input").press("Enter")
    feedback = form.locator(".feedback")
    sync_api.expect(feedback).not_to_have_text("")
    msg = feedback.inner_text()
    feedback.evaluate("e => { e.textContent = '' }")  # so the next answer's reply is seen afresh
    return msg


def test_typed_answers_right_wrong_and_revealed(page):
    hint = answer(page, "flops", "7e12")
    assert hint.startswith("Not quite") and "1.4e+13" not in hint
    assert page.locator("form[data-question='flops'] .reveal").is_visible()
    assert answer(page, "flops", "1.4 × 10^13").startswith("Right")
    assert page.get_attribute("#a-flops", "placeholder") == "FLOPs"  # no answer in the box before one is typed
    assert answer(page, "flops", "14e12").startswith("Right")
    assert answer(page, "seconds", "0.28").startswith("Right")
    assert answer(page, "seconds", "280 ms").startswith("Right")  # the page's own format
    assert answer(page, "flops", "14 TFLOP").startswith("Right")
    assert answer(page, "pairs", "16").startswith("Not quite")
    form = page.locator("form[data-question='pairs']")
    form.locator(".reveal").click()
    sync_api.expect(form.locator(".feedback")).to_have_text("The answer is 10 pairs.")


def test_predict_first_and_check_your_understanding(page):
    page.click("[data-quiz='predict'] [data-choice='A']")
    sync_api.expect(page.locator("#predict .feedback")).to_contain_text("Not quite")
    page.click("[data-quiz='predict'] [data-choice='B']")
    sync_api.expect(page.locator("#predict .feedback")).to_contain_text("Right: Prefill computes")
    page.click("[data-quiz='kv'] [data-choice='B']")
    sync_api.expect(page.locator("[data-quiz='kv'] .feedback")).to_contain_text("Right: 2 · L · H_kv")


def test_worked_example_calculator(page):
    assert text(page, "#ex-request") == "0.20 + 4 × 0.05 = 0.40 s"
    assert text(page, "#ex-decode") == "1 / 0.05 = 20 tokens/s"
    assert text(page, "#ex-output") == "5 / 0.40 = 12.5 tokens/s"
    page.locator("#ex-n").fill("9")
    wait_text(page, "#ex-request", "0.20 + 8 × 0.05 = 0.60 s")
    page.locator("#ex-n").fill("5")


def test_keyboard_only_sliders_and_answer_boxes(page):
    page.focus("#demo-range")
    page.keyboard.press("ArrowRight")
    wait_text(page, "#mask-caption", "21 pairs for 6 tokens")
    page.keyboard.press("ArrowLeft")
    wait_text(page, "#mask-caption", "15 pairs for 5 tokens")
    page.focus("#n-range")
    page.keyboard.press("ArrowRight")
    wait_text(page, "#line-flops", "2 · 7.1e9 · 1,000")
    page.keyboard.press("ArrowLeft")
    wait_text(page, "#line-flops", "2 · 7e9 · 1,000 = 1.40e+13")
    page.focus("#a-pairs")
    page.keyboard.press("Control+A")
    page.keyboard.type("10")
    page.keyboard.press("Enter")
    sync_api.expect(page.locator("form[data-question='pairs'] .feedback")).to_contain_text("Right")
    page.keyboard.press("Tab")  # from the answer box to its Check button
    assert page.evaluate("document.activeElement.textContent") == "Check"


def test_live_prefill_of_ai_is_fast(page, smollm_native):
    page.locator("#prompt").fill("AI is fast")
    page.locator("#max-tokens").fill("12")

    def prompt_only(response) -> bool:  # the heat map's request (the step-through's own appends the answer)
        return response.url.endswith("/api/attention") and not (response.request.post_data_json or {}).get("answer")

    with page.expect_response(prompt_only) as attention:
        page.click("#prefill-btn")
        page.wait_for_selector("#live[data-done='1']", timeout=TIMEOUT_MS)
    labels = page.locator("#token-grid .row-lbl").all_text_contents()
    assert labels == ["AI", " is", " fast"]
    assert page.locator("#token-grid .cell.allowed").count() == 6
    a = attention.value.json()
    A = a["weights"]
    assert a["labels"] == ["AI", " is", " fast"]
    assert all(A[i][j] == 0 for i in range(3) for j in range(i + 1, 3))
    assert all(abs(sum(row) - 1) < 1e-5 for row in A)
    assert page.locator("#attn-grid .cell.masked").count() == 3
    assert page.locator("#attn-box .scale").is_visible()  # the heat map's colour scale: weight 0 to 1
    assert page.locator("#answer").inner_text().strip() != ""
    for tile in ("#tl-ttft", "#tl-pred", "#tl-total", "#tl-model", "#tl-mfu"):
        assert text(page, tile) not in ("…", "–", ""), tile
    # the prediction beside the measurement: its error, the part that set the time, and why in words
    # (the server's first 3-token forward: cold, and said so)
    assert re.search(r"predicted beside .* measured \([+-]\d+%, cold\); time model", text(page, "#tl-pred-sub"))
    why = full(page, "#tl-why")  # its folded rest ("more") included
    # the cold note, then (only where the forward ran over 2x its prediction: a busy machine) why it was slow
    assert why.endswith("which is cold again).") or re.search(
        r"which is cold again\)\. It ran \d+ times slower", why
    ), why
    assert re.match(r"Why: 3 tokens, one pass: (compute|memory|overhead)-bound", text(page, "#tl-why"))
    assert "prefill (3 tokens, one pass)" in text(page, "#phase-legend")
    assert re.search(r"ITL p50 .* measured beside .* predicted \([+-]\d+%\)", text(page, "#tl-model-sub"))
    assert "compute-bound" in text(page, "#roof-text") or "memory-bound" in text(page, "#roof-text")
    assert page.locator("#roof-chart canvas").count() == 1 and page.locator("#timeline-chart canvas").count() == 1


def run_prompt(page, prompt: str, tokens: int) -> None:
    page.locator("#prompt").fill(prompt)
    page.locator("#max-tokens").fill(str(tokens))
    page.click("#prefill-btn")
    page.wait_for_selector("#live[data-done='1']", timeout=TIMEOUT_MS)


def test_an_empty_prompt_is_said_in_plain_words_and_greys_out_the_last_results(page):
    if not page.locator("#live[data-done='1']").count():  # run alone: a prompt's results first
        run_prompt(page, "AI is fast", 2)
    page.locator("#prompt").fill("   ")
    page.click("#prefill-btn")
    wait_text(page, "#live-status", "Type a prompt first")
    assert "The greyed results below are the last prompt's." in text(page, "#live-status")
    assert "String should" not in text(page, "#live-status")  # no validation jargon
    assert all("stale" in page.get_attribute(f"#{box}", "class") for box in ("tokens-box", "kv-box"))
    run_prompt(page, "AI is fast", 4)
    assert "stale" not in page.get_attribute("#tokens-box", "class") and "error" not in page.get_attribute(
        "#live-status", "class"
    )


def test_streamed_kv_bytes_equal_the_formula(page, smollm_native):
    import re

    s = smollm_native.spec
    n = int(text(page, "#live-status").split(",")[1].split()[0])  # "done: 3 prompt tokens, 12 answer tokens."
    held = int(re.search(r"= \[1, 3, (\d+), 64\]", text(page, "#kv-shape")).group(1))
    assert "S = the " in text(page, "#kv-shape") and "[B, H_kv, S, d_head]" in text(page, "#kv-shape")
    assert 3 <= held <= 3 + n  # the prompt and the answer so far (the newest token's K/V lands next step)
    formula = costs.kv_cache_bytes(s.L, s.H_kv, s.d_head, held, 4)
    assert text(page, "#kv-formula") == f"{formula:,} B"
    measured = text(page, "#kv-measured")
    if measured == "not reported":
        pytest.skip("this server's chunks do not carry timings.kv_bytes yet")
    assert measured == f"{formula:,} B"


def test_changing_layer_and_head_redraws_the_attention(page):
    with page.expect_response("**/api/attention") as attention:
        page.select_option("#head-select", "7")
    a = attention.value.json()
    assert a["head"] == 7 and a["kv_head"] == 2
    sync_api.expect(page.locator("#attn-check")).to_contain_text("query head 7")


def test_screenshots_for_the_readme(page):
    DOCS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=DOCS / "lesson.png")
    page.locator("#calc").screenshot(path=DOCS / "lesson-calculator.png")
    page.check("#chat")  # the chat template: a longer prompt, its attention as a heat map with real labels
    page.locator("#max-tokens").fill("16")
    page.click("#prefill-btn")
    page.wait_for_selector("#live[data-done='1']", timeout=TIMEOUT_MS)
    assert page.locator("#token-grid .row-lbl").first.inner_text() == "<|im_start|>"
    page.locator("#live").screenshot(path=DOCS / "lesson-live.png")
    page.set_viewport_size({"width": 390, "height": 844})
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=DOCS / "lesson-phone.png")
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page is {overflow}px wider than a 390px phone"
    page.locator("#mask").screenshot(path=DOCS / "lesson-phone-mask.png")
    page.set_viewport_size({"width": 1280, "height": 800})
    for name in ("lesson.png", "lesson-calculator.png", "lesson-live.png", "lesson-phone.png", "lesson-phone-mask.png"):
        assert (DOCS / name).stat().st_size > 10_000


def test_a_second_tab_works_while_api_clients_stream(browser, url, smollm_native, problems):
    import threading

    import httpx

    answers = []

    def api_client():
        body = {"model": model_id_of(smollm_native), "prompt": "Count: one, two,", "max_tokens": 8, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            answers.append((r.status_code, "".join(r.iter_text())))

    clients = [threading.Thread(target=api_client) for _ in range(2)]
    for c in clients:
        c.start()
    tab = browser.new_page()
    tab.on("pageerror", lambda e: problems.append(f"second tab: {e}"))
    tab.goto(url + "/")
    tab.locator("#prompt").fill("Hello")
    tab.locator("#max-tokens").fill("4")
    tab.click("#prefill-btn")
    tab.wait_for_selector("#live[data-done='1']", timeout=TIMEOUT_MS)
    assert tab.locator("#token-grid .row-lbl").all_text_contents() == ["Hello"]
    tab.close()
    for c in clients:
        c.join(timeout=120)
    assert [status for status, _ in answers] == [200, 200]
    assert all(text.rstrip().endswith("data: [DONE]") for _, text in answers)


def test_a_long_prompt_is_drawn_scaled_and_its_attention_is_capped(page):
    page.uncheck("#chat")
    page.locator("#prompt").fill(" ".join(["tokens"] * 100))
    page.locator("#max-tokens").fill("2")
    page.click("#prefill-btn")
    page.wait_for_selector("#live[data-done='1']", timeout=TIMEOUT_MS)
    assert page.locator("#token-grid canvas").count() == 1  # a scaled heat map, not 10,000 cells
    assert page.locator("#token-grid .cell").count() == 0
    sync_api.expect(page.locator("#attn-check")).to_contain_text("up to 64 tokens")


def test_a_prompt_of_hundreds_of_tokens_still_gets_its_mask_drawn_scaled(page):
    """Long prompts are where prefill matters: past 256 tokens the mask is drawn in cells of several tokens
    (it said "too many to draw")."""
    page.uncheck("#chat")
    page.locator("#prompt").fill(" ".join(["the river flows past the old mill"] * 40))  # 280 tokens
    page.locator("#max-tokens").fill("2")
    page.click("#prefill-btn")
    page.wait_for_selector("#live[data-done='1']", timeout=TIMEOUT_MS)
    assert page.locator("#token-grid canvas").count() == 1
    sync_api.expect(page.locator("#token-hover")).to_contain_text("pairs for 280 tokens, each cell 2 x 2 tokens")
    canvas = page.locator("#token-grid canvas")
    box = canvas.bounding_box()
    canvas.hover(position={"x": box["width"] * 0.9, "y": box["height"] * 0.1})  # above the diagonal (scrolled to)
    sync_api.expect(page.locator("#token-hover")).to_contain_text("masked: tokens")


def test_a_prompt_again_says_what_came_from_the_prefix_cache_and_predicts_only_the_rest(page):
    """After a prefix-cache hit the page shows what was cached and what was computed, and predicts the computed
    suffix against the cached context (it predicted the whole prompt's prefill beside a 2-token measurement)."""
    page.uncheck("#chat")
    page.locator("#prompt").fill(" ".join(["the river flows past the old mill"] * 40))  # as above: 280 tokens
    page.locator("#max-tokens").fill("2")
    with page.expect_response(measured_prediction) as predicted:
        page.click("#prefill-btn")
        page.wait_for_selector("#live[data-done='1']", timeout=TIMEOUT_MS)
    p = predicted.value.json()
    assert p["cached"] > 0 and p["computed"] == 280 - p["cached"]
    words = f"{p['computed']} tokens computed; {p['cached']} came from the prefix cache, one pass"
    assert p["prefill"] == words and f"prefill ({words})" in text(page, "#phase-legend")
    assert text(page, "#tl-why").startswith(f"Why: {words}: ")
    assert f"the {p['computed']} tokens computed; {p['cached']} came from the prefix cache" in text(page, "#roof-text")
    page.uncheck("#use-cache")  # the switch: a new cache_salt, so every token is prefilled (in the server's chunks)
    try:
        with page.expect_response(measured_prediction) as predicted:
            page.click("#prefill-btn")
            page.wait_for_selector("#live[data-done='1']", timeout=TIMEOUT_MS)
    finally:
        page.check("#use-cache")
    p = predicted.value.json()
    assert (p["cached"], p["computed"]) == (0, 280) and p["forwards"] == 2
    assert "prefill (280 tokens, in 2 chunks of at most 256)" in text(page, "#phase-legend")


def measured_prediction(r) -> bool:  # the prediction beside the measurement (a long prompt's chunks come first)
    return "/api/predict?" in r.url and "prefill_s=" in r.url


LABELS_JS = """async () => {
  const { annotate } = await import("/static/js/labels.js");
  const canvas = Object.assign(document.createElement("canvas"), { width: 300, height: 200 });
  const ctx = canvas.getContext("2d");
  const backings = [];
  const texts = [];
  const [fillRect, fillText] = [ctx.fillRect.bind(ctx), ctx.fillText.bind(ctx)];
  ctx.fillRect = (x, y, w, h) => { backings.push({ x0: x, y0: y, x1: x + w, y1: y + h }); fillRect(x, y, w, h); };
  ctx.fillText = (t, x, y) => { texts.push(t); fillText(t, x, y); };
  const u = {  // what annotate reads of a uPlot: a 240 x 150 plot, values 0..1 on both axes
    ctx, bbox: { left: 40, top: 10, width: 240, height: 150 },
    valToPos: (v, axis) => (axis === "x" ? 40 + 240 * v : 160 - 150 * v),
    data: [[0.1, 0.5, 0.52, 0.9], [0.2, 0.5, 0.55, 0.8], [0.25, 0.45, 0.5, 0.7]],
    series: [{}, { points: { show: () => false } }, { dots: true, points: { show: () => true, size: 10 } }],
  };
  annotate([
    { x: 0.5, color: "#000", label: "a marker label longer than the plot is wide, nearly", short: "short" },
    { x: 0.55, color: "#000", label: "a second marker label", short: ["second", "2"] },
  ], { s: 2, labels: new Map([[0.1, "P=1"], [0.5, "P=4"], [0.52, "P=16"], [0.9, "P=64"]]), color: "#000" })(u);
  return { backings, texts, dpr: devicePixelRatio };
}"""


def test_chart_labels_never_overlap_and_stay_in_the_plot(page):
    drawn = page.evaluate(LABELS_JS)
    boxes, texts = drawn["backings"], drawn["texts"]
    assert drawn["dpr"] == 1 and len(boxes) == len(texts) == 6
    assert texts[0] == "short"  # the long form fits on neither side of its line in a 240 px plot
    for k, a in enumerate(boxes):
        assert a["x0"] >= 40 and a["x1"] <= 280 and a["y0"] >= 10 and a["y1"] <= 160, (texts[k], a)
        for b in boxes[k + 1 :]:
            apart = a["x1"] <= b["x0"] or b["x1"] <= a["x0"] or a["y1"] <= b["y0"] or b["y1"] <= a["y0"]
            assert apart, (texts[k], a, b)


def test_the_sweep_measures_each_P_beside_its_prediction(page):
    page.set_viewport_size({"width": 1280, "height": 800})
    page.locator("#sweep").scroll_into_view_if_needed()
    page.wait_for_selector("#sweep[data-curve='1']")  # the predicted curve, drawn when the section came into view
    assert "From P = " in text(page, "#sweep-summary") and page.locator("#sweep-chart canvas").count() == 1
    page.select_option("#sweep-max", "64")  # P = 1, 4, 16, 64: a second or two; 1024 alone takes seconds
    page.click("#sweep-btn")
    page.wait_for_selector("#sweep[data-done='1']", timeout=TIMEOUT_MS)
    rows = page.locator("#sweep-table tbody tr")
    assert rows.count() == 4
    for i, P in enumerate((1, 4, 16, 64)):
        cells = rows.nth(i).locator("td").all_inner_texts()
        assert cells[0] == str(P), cells
        assert re.fullmatch(r"[+-]\d+%", cells[3]) and cells[4] in ("memory-bound", "compute-bound"), cells
    assert text(page, "#sweep-note").startswith("P = 64: ") and "untimed" in text(page, "#sweep-note")
    assert page.locator("#sweep-chart canvas").count() == 1
    SHOTS.mkdir(exist_ok=True)
    page.locator("#sweep").screenshot(path=SHOTS / "sweep-1280.png")


def test_the_load_slider_shows_what_the_simulator_answers(page):
    page.locator("#load").scroll_into_view_if_needed()
    page.wait_for_selector("#load[data-rate]", timeout=TIMEOUT_MS)  # the capacity and the curve: seconds, once
    assert "%" in text(page, "#ld-util") and text(page, "#load-text").startswith("At ")
    with page.expect_response(lambda r: "/api/load?rate=" in r.url) as answer:
        slide(page, "#load-range", 980)  # 112 % of capacity
    r = answer.value.json()
    page.wait_for_function("rate => +document.getElementById('load').dataset.rate === rate", arg=r["rate"])
    assert r["utilisation"] > 1 and r["ttft_p99_s"] >= r["ttft_p50_s"]
    assert text(page, "#ld-p50") == r["human"]["ttft_p50"] and text(page, "#ld-p99") == r["human"]["ttft_p99"]
    assert text(page, "#ld-util") == r["human"]["utilisation"] and text(page, "#ld-itl") == r["human"]["itl_p50"]
    assert full(page, "#load-text") == r["explanation"] and "never drains" in r["explanation"]
    assert page.locator("#load-chart canvas").count() == 1
    page.locator("#load").screenshot(path=SHOTS / "load-1280.png")


def test_compute_or_load_shows_what_the_api_answers(page):
    with page.expect_response(lambda r: "/api/compute-or-load" in r.url, timeout=TIMEOUT_MS) as answer:
        page.locator("#tiers").scroll_into_view_if_needed()
    r = answer.value.json()
    page.wait_for_selector("#tiers[data-shown]", timeout=TIMEOUT_MS)
    assert r["available"] and full(page, "#tiers-text") == r["explanation"]
    assert text(page, "#tr-token") == r["human"]["per_token"] and text(page, "#tr-ram") == r["human"]["ram"]
    assert text(page, "#tr-disk") == r["human"]["disk"] and text(page, "#tr-even") == r["human"]["break_even"]
    assert page.locator("#tiers-chart canvas").count() == 1
    page.locator("#tiers").screenshot(path=SHOTS / "tiers-1280.png")


def test_the_sweep_load_and_tiers_sections_fit_a_phone(page):
    page.set_viewport_size({"width": 390, "height": 844})
    for section in ("sweep", "load", "tiers"):
        page.locator(f"#{section}").screenshot(path=SHOTS / f"{section}-390.png")
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page is {overflow}px wider than a 390px phone"
    page.set_viewport_size({"width": 1280, "height": 800})
    for name in ("sweep-1280.png", "load-1280.png", "tiers-1280.png", "sweep-390.png", "load-390.png", "tiers-390.png"):
        assert (SHOTS / name).stat().st_size > 10_000


def test_no_console_errors_and_no_failed_requests(problems):
    assert problems == []
