"""Fixtures the training tests share: the tiny tokenizer and a dozen synthetic episodes (tiny_data)."""

from tiny_data import eps, tok  # noqa: F401
