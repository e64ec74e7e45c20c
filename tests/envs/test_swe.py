"""SWE-bench: swebench grading on a tiny local repository, the repository tools, the instance loader, the
environment's config, and what docker grading hands swebench's official harness."""

from __future__ import annotations

import asyncio
import importlib.machinery
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.swe import (
    HUB_FIELDS,
    SWEConfig,
    SWEEnvironment,
    SWEInstance,
    SWETask,
    checkout,
    docker_available,
    extract_patch,
    grade_docker,
    grade_local,
    grading,
    harness_argv,
    load_full,
    load_verified,
    missing_fields,
    uses_docker,
    write_predictions,
)
from porch_jax.envs.swe.instances import DEFAULT_LOCAL, HUB_NAME
from porch_jax.protocol import Delegate, Finish, Harness, Submit, ToolCall, render_action
from porch_jax.rollout import BUDGETS, Budgets, Engine, EngineConfig
from porch_jax.typed_config import ConfigError, from_dict

FIXTURE_ROWS = Path(__file__).resolve().parents[1] / "fixtures/swe/verified_rows.jsonl"
SHARED_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch")  # the shared list's only ones

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

    config = SWEConfig(grader="local")  # a tiny repository the official images do not know
    engine = Engine(
        lambda: SWEEnvironment(config),
        ScriptedBackend(orchestrator),
        ScriptedBackend(subagent),
        EngineConfig(budgets=Budgets(config.total_steps, BUDGETS["swe"].max_agents, config.agent_steps)),
    )
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


# ---- instances: what the shared list lacks, and full rows merged in ---------------------------------------


@pytest.mark.skipif(not DEFAULT_LOCAL.exists(), reason=f"SWE-bench Verified copy not at {DEFAULT_LOCAL}")
def test_the_shared_list_names_the_hub_fields_it_lacks(caplog):
    lacks = ("test_patch", "hints_text", "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS")
    assert missing_fields() == (*lacks, "environment_setup_commit")  # as its SOURCE.md says
    with caplog.at_level(logging.WARNING, logger="porch_jax.envs.swe.instances"):
        load_verified()
    assert "lacks test_patch, hints_text" in caplog.text and "load_full()" in caplog.text


def _partial_list(tmp_path: Path, ids: tuple[str, ...]) -> Path:
    """A list in the shared file's shape (its five fields only) for the given instance ids."""
    rows = {r["instance_id"]: r for r in map(json.loads, FIXTURE_ROWS.read_text().splitlines())}
    path = tmp_path / "partial.jsonl"
    extra = dict(zip(SHARED_FIELDS, ("tiny__calc-9", "tiny/calc", "9" * 40, "x", ""), strict=True))
    lines = [json.dumps({k: rows[i][k] for k in SHARED_FIELDS} if i in rows else extra) for i in ids]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_full_rows_from_a_local_jsonl_are_merged_by_instance_id(tmp_path, caplog):
    partial = _partial_list(tmp_path, ("tiny__calc-2", "tiny__calc-9", "tiny__calc-1"))
    assert missing_fields(partial) == tuple(f for f in HUB_FIELDS if f not in SHARED_FIELDS)
    with caplog.at_level(logging.WARNING, logger="porch_jax.envs.swe.instances"):
        two, nine, one = load_full(partial, rows_path=FIXTURE_ROWS)
    assert [i.instance_id for i in (two, nine, one)] == ["tiny__calc-2", "tiny__calc-9", "tiny__calc-1"]
    assert one.gradable and one.fail_to_pass == ("test_calc.py::test_add",) and one.version == "1.0"
    assert one.created_at == "2024-01-15T10:20:30Z" and two.hints_text == "Compare with add()." and not two.pass_to_pass
    hub_row = json.loads(FIXTURE_ROWS.read_text().splitlines()[0])
    assert {k: one.to_swebench()[k] for k in HUB_FIELDS} == hub_row  # every hub field, in the hub's encoding
    assert not nine.gradable and "1 of 3 instances have no full row" in caplog.text and "tiny__calc-9" in caplog.text


def _fake_datasets(monkeypatch, rows_path: Path) -> list[tuple]:
    """A stand-in ``datasets`` module (nothing downloads); returns the calls it gets."""
    calls: list[tuple] = []
    fake = types.ModuleType("datasets")
    fake.__spec__ = importlib.machinery.ModuleSpec("datasets", None)

    def load_dataset(name, split):
        calls.append((name, split))
        return [json.loads(line) for line in rows_path.read_text().splitlines()]

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    return calls


def test_full_rows_come_from_the_hub_when_online_and_a_clear_error_when_not(tmp_path, monkeypatch):
    partial = _partial_list(tmp_path, ("tiny__calc-1",))
    calls = _fake_datasets(monkeypatch, FIXTURE_ROWS)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert load_full(partial)[0].gradable and calls == [(HUB_NAME, "test")]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"lacks test_patch, hints_text.*rows_path.*HF_HUB_OFFLINE"):
        load_full(partial)
    assert len(calls) == 1 and load_full(partial, rows_path=FIXTURE_ROWS)[0].gradable


# ---- the environment's config ---------------------------------------------------------------------------


def test_config_defaults_are_the_papers_swe_budgets_and_are_validated():
    config = SWEConfig()
    assert (config.total_steps, config.agent_steps) == (500, 50)
    assert (config.total_steps, config.agent_steps) == (BUDGETS["swe"].total_steps, BUDGETS["swe"].default_agent_budget)
    for bad in (
        {"total_steps": 0},
        {"agent_steps": -1},
        {"total_steps": True},
        {"agent_steps": 501},
        {"subagent_tools": ()},
        {"subagent_tools": ("view", "shell")},
        {"grader": "kubernetes"},
    ):
        key = next(iter(bad))
        with pytest.raises(ConfigError, match=rf"^config\.{key}: "):
            from_dict(SWEConfig, bad)


def test_subagents_get_only_the_configured_tools(upstream, tmp_path):
    repo, instance = upstream
    env = SWEEnvironment(SWEConfig(subagent_tools=("view", "search")))
    env.reset(SWETask(instance, str(checkout(repo, instance.base_commit, tmp_path / "work"))))
    assert env.tool_names() == ("view", "search")
    assert [s["function"]["name"] for s in env.tool_schemas(["view", "edit"])] == ["view"]
    assert env.call_tool(0, "edit", {"path": "calc.py", "old": "a - b", "new": "a + b"}) == "error: unknown tool 'edit'"


# ---- docker grading -------------------------------------------------------------------------------------
# No docker engine runs here: these check what we hand swebench's official harness (the argv against its real
# --help, the predictions file read back by its own reader), how docker is detected, and how the reports it
# writes are read (a stand-in harness writes them). The docker run itself is not exercised.


def _harness_help() -> str:
    cmd = [sys.executable, "-m", grading.HARNESS_MODULE, "--help"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def test_the_harness_argv_uses_only_flags_its_help_lists_and_every_required_one(tmp_path):
    ids = ["astropy__astropy-12907", "django__django-11099"]
    argv = harness_argv(tmp_path / "p.jsonl", ids, "run-1", max_workers=2, timeout_s=900, report_dir=tmp_path)
    assert argv[:3] == [sys.executable, "-m", "swebench.harness.run_evaluation"]
    assert argv[argv.index("--dataset_name") + 1] == "princeton-nlp/SWE-bench_Verified"
    assert argv[argv.index("--instance_ids") + 1 :] == ids  # nargs="+": the ids come last
    help_text = _harness_help()
    listed = set(re.findall(r"--\w+", help_text))
    passed = {a for a in argv if a.startswith("--")}
    assert passed <= listed, passed - listed
    usage = help_text.split("\n\n")[0]
    while "[" in usage:
        usage = re.sub(r"\[[^\[\]]*\]", "", usage)  # drop the optional groups, innermost first
    long_of = dict(re.findall(r"^\s+(-\w+) [A-Z_]+, (--\w+)", help_text, re.MULTILINE))
    required = {long_of.get(flag, flag) for flag in re.findall(r"(?<![\w-])-{1,2}\w+", usage)}
    assert required == {"--predictions_path", "--run_id"} and required <= passed


def test_the_predictions_file_reads_back_with_the_harness_reader(tmp_path):
    from swebench.harness.utils import get_predictions_from_file

    patches = {"tiny__calc-1": GOLD, "tiny__calc-2": ""}
    path = write_predictions(tmp_path / "preds.jsonl", patches)
    rows = get_predictions_from_file(str(path), HUB_NAME, "test")
    assert rows == [{"instance_id": i, "model_name_or_path": "porch", "model_patch": p} for i, p in patches.items()]


def _fake_docker_cli(tmp_path: Path, monkeypatch, exit_code: int) -> None:
    bin_dir = tmp_path / f"bin{exit_code}"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\n[ "$1" = info ] && exit {exit_code}\nexit 2\n')
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_docker_is_detected_by_docker_info(tmp_path, monkeypatch):
    _fake_docker_cli(tmp_path, monkeypatch, 0)
    assert docker_available() and uses_docker("auto") and not uses_docker("local")
    _fake_docker_cli(tmp_path, monkeypatch, 1)
    assert not docker_available() and not uses_docker("auto") and uses_docker("docker")


def test_without_the_cli_docker_is_detected_by_a_ping_on_its_socket(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker CLI
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)

    def answer():
        conn, _ = server.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        assert docker_available(timeout_s=5.0)
    finally:
        thread.join(5)
        server.close()
    assert not docker_available(timeout_s=1.0)  # the socket file is left, but nothing answers
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    assert not docker_available(timeout_s=1.0)


def _stand_in_harness(monkeypatch, returncode: int = 0) -> list[list[str]]:
    """Replaces only the harness subprocess: it writes what the real one writes for a resolved instance (the
    first prediction) and for one whose patch did not apply (the others)."""
    real_run, calls = subprocess.run, []

    def run(argv, **kwargs):
        if argv[1:3] != ["-m", grading.HARNESS_MODULE]:
            return real_run(argv, **kwargs)
        calls.append(argv)
        run_id = argv[argv.index("--run_id") + 1]
        preds = [
            json.loads(line)
            for line in Path(argv[argv.index("--predictions_path") + 1]).read_text().split("\n")
            if line
        ]
        for n, pred in enumerate(preds):
            log_dir = Path(
                kwargs["cwd"], "logs/run_evaluation", run_id, pred["model_name_or_path"], pred["instance_id"]
            )
            log_dir.mkdir(parents=True)
            if n == 0:
                status = {"FAIL_TO_PASS": {"success": ["t::a"], "failure": []}}
                report = {"resolved": True, "patch_successfully_applied": True, "tests_status": status}
                (log_dir / "report.json").write_text(json.dumps({pred["instance_id"]: report}))
            else:
                (log_dir / "run_instance.log").write_text(">>>>> Patch Apply Failed:\nerror: corrupt patch\n")
        return subprocess.CompletedProcess(argv, returncode, "", "docker.errors.DockerException: no engine")

    monkeypatch.setattr(grading.subprocess, "run", run)
    return calls


def test_docker_grading_reads_the_reports_the_harness_writes(tmp_path, monkeypatch):
    calls = _stand_in_harness(monkeypatch)
    reports = grade_docker({"a__b-1": GOLD, "a__b-2": "garbage"}, run_dir=tmp_path / "run", dataset_name="rows.jsonl")
    assert reports["a__b-1"].resolved and reports["a__b-1"].tests_status["FAIL_TO_PASS"]["success"] == ["t::a"]
    assert not reports["a__b-2"].resolved and not reports["a__b-2"].patch_applied
    assert "corrupt patch" in reports["a__b-2"].log
    argv = calls[0]
    assert argv[argv.index("--dataset_name") + 1] == "rows.jsonl" and argv[-2:] == ["a__b-1", "a__b-2"]
    assert (tmp_path / "run" / f"{argv[argv.index('--run_id') + 1]}.predictions.jsonl").exists()
    _stand_in_harness(monkeypatch, returncode=1)
    with pytest.raises(RuntimeError, match=r"harness failed \(exit 1\):\ndocker.errors.DockerException: no engine"):
        grade_docker({"a__b-1": GOLD})


def test_with_docker_the_environment_grades_even_a_partial_instance_through_the_harness(
    upstream, tmp_path, monkeypatch
):
    repo, instance = upstream
    partial = SWEInstance(instance.instance_id, instance.repo, instance.base_commit, instance.problem_statement)
    work = checkout(repo, instance.base_commit, tmp_path / "work")
    env = SWEEnvironment(SWEConfig(grader="auto"))
    env.reset(SWETask(partial, str(work)))
    monkeypatch.setattr(grading, "docker_available", lambda: False)
    assert env.score(None).reason.startswith("not graded")
    monkeypatch.setattr(grading, "docker_available", lambda: True)
    calls = _stand_in_harness(monkeypatch)
    env.call_tool(0, "edit", {"path": "calc.py", "old": "a - b", "new": "a + b"})
    score = env.score(None)
    assert score.success and score.reason == "resolved" and calls[0][-1] == instance.instance_id
