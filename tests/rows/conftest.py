"""Fixtures the rows tests share: the tiny tokenizer and a dozen synthetic episodes (tests/train/tiny_data)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from tiny_data import eps, tok  # noqa: E402, F401
