"""Final-answer extraction from free-form model text: numbers, option letters, code blocks.

Explicit answer markers win over incidental mentions: a reasoning chain names many numbers and
letters, so "the answer is", "Answer:", "####" and \\boxed{} are looked for first (last occurrence),
and only then the last number (math) or a bare option letter (QA).
"""

from __future__ import annotations

import math
import re

_NUMBER = (
    r"[-+]?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?%?"
    r"|[-+]?\.\d+(?:[eE][-+]?\d+)?"
)
_MARKERS = (
    r"\\boxed\{([^{}]*)\}",
    r"####\s*([^\n]*)",
    r"answer\s+is\s*:?\s*([^\n]*)",
    r"answer\s*:\s*([^\n]*)",
)


def extract_number(text: str) -> float | None:
    """The final numeric answer in `text`: after the last answer marker if any, else the last number."""
    for marker in _MARKERS:
        hits = re.findall(marker, text, flags=re.IGNORECASE)
        for hit in reversed(hits):
            numbers = re.findall(_NUMBER, hit)
            if numbers:
                return _parse_number(numbers[0])
    numbers = re.findall(_NUMBER, text)
    return _parse_number(numbers[-1]) if numbers else None


def _parse_number(token: str) -> float | None:
    token = token.replace(",", "").replace("$", "").replace("%", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return float(num) / float(den)
        return float(token)
    except (ValueError, ZeroDivisionError):
        return None


def numbers_match(pred: float | None, target: float) -> bool:
    """Equal, or (non-integer targets only) equal to the target rounded to the >= 2 decimals the answer shows.

    GSM-Hard has 303 non-integer targets (e.g. 3.3333333): 3.33 and 3.3333 count as correct, 3.3 does
    not. Integer targets need the exact value, however large (9867631 is not 9867630).
    """
    if pred is None or not math.isfinite(pred):
        return False
    if math.isclose(pred, target, rel_tol=1e-9, abs_tol=1e-12):
        return True
    if float(target).is_integer():
        return False
    text = repr(float(pred))
    decimals = 0 if "e" in text else len(text.split(".")[1])
    return decimals >= 2 and round(target, decimals) == pred


def format_number(value: float) -> str:
    """How a reference numeric answer is written: integers without a trailing .0."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def extract_choice(text: str, n_options: int) -> str | None:
    """The chosen option letter among the first `n_options` letters (A, B, ...), or None."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:n_options]
    letter = rf"\(?([{letters}])\)?(?![A-Za-z])"
    for marker in (rf"\\boxed\{{\s*{letter}", rf"(?i:answer\s+is)\s*:?\s*{letter}", rf"(?i:answer)\s*:\s*{letter}"):
        hits = re.findall(marker, text)
        if hits:
            return hits[-1]
    bare = re.fullmatch(rf"\s*\(?([{letters}])\)?[.:)]?\s*", text)
    if bare:
        return bare.group(1)
    parenthesized = re.findall(rf"\(([{letters}])\)", text)
    return parenthesized[-1] if parenthesized else None


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The program in a completion: a fenced block (the one defining `entry_point` if several), else the text."""
    blocks = re.findall(r"```(?:[Pp]ython3?|py)?[^\n]*\n(.*?)```", text, flags=re.DOTALL)
    if not blocks:
        return text
    if entry_point:
        defining = [b for b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.MULTILINE)]
        if defining:
            return defining[-1]
    return blocks[0]
