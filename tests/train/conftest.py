"""Fixtures the training tests share: the tiny tokenizer and a dozen synthetic episodes (tiny_data)."""

import pytest
import tiny_data


@pytest.fixture(scope="module")
def tok():
    return tiny_data.tokenizer()


@pytest.fixture(scope="module")
def eps(tok):
    return tiny_data.episodes(12, tok=tok)
