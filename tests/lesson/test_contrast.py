"""The page's colours meet WCAG 2 contrast, computed from lesson.css and the charts' label colours: 4.5:1 for text,
3:1 for the focus ring, against every background they sit on (the card, the page, a panel)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

STATIC = Path(__file__).resolve().parents[2] / "src" / "prefill" / "lesson" / "static"
CSS = (STATIC / "lesson.css").read_text()
ROOT = dict(re.findall(r"(--[\w-]+):\s*(#[0-9a-fA-F]{6})\b", CSS.split(":root {", 1)[1].split("}", 1)[0]))
BACKGROUNDS = ("--card", "--bg", "--panel")
TEXT = ("--ink", "--muted", "--accent", "--good", "--bad", "--amber")


def luminance(hex_colour: str) -> float:
    """WCAG 2 relative luminance of an sRGB colour '#rrggbb'."""
    channels = [int(hex_colour[k : k + 2], 16) / 255 for k in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio, 1 to 21."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_the_formula_gives_wcags_worked_values():
    assert contrast("#000000", "#ffffff") == pytest.approx(21)
    assert contrast("#767676", "#ffffff") == pytest.approx(4.54, abs=0.01)  # the lightest grey for text on white
    assert contrast("#93b4ff", "#ffffff") == pytest.approx(2.06, abs=0.01)  # the focus ring a review found too faint


@pytest.mark.parametrize("background", BACKGROUNDS)
@pytest.mark.parametrize("text", TEXT)
def test_text_colours_reach_4_5_to_1(text, background):
    assert contrast(ROOT[text], ROOT[background]) >= 4.5, (text, ROOT[text], background, ROOT[background])


@pytest.mark.parametrize("background", BACKGROUNDS)
def test_the_focus_ring_reaches_3_to_1(background):
    assert re.search(r":focus-visible\s*{[^}]*outline:[^;}]*var\(--focus\)", CSS)  # the ring is drawn in --focus
    assert contrast(ROOT["--focus"], ROOT[background]) >= 3, (ROOT["--focus"], background)


def test_chart_labels_are_drawn_in_colours_that_reach_4_5_to_1():
    """A marker's label is drawn in its line's colour on a white backing, and point labels in theirs: every such
    colour in the scripts is text. Amber comes from the style sheet (--amber), checked above."""
    scripts = "".join(p.read_text() for p in sorted((STATIC / "js").glob("*.js")))
    colours = set(re.findall(r'color: "(#[0-9a-fA-F]{6})"', scripts))
    assert len(colours) >= 3 and "#f59e0b" not in scripts
    assert [c for c in colours if contrast(c, ROOT["--card"]) < 4.5] == []
