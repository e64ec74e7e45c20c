"""What search and page extraction share: a stored page, its readable text, and the terms both rank by.

The reader is the standard library's HTML parser: scripts, styles and navigation dropped, block elements
as line breaks. Terms are lower-cased runs of letters and digits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser

_WORD = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Page:
    url: str
    title: str
    html: str  # raw page as a fetcher would return it


_SKIP = {"script", "style", "noscript", "nav", "footer", "header", "svg", "template"}
_BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "table", "pre"}


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in _SKIP:
            self._skip += 1
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    reader = _Reader()
    reader.feed(html)
    lines = (" ".join(line.split()) for line in "".join(reader.parts).splitlines())
    return "\n".join(line for line in lines if line)
