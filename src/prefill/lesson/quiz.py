"""The lesson's three "To do" questions: typed answers read in any usual notation, checked against
`prefill.costmodel.costs`, answered with a hint (never the answer) until the student asks for it. No torch.

The expected values are computed here from the cost model, so the page never holds them (nor a formula).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from prefill.costmodel import costs
from prefill.costmodel.causal import causal_pairs
from prefill.errors import BadInput

REL_TOL = 0.01  # 1%: "0.28" for 0.28 s and "1.4e13" pass, "1.5e13" and "0.3" do not


@dataclass(frozen=True)
class Question:
    """One question: its text, the expected value, a general hint, and hints for the usual slips."""

    id: str
    text: str
    value: float
    unit: str
    hint: str
    slips: tuple[tuple[float, str], ...] = ()  # (a wrong value students often reach, what went wrong)


def _questions() -> dict[str, Question]:
    flops = costs.prefill_flops(7e9, 1000)
    seconds = costs.compute_seconds(flops, 5e13)
    pairs = causal_pairs(4)
    return {
        q.id: q
        for q in (
            Question(
                "flops",
                "Prefill FLOPs ≈ 2 · N · P for a 7·10⁹-parameter model and a 1000-token prompt.",
                flops,
                "FLOP",
                "Multiply 2 by the parameters by the prompt tokens, then count the powers of ten (9 + 3).",
                ((7e9 * 1000, "that is N · P: each parameter costs a multiply AND an add per token, so 2 FLOPs"),),
            ),
            Question(
                "seconds",
                "The GPU delivers an effective 5·10¹³ FLOP/s on this work. Seconds of prefill?",
                seconds,
                "s",
                "Divide the FLOPs of the first question by the effective rate 5·10¹³ FLOP/s.",
                (
                    (flops / 1e14, "that uses the 10¹⁴ peak; the effective rate here is 5·10¹³ FLOP/s"),
                    (5e13 / flops, "that is rate / FLOPs, upside down: seconds = FLOPs / (FLOP/s)"),
                ),
            ),
            Question(
                "pairs",
                "Causal masking: token i attends to tokens 1…i. Pairs computed for a 4-token prompt?",
                pairs,
                "pairs",
                "Token 1 sees 1 token, token 2 sees 2, … add them up (draw the 4 × 4 grid's lower triangle).",
                (
                    (16, "P² counts the masked future pairs too; only column ≤ row is computed"),
                    (6, "each token also attends to itself: count the diagonal"),
                ),
            ),
        )
    }


QUESTIONS = _questions()

_TIMES_TEN = re.compile(r"(?:[x×*·⋅]|\\times)\s*10\s*(?:\^|\*\*)\s*([-+]?\d+)")
_TEN_POW = re.compile(r"^10\s*(?:\^|\*\*)\s*([-+]?\d+)$")
_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_UNITS = re.compile(r"\s*(flops?|flop/s|seconds?|secs?|s|pairs?|tokens?)\s*$", re.IGNORECASE)
# The page's own formats: an SI prefix before FLOP or s ("14 TFLOP", "280 ms", "1.4 PFLOPs", "280 µs").
_PREFIXED = re.compile(r"\s*([kMGTPmuµn])\s*((?i:flops?|s|secs?|seconds?))\s*$")
_PREFIX = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3, "u": 1e-6, "µ": 1e-6, "n": 1e-9}
_PREFIX_FLOP = {"k", "M", "G", "T", "P"}  # FLOPs come in thousands and up, seconds in thousandths and down


def parse_number(text: str) -> float:
    """A number as people type it: '1.4e13', '14e12', '1.4 × 10^13', '1.4·10¹³', '14,000,000,000,000',
    '0.28 s', '10', and as the page writes it: '14 TFLOP', '280 ms'. BadInput (saying what is accepted, with
    examples that are no answer of the page's) if it is none of these."""
    s = str(text).strip().replace("\u2212", "-").replace("\u03bc", "µ")
    scale, prefixed = 1.0, _PREFIXED.search(s)
    if prefixed and (prefixed.group(1) in _PREFIX_FLOP) == prefixed.group(2).lower().startswith("flop"):
        scale, s = _PREFIX[prefixed.group(1)], s[: prefixed.start()]
    s = _UNITS.sub("", s)
    s = re.sub(r"10([⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+)", lambda m: "10^" + m.group(1).translate(_SUPERSCRIPT), s)
    s = s.replace(",", "").replace("_", "").replace("\u202f", "").replace("\u00a0", "")
    m = _TEN_POW.match(s.replace(" ", ""))
    if m:
        s = "1e" + m.group(1)
    s = _TIMES_TEN.sub(lambda m: "e" + m.group(1), s).replace(" ", "")
    try:
        value = float(s)
    except ValueError:
        examples = "3.5e12, 35e11, 3.5 × 10^12 or 3.5 TFLOP"  # none of them an answer of the page's
        raise BadInput(f"cannot read {text!r} as a number; write it like {examples}") from None
    if not math.isfinite(value):
        raise BadInput(f"{text!r} is not a finite number")
    return value * scale


@dataclass(frozen=True)
class Verdict:
    """The reply to one typed answer. `answer` is filled only when the student asked to see it."""

    correct: bool
    message: str
    answer: float | None = None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL)


def check_answer(question_id: str, text: str, reveal: bool = False) -> Verdict:
    """Check a typed answer to one question: right, or a hint (a specific one for a usual slip)."""
    if question_id not in QUESTIONS:
        raise BadInput(f"unknown question {question_id!r}; choose one of {', '.join(QUESTIONS)}")
    q = QUESTIONS[question_id]
    if reveal:
        return Verdict(False, f"The answer is {q.value:.3g} {q.unit}.", q.value)
    try:
        value = parse_number(text)
    except BadInput as e:
        return Verdict(False, str(e))
    if _close(value, q.value):
        return Verdict(True, f"Right: {value:.3g} {q.unit}.")
    for slip, why in q.slips:
        if _close(value, slip):
            return Verdict(False, f"Not quite: {why}.")
    return Verdict(False, f"Not yet. Hint: {q.hint}")
