"""Agent pools: the paper's Table 5 families load, users can extend them, bad files name the problem."""

from __future__ import annotations

import json

import pytest

from porch_jax.maca.encoder import HashingEncoder
from porch_jax.maca.pools import FAMILIES, load_family, load_pool

TABLE5 = {
    "qa": ["TaskRouter", "AnalyzeAgent", "ChoiceEliminator", "EvidenceChecker", "Skeptic", "QASynthesizer"],
    "math": [
        "WordProblemParser",
        "MathSolver",
        "ArithmeticChecker",
        "StepChecker",
        "AlgebraSimplifier",
        "GeneralCritic",
    ],
    "code": ["AlgorithmDesigner", "CodeWriting", "CodeReviewer", "UnitTestWriter", "EdgeCaseHunter", "BugFixer"],
    "auxiliary": ["TaskPlanner", "Summarizer", "BudgetController", "RedTeamCritic"],
}


def test_shipped_pools_are_the_papers_table5():
    pool = load_pool()
    assert pool.names == tuple(name for family in FAMILIES for name in TABLE5[family])
    assert all(a.prompt.startswith(f"You are {a.name}.") for a in pool)
    assert pool.family_mask("code").sum() == 6 and pool.family_mask(["qa", "auxiliary"]).sum() == 10
    assert pool.index("BugFixer") == 17


def test_user_pool_files_extend_the_pool(tmp_path):
    extra = tmp_path / "legal.json"
    extra.write_text(
        json.dumps(
            {
                "family": "legal",
                "description": "Law.",
                "agents": [
                    {"name": "CaseLawFinder", "description": "Finds precedents.", "prompt": "You are CaseLawFinder."}
                ],
            }
        )
    )
    pool = load_pool(["qa"], extra_files=[extra])
    assert pool.names[-1] == "CaseLawFinder" and len(pool) == 7 and pool.agents[-1].family == "legal"


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"agents": []}), "family must be"),
        (json.dumps({"family": "x", "agents": []}), "'agents' must be a non-empty list"),
        (json.dumps({"family": "x", "agents": [{"name": "A", "description": "d"}]}), r"agents\[0\].prompt"),
    ],
)
def test_malformed_pool_file_names_file_and_field(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        load_family(path)
    assert "bad.json" in str(info.value)


def test_duplicate_agent_names_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        load_pool(["qa", "qa"])
    with pytest.raises(KeyError, match="no shipped pool"):
        load_pool(["chemistry"])


def test_hashing_encoder_is_deterministic_and_normalised():
    enc = HashingEncoder(dim=64)
    a, b = enc.encode(["Solve the math problem", "Solve the math problem"]), enc.encode(["Write Python code"])
    assert (
        (a[0] == a[1]).all() and abs(float((a[0] ** 2).sum()) - 1) < 1e-6 and a.shape == (2, 64) and b.shape == (1, 64)
    )
