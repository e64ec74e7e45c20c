"""GAIA's scorer against the official ``question_scorer`` rules: a table of edge cases, each expectation
derived by hand from the rules, and a reference written separately from the rules (not from
``porch_jax.envs.gaia.score``) that must agree with it on the table and on generated strings."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from porch_jax.envs.gaia import exact_match, score_answer


# ---- the reference: GAIA's leaderboard scorer.py, rule for rule ------------------------------------------
def ref_normalize_number_str(number_str: str) -> float:
    for char in ["$", "%", ","]:
        number_str = number_str.replace(char, "")
    try:
        return float(number_str)
    except ValueError:
        return float("inf")


def ref_split_string(s: str) -> list[str]:
    return re.split("[,;]", s)


def ref_normalize_str(input_str: str, remove_punct: bool = True) -> str:
    no_spaces = re.sub(r"\s", "", input_str)
    if remove_punct:
        return no_spaces.lower().translate(str.maketrans("", "", string.punctuation))
    return no_spaces.lower()


def ref_is_float(element: str) -> bool:
    try:
        float(element)
        return True
    except ValueError:
        return False


def ref_question_scorer(model_answer: str | None, ground_truth: str) -> bool:
    if model_answer is None:
        model_answer = "None"
    if ref_is_float(ground_truth):
        return ref_normalize_number_str(model_answer) == float(ground_truth)
    if any(char in ground_truth for char in [",", ";"]):
        gt_elems, ma_elems = ref_split_string(ground_truth), ref_split_string(model_answer)
        if len(gt_elems) != len(ma_elems):
            return False
        comparisons = []
        for ma_elem, gt_elem in zip(ma_elems, gt_elems, strict=True):
            if ref_is_float(gt_elem):
                comparisons.append(ref_normalize_number_str(ma_elem) == float(gt_elem))
            else:
                comparisons.append(
                    ref_normalize_str(ma_elem, remove_punct=False) == ref_normalize_str(gt_elem, remove_punct=False)
                )
        return all(comparisons)
    return ref_normalize_str(model_answer) == ref_normalize_str(ground_truth)


# ---- the table: (answer, truth, expected, why) ---------------------------------------------------------
CASES = [
    # numeric truth: float(truth) works; the answer loses $ % , and must float() to the same value
    ("17", "17", True, "same number"),
    (" 17 ", "17", True, "float() ignores surrounding whitespace"),
    ("17.0", "17", True, "compared as floats"),
    ("1.7e1", "17", True, "float() reads exponents"),
    ("17 km", "17", False, "float('17 km') fails: a unit makes the answer wrong"),
    ("seventeen", "17", False, "words are not numbers"),
    ("1,000", "1000", True, "thousands separators are dropped from the answer"),
    ("1,000,000", "1000000", True, "every comma is dropped"),
    ("1.000", "1000", False, "a European thousands point reads as 1.0"),
    ("$1,234.50", "1234.5", True, "$ and , dropped, 1234.50 == 1234.5"),
    ("45%", "45", True, "% dropped"),
    ("45 %", "45", True, "'45 ' floats"),
    ("3.14", "3.14159", False, "no tolerance"),
    ("-5", "-5", True, "signs parse"),
    ("1000", "1_000", True, "float('1_000') is 1000.0, so that truth is numeric"),
    ("nan", "nan", False, "nan is a float truth and never equals itself"),
    ("", "17", False, "an empty answer is infinity"),
    ("17 km", "inf", True, "an unparsable answer is infinity, so it matches the (never used) truth 'inf'"),
    # list truth: not a float, contains , or ; -> split both on [,;]
    ("1000", "1,000", False, "truth '1,000' is the list ['1', '000']; the answer has one element"),
    ("1,000", "1,000", True, "['1', '000'] element-wise: 1 == 1.0, 0 == 0.0"),
    ("1, 2, 3", "1,2,3", True, "numeric elements float() past the spaces"),
    ("1, 2", "1,2,3", False, "lengths differ"),
    ("1, 2, 3, 4", "1,2,3", False, "lengths differ"),
    ("Apple, banana", "apple,Banana", True, "string elements: whitespace removed, case folded"),
    ("a.b, c", "ab,c", False, "punctuation is kept inside list elements"),
    ("Dr. Who, x", "Dr Who, x", False, "punctuation is kept inside list elements"),
    ("a; b", "a, b", True, "; and , both separate"),
    ("a, b", "a; b", True, "; and , both separate"),
    ("a b", "a; b", False, "the answer has no separator: one element against two"),
    ("Paris, 75", "paris, 75.0", True, "mixed: string element folded, numeric element as float"),
    ("$5; 6%", "5;6", True, "numeric elements lose $ and %"),
    ("17 km, 3", "17, 3", False, "a unit on a numeric element fails float()"),
    ("a", "a,", False, "truth 'a,' is ['a', '']"),
    ("a,", "a,", True, "['a', ''] both sides"),
    ("", "a, b", False, "an empty answer is one empty element"),
    # string truth: whitespace and punctuation removed, case folded
    ("St. Petersburg", "st petersburg", True, "punctuation and spaces removed"),
    ("Saint Petersburg", "St. Petersburg", False, "no synonym handling"),
    ("sea gull", "seagull", True, "all whitespace removed"),
    ("Nuuk.", "nuuk", True, "trailing period is punctuation"),
    ("", "Paris", False, "empty answer"),
    ("", "", True, "empty against empty ('' is no float)"),
    (None, "None", True, "a missing answer is the string 'None'"),
    (None, "17", False, "a missing answer against a number"),
]


@pytest.mark.parametrize("answer,truth,expected,why", CASES, ids=[c[3] for c in CASES])
def test_scorer_follows_the_official_rules(answer, truth, expected, why):
    assert ref_question_scorer(answer, truth) is expected, f"table row disagrees with the reference: {why}"
    assert exact_match(answer, truth) is expected, why


# Characters that steer every branch: digits, separators, the stripped $ % , symbols, float syntax
# (. e _ - + inf nan), whitespace of several kinds, letters of both cases, other punctuation.
ALPHABET = "0123456789,;$%._-+eE \t\n\u00a0aAbBinfNn!?'\"()"
STRINGS = st.text(alphabet=ALPHABET, max_size=12)
TRUTHS = st.one_of(STRINGS, st.sampled_from(["17", "1,000", "1000", "a, b", "1;2", "St. Petersburg", "inf", ""]))


@settings(max_examples=2000, deadline=None)
@given(answer=st.one_of(st.none(), STRINGS), truth=TRUTHS)
def test_scorer_agrees_with_the_reference_on_generated_strings(answer, truth):
    assert exact_match(answer, truth) is ref_question_scorer(answer, truth)


def test_score_answer_reports_rule_match_and_judge_separately():
    calls = []

    def judge(question, answer, truth):
        calls.append((question, answer, truth))
        return "Nuuk" in answer

    assert score_answer("nuuk", "Nuuk", "capital?", judge) == (True, "exact match")
    assert calls == []  # the judge is not asked when the rules accept
    assert score_answer("the capital Nuuk", "Nuuk", "capital?", judge) == (True, "judged equivalent")
    assert calls == [("capital?", "the capital Nuuk", "Nuuk")]
    assert score_answer("Oslo", "Nuuk", "capital?", judge) == (False, "expected 'Nuuk', got 'Oslo'")
    assert score_answer("the capital Nuuk", "Nuuk") == (False, "expected 'Nuuk', got 'the capital Nuuk'")
    assert score_answer(None, "Nuuk", "capital?", judge) == (False, "no answer")
    assert len(calls) == 2  # a missing answer is never judged
    assert score_answer(None, "None") == (True, "exact match")  # official: None is the string "None"
