"""SWE-bench: swebench grading on a tiny local repository, the repository tools, and the instance loader."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.swe import SWEEnvironment, SWEInstance, SWETask, checkout, extract_patch, grade_local, load_verified
from porch_jax.envs.swe.instances import DEFAULT_LOCAL
from porch_jax.protocol import Delegate, Finish, Harness, Submit, ToolCall, render_action
from porch_jax.rollout import Engine, EngineConfig

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = "from calc import add, mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n"
GOLD = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,5 @@
 def add(a, b):
-    return a - b
+    return a + b
 
 
 def mul(a, b):
"""
TEST_PATCH = """diff --git a/test_calc.py b/test_calc.py
--- a/test_calc.py
+++ b/test_calc.py
@@ -4,2 +4,6 @@ from calc import add, mul
 def test_mul():
     assert mul(3, 4) == 12
+
+
+def test_add():
+    assert add(2, 3) == 5
"""
ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LANG": "C.UTF-8"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def upstream(tmp_path) -> tuple[Path, SWEInstance]:
    repo = tmp_path / "upstream"
    repo.mkdir()
    (repo / "calc.py").write_text(BUGGY)
    (repo / "test_calc.py").write_text(TESTS)
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    instance = SWEInstance(
        "tiny__calc-1",
        "tiny/calc",
        base,
        "add() subtracts instead of adding.",
        GOLD,
        TEST_PATCH,
        ("test_calc.py::test_add",),
        ("test_calc.py::test_mul",),
    )
    return repo, instance


@pytest.mark.slow
def test_gold_patch_resolves_and_empty_or_wrong_patches_do_not(upstream):
    repo, instance = upstream
    gold = grade_local(instance, GOLD, repo, env=ENV)
    assert gold.resolved and gold.patch_applied, gold.log[-2000:]
    assert gold.tests_status["FAIL_TO_PASS"]["success"] == ["test_calc.py::test_add"]
    empty = grade_local(instance, "", repo, env=ENV)
    assert not empty.resolved and empty.tests_status["FAIL_TO_PASS"]["failure"] == ["test_calc.py::test_add"]
    wrong = GOLD.replace("+    return a + b", "+    return a + b + 0 * mul(1, 1) + 1")
    assert not grade_local(instance, wrong, repo, env=ENV).resolved
    nope = "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n"
    garbage = grade_local(instance, nope, repo, env=ENV)
    assert not garbage.resolved and not garbage.patch_applied


def test_repository_tools_stay_inside_the_checkout(upstream, tmp_path):
    repo, instance = upstream
    work = checkout(repo, instance.base_commit, tmp_path / "work")
    env = SWEEnvironment()
    env.reset(SWETask(instance, str(work)))
    assert "return a - b" in env.call_tool(0, "view", {"path": "calc.py", "start": 1, "end": 2})
    assert env.call_tool(0, "search", {"pattern": r"def \w+\(a, b\)"}).count("calc.py:") == 2
    assert env.call_tool(0, "view", {"path": "../upstream/calc.py"}).startswith("error:")
    assert "occurs 0 times" in env.call_tool(0, "edit", {"path": "calc.py", "old": "nope", "new": "x"})
    assert env.call_tool(0, "edit", {"path": "calc.py", "old": "a - b", "new": "a + b"}) == "edited calc.py"
    assert env.call_tool(0, "view", {}).startswith("error: bad arguments")
    assert extract_patch(work).replace("index ", "").count("+    return a + b") == 1
    out = env.call_tool(0, "bash", {"command": f"echo hi > made.txt; echo x > {tmp_path}/escape.txt; cat made.txt"})
    assert out.startswith("[exit 0]") and "hi" in out and (work / "made.txt").exists()
    assert not (tmp_path / "escape.txt").exists()
    assert "+hi" in extract_patch(work)  # new files are part of the patch


@pytest.mark.slow
def test_engine_episode_on_a_checkout_is_graded_resolved(upstream, tmp_path):
    repo, instance = upstream
    work = checkout(repo, instance.base_commit, tmp_path / "work")

    def orchestrator(request):
        v = request.state
        if not v.turns:
            return render_action(Delegate(Harness("fix add() in calc.py", (), ("view", "edit"), 5)))
        return render_action(Finish(v.turns[-1].feedback.result or ""))

    def subagent(request):
        done = [m.name for m in request.state.memory if m.kind == "call"]
        if "edit" in done:
            return render_action(Submit("fixed"))
        return render_action(ToolCall("edit", {"path": "calc.py", "old": "a - b", "new": "a + b"}))

    engine = Engine(lambda: SWEEnvironment(), ScriptedBackend(orchestrator), ScriptedBackend(subagent), EngineConfig())
    record = asyncio.run(engine.run(SWETask(instance, str(work), source=str(repo), grading={"env": ENV})))
    assert record.outcome.success and record.outcome.reason == "resolved", record.outcome


@pytest.mark.skipif(not DEFAULT_LOCAL.exists(), reason=f"SWE-bench Verified copy not at {DEFAULT_LOCAL}")
def test_local_verified_instances_load_with_partial_fields():
    instances = load_verified()
    assert len(instances) == 500 and len({i.instance_id for i in instances}) == 500
    assert sum(i.repo == "django/django" for i in instances) == 231
    assert all(i.patch.startswith("diff --git") and not i.gradable for i in instances)


def test_instance_errors_name_what_is_missing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"instance_id": "a__b-1", "repo": "a/b", "base_commit": "abc", "problem_statement": "x"}\n'
        '{"instance_id": "a__b-2", "repo": "a/b"}\n'
    )
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*a__b-2.*base_commit"):
        load_verified(bad)
