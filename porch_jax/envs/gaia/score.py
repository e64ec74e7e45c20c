"""GAIA's answer scorer: the official ``question_scorer`` rules, then an optional LLM equivalence check.

The rules are those of the GAIA leaderboard's ``scorer.py``, kept to the letter, because GAIA numbers are
comparable only when every system is scored by the same function:

- a truth that ``float()`` accepts is a number: the answer, with ``$``, ``%`` and ``,`` removed, must be
  the same float (an answer ``float()`` rejects counts as infinity, as there);
- otherwise a truth containing ``,`` or ``;`` is a list: both sides are split on ``[,;]``, the lengths
  must be equal, and element by element a numeric truth element compares as a number and any other
  one with whitespace removed and case folded, punctuation kept;
- anything else is a string, compared with whitespace and punctuation removed and case folded.

So a truth written ``"1,000"`` is a two-element list, not a number (``float("1,000")`` fails), and a
missing answer is the string ``"None"``. AOrchestra adds an LLM equivalence fallback for answers the rules
reject; ``score_answer`` says which of the two accepted an answer.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable

_LIST_SEPARATOR = re.compile(r"[,;]")
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _number(answer: str) -> float:
    """An answer read as GAIA reads numbers: ``$``, ``%`` and ``,`` dropped, infinity when it does not parse."""
    for char in "$%,":
        answer = answer.replace(char, "")
    try:
        return float(answer)
    except ValueError:
        return math.inf


def _normalize(text: str, remove_punctuation: bool = True) -> str:
    text = re.sub(r"\s", "", text).lower()
    return text.translate(_NO_PUNCTUATION) if remove_punctuation else text


def _element_matches(answer: str, truth: str) -> bool:
    if _is_float(truth):
        return _number(answer) == float(truth)
    return _normalize(answer, remove_punctuation=False) == _normalize(truth, remove_punctuation=False)


def exact_match(answer: str | None, truth: str) -> bool:
    """GAIA's ``question_scorer(answer, truth)``."""
    if answer is None:
        answer = "None"
    if _is_float(truth):
        return _number(answer) == float(truth)
    if "," in truth or ";" in truth:
        truths, answers = _LIST_SEPARATOR.split(truth), _LIST_SEPARATOR.split(answer)
        return len(truths) == len(answers) and all(_element_matches(a, t) for a, t in zip(answers, truths, strict=True))
    return _normalize(answer) == _normalize(truth)


def score_answer(
    answer: str | None, truth: str, question: str = "", equivalent: Callable[[str, str, str], bool] | None = None
) -> tuple[bool, str]:
    """(correct, how): GAIA's rules first ("exact match"), then ``equivalent(question, answer, truth)`` when
    given ("judged equivalent"); a missing answer is never put to the judge ("no answer")."""
    if exact_match(answer, truth):
        return True, "exact match"
    if answer is None:
        return False, "no answer"
    if equivalent is not None and equivalent(question, answer, truth):
        return True, "judged equivalent"
    return False, f"expected {truth!r}, got {answer!r}"
