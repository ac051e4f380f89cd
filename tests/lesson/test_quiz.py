"""The lesson's typed answers: every usual notation reads, right answers pass within 1%, wrong ones get a hint
(a specific one for the usual slips), and the answer only when asked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefill.errors import BadInput
from prefill.lesson.quiz import QUESTIONS, check_answer, parse_number


@pytest.mark.parametrize(
    "text,value",
    [
        ("1.4e13", 1.4e13),
        ("14e12", 1.4e13),
        ("1.4 × 10^13", 1.4e13),
        ("1.4x10^13", 1.4e13),
        ("1.4·10¹³", 1.4e13),
        ("1.4 * 10**13", 1.4e13),
        ("14,000,000,000,000", 1.4e13),
        ("1.4e+13 FLOPs", 1.4e13),
        ("10^13", 1e13),
        ("0.28 s", 0.28),
        (" 10 ", 10),
        ("10 pairs", 10),
        ("−3", -3),
        ("14 TFLOP", 1.4e13),  # the page's own formats
        ("14 TFLOPs", 1.4e13),
        ("1.4e4 GFLOP", 1.4e13),
        ("280 ms", 0.28),
        ("280ms", 0.28),
        ("280000 µs", 0.28),
        ("280000 us", 0.28),
    ],
)
def test_numbers_read_in_every_usual_notation(text, value):
    assert parse_number(text) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("text", ["abc", "", "1.4e", "nan", "inf", "1.4 × 10^", "14 mFLOP", "280 Ts"])
def test_unreadable_numbers_are_refused_with_the_accepted_forms(text):
    with pytest.raises(BadInput, match="3.5e12|finite") as refused:
        parse_number(text)
    examples = str(refused.value).partition("write it like")[2]
    assert "1.4" not in examples and "0.28" not in examples  # no answer of the page's among the examples


@given(st.floats(min_value=1e-30, max_value=1e30, allow_nan=False))
def test_python_repr_of_any_float_reads_back(x):
    assert parse_number(repr(x)) == x


def test_expected_values_come_from_the_cost_model():
    assert QUESTIONS["flops"].value == 1.4e13
    assert QUESTIONS["seconds"].value == pytest.approx(0.28)
    assert QUESTIONS["pairs"].value == 10


@pytest.mark.parametrize(
    "qid,text",
    [
        ("flops", "1.4e13"),
        ("flops", "14e12"),
        ("flops", "1.4 × 10^13"),
        ("seconds", "0.28"),
        ("seconds", "0.2801"),
        ("pairs", "10"),
    ],
)
def test_right_answers_pass(qid, text):
    v = check_answer(qid, text)
    assert v.correct and v.message.startswith("Right") and v.answer is None


@pytest.mark.parametrize(
    "qid,text,hint",
    [
        ("flops", "7e12", "2 FLOPs"),
        ("flops", "1.5e13", "powers of ten"),
        ("seconds", "0.14", "effective rate"),
        ("seconds", "0.3", "Divide"),
        ("pairs", "16", "P²"),
        ("pairs", "6", "diagonal"),
        ("pairs", "11", "add them up"),
    ],
)
def test_wrong_answers_get_a_hint_not_the_answer(qid, text, hint):
    v = check_answer(qid, text)
    assert not v.correct and hint in v.message and v.answer is None
    assert f"{QUESTIONS[qid].value:.3g}" not in v.message


def test_the_answer_comes_only_when_asked():
    v = check_answer("pairs", "", reveal=True)
    assert v.answer == 10 and "10 pairs" in v.message


def test_unreadable_answer_says_how_to_write_it_and_unknown_question_is_refused():
    v = check_answer("flops", "lots")
    assert not v.correct and "3.5 × 10^12" in v.message and "1.4" not in v.message
    with pytest.raises(BadInput, match="unknown question"):
        check_answer("nope", "1")
