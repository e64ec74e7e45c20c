"""GAIA tools offline: corpus search, page extraction, sandboxed code, GAIA scoring, and an engine run."""

from __future__ import annotations

import asyncio
import re

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.gaia import (
    CorpusFetcher,
    CorpusSearch,
    GaiaEnvironment,
    GaiaTask,
    Page,
    exact_match,
    execute,
    extract,
    score_answer,
)
from porch_jax.envs.gaia.code import CODE_LIMITS
from porch_jax.protocol import Delegate, Finish, Harness, Submit, ToolCall, render_action
from porch_jax.rollout import Engine, EngineConfig

NOISE = "<script>var population = 1;</script><style>p {color: red}</style><nav>Home | Greenland | Login</nav>"
CORPUS = [
    Page(
        "https://wiki.example/Greenland",
        "Greenland",
        f"<html>{NOISE}<h1>Greenland</h1><p>Greenland is the world's largest island.</p>"
        "<p>Its capital is Nuuk.</p><p>Historical population estimate for 1960: 56,081 inhabitants.</p></html>",
    ),
    Page(
        "https://wiki.example/Iceland",
        "Iceland",
        "<html><p>Iceland is a Nordic island country. Its population is about 380,000.</p></html>",
    ),
    Page("https://wiki.example/Nuuk", "Nuuk", "<html><p>Nuuk is the capital of Greenland.</p></html>"),
]


def _env() -> GaiaEnvironment:
    return GaiaEnvironment(CorpusSearch(CORPUS), CorpusFetcher(CORPUS))


def test_corpus_search_ranks_by_relevance_and_says_when_nothing_matches():
    hits = CorpusSearch(CORPUS).search("Greenland population 1960", k=2)
    assert [h.url for h in hits] == ["https://wiki.example/Greenland", "https://wiki.example/Nuuk"]
    assert "Greenland" in hits[0].snippet and "<" not in hits[0].snippet
    assert CorpusSearch(CORPUS).search("zzyzx quux") == []
    assert _env().call_tool(0, "web_search", {"query": "zzyzx"}) == "no results"


def test_page_extraction_drops_markup_and_narrows_to_the_query():
    full = extract(CorpusFetcher(CORPUS), "https://wiki.example/Greenland")
    assert "largest island" in full and "var population" not in full and "Login" not in full
    narrow = extract(CorpusFetcher(CORPUS), "https://wiki.example/Greenland", "population 1960", max_chars=80)
    assert narrow == "Historical population estimate for 1960: 56,081 inhabitants."
    summarized = extract(
        CorpusFetcher(CORPUS),
        "https://wiki.example/Greenland",
        "capital",
        summarize=lambda q, text: f"{q}: {text.split()[-1]}",
    )
    assert summarized.startswith("capital: ")
    assert _env().call_tool(0, "extract_page", {"url": "https://nowhere.example"}).startswith("error: LookupError: 404")
    assert _env().call_tool(0, "extract_page", {}) == "error: extract_page needs argument 'url'"


def test_code_execution_runs_python_and_bash_in_the_sandbox():
    assert execute("python", "print(round(56081, -3))") == "[exit 0]\n56000"
    assert execute("bash", "echo $((6 * 7)); pwd").startswith("[exit 0]\n42\n/tmp/porch_sandbox_")
    failed = execute("python", "import sys\nprint('x')\nsys.exit(3)")
    assert failed.startswith("[exit 3]\nx")
    assert "ZeroDivisionError" in execute("python", "1 / 0")
    assert execute("ruby", "puts 1").startswith("error: language")


def test_code_execution_times_out():
    from dataclasses import replace

    assert execute("python", "while True: pass", replace(CODE_LIMITS, wall_s=1.0, cpu_s=5)).startswith("[timed out")


def test_gaia_scoring_normalizes_like_gaia_and_can_defer_to_a_judge():
    assert exact_match("56,000", "56000") and exact_match("$1,000", "1000") and not exact_match("56001", "56000")
    assert exact_match("Nuuk.", "nuuk") and exact_match("a; B", "a, b") and not exact_match("a, b, c", "a, b")
    assert score_answer(None, "x") == (False, "no answer")
    assert score_answer("the capital Nuuk", "Nuuk")[0] is False
    assert score_answer("the capital Nuuk", "Nuuk", equivalent=lambda q, a, t: t in a) == (True, "judged equivalent")


def test_engine_episode_with_gaia_tools_is_scored_by_gaia_rules():
    def orchestrator(request):
        v = request.state
        if not v.turns:
            return render_action(
                Delegate(
                    Harness(
                        "Greenland's 1960 population, rounded to thousands",
                        (),
                        ("web_search", "extract_page", "execute_code"),
                        6,
                    )
                )
            )
        return render_action(Finish(v.turns[-1].feedback.result or ""))

    def subagent(request):
        calls = [m for m in request.state.memory if m.kind == "call"]
        if not calls:
            return render_action(ToolCall("web_search", {"query": "Greenland population 1960"}))
        if len(calls) == 1:
            url = re.search(r"https://\S+", calls[0].text)[0]
            return render_action(ToolCall("extract_page", {"url": url, "query": "population 1960"}))
        if len(calls) == 2:
            n = re.search(r"([\d,]+) inhabitants", calls[1].text)[1].replace(",", "")
            return render_action(ToolCall("execute_code", {"language": "python", "code": f"print(round({n}, -3))"}))
        return render_action(Submit(calls[2].text.split()[-1]))

    engine = Engine(_env, ScriptedBackend(orchestrator), ScriptedBackend(subagent), EngineConfig())
    # the truth is written 56000: GAIA's rules read "56,000" as the two-element list ["56", "000"]
    record = asyncio.run(
        engine.run(GaiaTask("gaia/greenland", "Greenland's 1960 population to the nearest 1000?", "56000"))
    )
    assert record.outcome.success and record.meta["answer"] == "56000", record.outcome
    assert [s.tool for s in record.decisions[0].segment] == ["web_search", "extract_page", "execute_code", "submit"]
