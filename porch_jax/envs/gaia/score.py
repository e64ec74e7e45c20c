"""GAIA's answer scorer: exact match after GAIA's normalization, optionally an LLM equivalence check.

As in GAIA's ``question_scorer``: a numeric truth compares as a number (``$``, ``%`` and thousands
separators ignored); a truth with commas or semicolons compares element-wise as a list; anything
else compares as a string with case, spaces and punctuation removed. AOrchestra adds an LLM
equivalence fallback for answers exact match rejects: pass ``equivalent(question, answer, truth)``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable


def _number(text: str) -> float | None:
    try:
        return float(text.replace("$", "").replace("%", "").replace(",", "").strip())
    except ValueError:
        return None


def _normalize(text: str, keep_punctuation: bool = False) -> str:
    text = re.sub(r"\s", "", text).lower()
    return text if keep_punctuation else text.translate(str.maketrans("", "", string.punctuation))


def exact_match(answer: str, truth: str) -> bool:
    if _number(truth) is not None:
        return _number(answer) == _number(truth)
    if any(sep in truth for sep in ",;"):
        gt, pred = re.split(r"[,;]", truth), re.split(r"[,;]", answer)
        return len(gt) == len(pred) and all(
            _number(p) == _number(g) if _number(g) is not None else _normalize(p) == _normalize(g)
            for p, g in zip(pred, gt, strict=False)
        )
    return _normalize(answer) == _normalize(truth)


def score_answer(
    answer: str | None, truth: str, question: str = "", equivalent: Callable[[str, str, str], bool] | None = None
) -> tuple[bool, str]:
    """(correct, how): exact match first, then the LLM equivalence fallback if given."""
    if answer is None:
        return False, "no answer"
    if exact_match(answer, truth):
        return True, "exact match"
    if equivalent is not None and equivalent(question, answer, truth):
        return True, "judged equivalent"
    return False, f"expected {truth!r}, got {answer!r}"
