"""GAIA as an ``Environment``: web search, page extraction and code execution, scored as GAIA does.

The providers are injected, so the same environment runs live (``SerperSearch`` + ``HTTPFetcher``)
or offline on a corpus (``CorpusSearch`` + ``CorpusFetcher``, as in the tests); tasks come from
``tasks.load_gaia`` / ``tasks.load_taskcraft``. Tool failures (a 404, a provider error) come back as
observations; GAIA has no asynchronous events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from porch_jax.envs.base import Environment, Score
from porch_jax.envs.gaia.code import LANGUAGES, execute
from porch_jax.envs.gaia.pages import PageFetcher, extract
from porch_jax.envs.gaia.score import score_answer
from porch_jax.envs.gaia.search import SearchProvider
from porch_jax.envs.gaia.tasks import GaiaTask


def _schema(name: str, description: str, props: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(required)},
        },
    }


SCHEMAS = {
    "web_search": _schema(
        "web_search",
        "Search the web; returns titles, URLs and snippets.",
        {"query": {"type": "string"}, "k": {"type": "integer", "minimum": 1, "maximum": 10}},
        ("query",),
    ),
    "extract_page": _schema(
        "extract_page",
        "Read a web page; with `query`, only the passages about it.",
        {"url": {"type": "string"}, "query": {"type": "string"}},
        ("url",),
    ),
    "execute_code": _schema(
        "execute_code",
        "Run python or bash in a sandbox (10 s, no network).",
        {"language": {"type": "string", "enum": list(LANGUAGES)}, "code": {"type": "string"}},
        ("language", "code"),
    ),
}
TOOLS = tuple(SCHEMAS)


class GaiaEnvironment(Environment):
    name = "gaia"

    def __init__(
        self,
        search: SearchProvider,
        fetcher: PageFetcher,
        *,
        summarize: Callable[[str, str], str] | None = None,
        equivalent: Callable[[str, str, str], bool] | None = None,
    ):
        self.search, self.fetcher, self.summarize, self.equivalent = search, fetcher, summarize, equivalent
        self.task: GaiaTask | None = None

    def reset(self, task: GaiaTask) -> None:
        self.task = task

    def tool_names(self) -> tuple[str, ...]:
        return TOOLS

    def tool_schemas(self, names: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
        return [SCHEMAS[n] for n in names if n in SCHEMAS]

    def call_tool(self, agent_id: int, name: str, args: dict[str, Any]) -> str:
        try:
            if name == "web_search":
                hits = self.search.search(str(args["query"]), int(args.get("k", 5)))
                return (
                    "\n\n".join(f"[{i}] {h.title}\n{h.url}\n{h.snippet}" for i, h in enumerate(hits, 1)) or "no results"
                )
            if name == "extract_page":
                return extract(self.fetcher, str(args["url"]), str(args.get("query", "")), summarize=self.summarize)
            if name == "execute_code":
                return execute(str(args["language"]), str(args["code"]))
            return f"error: unknown tool {name!r}"
        except KeyError as e:
            return f"error: {name} needs argument {e}"
        except Exception as e:  # provider failures (HTTP errors, 404s) are observations
            return f"error: {type(e).__name__}: {e}"

    def poll_notifications(self, step: int) -> list[str]:
        return []

    def score(self, answer: str | None) -> Score:
        assert self.task is not None, "reset() first"
        ok, how = score_answer(answer, self.task.truth, self.task.question, self.equivalent)
        return Score(ok, float(ok), how)
