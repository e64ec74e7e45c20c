"""The attribution job: a 1,000-decision store judged, killed midway (kill -9), resumed: every
decision recorded exactly once, with the same judgements as an uninterrupted run; malformed replies
and failed calls are recorded as errors, never dropped."""

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from porch_jax import faults
from porch_jax.attribution.job import AttributionStore, attribute_store
from porch_jax.attribution.judge import ScriptedJudge
from porch_jax.backends import ScriptedBackend
from porch_jax.envs.workplace import TaskMixture, make_tasks
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.suite import SuiteConfig
from porch_jax.trajectories import TrajectoryStore

SUITE = SuiteConfig(max_decisions=20, max_evidence_chars=160)


def _store_of_1000(path):
    """Expert episodes, copied under new ids and cut so the store holds exactly 1,000 decisions."""
    engine = suite_lib.expert_engine(SUITE)

    async def run():
        return [await engine.run(t, episode_id=t.task_id) for t in make_tasks(40, TaskMixture(slack=(1, 3)))]

    base, out, n, i = asyncio.run(run()), [], 0, 0
    while n < 1000:
        ep = base[i % len(base)]
        keep = ep.decisions[: 1000 - n]
        out.append(dataclasses.replace(ep, episode_id=f"{ep.episode_id}#{i}", decisions=keep))
        n, i = n + len(keep), i + 1
    with TrajectoryStore(path) as store:
        store.append_many(out)
    return out


def _judge(store_path, out_path, **kw):
    with AttributionStore(out_path) as out:
        return asyncio.run(
            attribute_store(
                TrajectoryStore(store_path), ScriptedBackend(ScriptedJudge(), **kw), out, concurrency=8, progress=False
            )
        )


@pytest.mark.slow
def test_kill_and_resume_1000_decisions_without_duplicates(tmp_path):
    episodes = _store_of_1000(tmp_path / "traj.jsonl")
    keys = {(ep.episode_id, d.index) for ep in episodes for d in ep.decisions}
    assert len(keys) == 1000
    reference = _judge(tmp_path / "traj.jsonl", tmp_path / "reference.jsonl")
    assert reference.total == 1000 and reference.judged > 0 and reference.attributable > 0

    out = tmp_path / "attr.jsonl"
    script = textwrap.dedent(f"""
        import asyncio
        from porch_jax.attribution.job import AttributionStore, attribute_store
        from porch_jax.attribution.judge import ScriptedJudge
        from porch_jax.backends import ScriptedBackend
        from porch_jax.trajectories import TrajectoryStore
        with AttributionStore({str(out)!r}) as out:
            asyncio.run(attribute_store(TrajectoryStore({str(tmp_path / "traj.jsonl")!r}),
                                        ScriptedBackend(ScriptedJudge(), latency_s=0.01), out, concurrency=4,
                                        progress=False))
    """)
    # Killed by the crash point of the store's 100th write (porch_jax/faults.py): half its last line, then SIGKILL.
    env = {**os.environ, "PYTHONPATH": os.getcwd(), faults.ENV: "attr.jsonl@100"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    lines = out.read_bytes().splitlines(keepends=True)
    written = sum(line.endswith(b"\n") for line in lines)
    assert 99 <= written < 1000 and not lines[-1].endswith(b"\n"), written  # killed midway, mid-write

    summary = _judge(tmp_path / "traj.jsonl", out)
    rows = AttributionStore(out).read()
    assert summary.skipped_done == written and len(rows) == 1000
    assert {(r["episode_id"], r["index"]) for r in rows} == keys  # each decision exactly once
    by_key = {(r["episode_id"], r["index"]): (r["attributable"], r["hint"], r["status"]) for r in rows}
    ref = {
        (r["episode_id"], r["index"]): (r["attributable"], r["hint"], r["status"])
        for r in AttributionStore(tmp_path / "reference.jsonl").read()
    }
    assert by_key == ref
    assert _judge(tmp_path / "traj.jsonl", out).judged == 0  # a finished job has nothing left to do


def test_torn_last_line_is_set_aside_and_redone(tmp_path):
    engine = suite_lib.expert_engine(SUITE)
    ep = asyncio.run(engine.run(make_tasks(1)[0], episode_id="e"))
    with TrajectoryStore(tmp_path / "t.jsonl") as s:
        s.append(ep)
    _judge(tmp_path / "t.jsonl", tmp_path / "a.jsonl")
    lines = (tmp_path / "a.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_bytes(b"".join(lines[:-1]) + lines[-1][:10])  # a kill mid-write
    assert len(AttributionStore(tmp_path / "a.jsonl").read()) == len(lines) - 1
    _judge(tmp_path / "t.jsonl", tmp_path / "a.jsonl")
    rows = AttributionStore(tmp_path / "a.jsonl").read()
    assert len(rows) == len(ep.decisions) == len({r["index"] for r in rows})
    assert (tmp_path / "a.jsonl.torn").exists()


def test_malformed_replies_and_failed_calls_are_recorded_as_errors(tmp_path):
    engine = suite_lib.expert_engine(SUITE)
    ep = asyncio.run(engine.run(make_tasks(1, start=3)[0], episode_id="e"))
    with TrajectoryStore(tmp_path / "t.jsonl") as s:
        s.append(ep)
    calls = 0

    def flaky(request):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("server went away")
        return "I think the decision was fine." if calls == 2 else "FLAG: false"

    with AttributionStore(tmp_path / "a.jsonl") as out:
        summary = asyncio.run(
            attribute_store(
                TrajectoryStore(tmp_path / "t.jsonl"),
                ScriptedBackend(flaky),
                out,
                concurrency=1,
                progress=False,
                retries=0,
            )
        )
    rows = AttributionStore(tmp_path / "a.jsonl").read()
    errors = [r for r in rows if r["status"] == "error"]
    assert len(rows) == len(ep.decisions) and summary.errors == len(errors) == 2
    assert errors[0]["detail"].startswith("backend: ") and "server went away" in errors[0]["detail"]
    assert errors[1]["detail"].startswith("malformed: ") and "no_flag" in errors[1]["detail"]
    assert all(not r["attributable"] for r in errors)
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert skipped and all(
        ep.decisions[r["index"]].action is None or ep.decisions[r["index"]].action["name"] in ("finish", "stop")
        for r in skipped
    )
    assert json.loads((tmp_path / "a.jsonl").read_text().splitlines()[0])["episode_id"] == "e"


def test_the_launcher_judges_through_the_grm_endpoint_its_config_names(tmp_path):
    """launch/attribute.py end to end: the GRM is a local test server playing an OpenAI-compatible endpoint (its key
    in the variable the config names), every judgement lands once, a rerun judges nothing, and the key is nowhere
    in the output."""
    from fake_openai import FakeOpenAIServer, Step, reply_with

    engine = suite_lib.expert_engine(SUITE)
    ep = asyncio.run(engine.run(make_tasks(1, start=3)[0], episode_id="e"))
    with TrajectoryStore(tmp_path / "t.jsonl") as s:
        s.append(ep)
    server = FakeOpenAIServer(default=Step(reply=reply_with("FLAG: true\nHINT: add archive to tools")))
    argv = [
        sys.executable, "-m", "launch.attribute", "--config=experiments/attribute_smollm2.py",
        f"--config.records={tmp_path / 't.jsonl'}", f"--config.out={tmp_path / 'a.jsonl'}",
        f"--config.grm.urls=('{server.url}',)", "--config.grm.provider=openai_compatible",
        "--config.grm.api_key_env=PORCH_TEST_GRM_KEY", "--config.sampling.max_tokens=32",
    ]  # fmt: skip
    env = {**os.environ, "PORCH_TEST_GRM_KEY": "sk-grm-secret", "JAX_PLATFORMS": "cpu"}
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        first = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False)
        second = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False)
    finally:
        server.close()
    assert first.returncode == 0, first.stderr[-2000:]
    rows = AttributionStore(tmp_path / "a.jsonl").read()
    judged = [r for r in rows if r["status"] == "ok"]
    assert len(rows) == len(ep.decisions) and judged and all(r["hint"] == "add archive to tools" for r in judged)
    assert len(server.requests) == len(judged)  # the rerun judged nothing
    assert server.requests[0][1]["max_tokens"] == 32
    assert server.requests[0][0]["Authorization"] == "Bearer sk-grm-secret"
    assert "0 judged now" in second.stdout and "sk-grm-secret" not in (tmp_path / "a.jsonl").read_text()


def test_a_rerun_into_an_output_of_another_config_is_refused(tmp_path):
    """<out>.config.json records the job's config: a rerun with the GRM elsewhere or more calls in flight resumes;
    one with another GRM model or sampling is refused before any call, naming the keys."""
    from porch_jax.attribution.job import AttributionConfig, run_job
    from porch_jax.backends import Sampling
    from porch_jax.backends.spec import EndpointSpec
    from porch_jax.typed_config import RunDirError, claim_run_dir

    out = tmp_path / "a.jsonl"
    cfg = AttributionConfig(str(tmp_path / "t.jsonl"), str(out), EndpointSpec("grm", ("http://127.0.0.1:9",)))
    claim_run_dir(tmp_path, cfg, file="a.jsonl.config.json")
    moved = dataclasses.replace(cfg, grm=dataclasses.replace(cfg.grm, urls=("http://elsewhere:1",)), concurrency=2)
    claim_run_dir(tmp_path, moved, file="a.jsonl.config.json")
    other = dataclasses.replace(cfg, grm=dataclasses.replace(cfg.grm, model="judge"), sampling=Sampling(max_tokens=8))
    with pytest.raises(RunDirError, match=r"another config \(grm\.model: 'grm' -> 'judge'; sampling\.max_tokens: 128"):
        asyncio.run(run_job(other, progress=False))
    assert not out.exists()


def test_a_malformed_reply_is_asked_again_once_then_read_as_no_flag(tmp_path):
    engine = suite_lib.expert_engine(SUITE)
    ep = asyncio.run(engine.run(make_tasks(1, start=3)[0], episode_id="e"))
    replies = iter(["I'm sorry for your loss.", "FLAG: true\nHINT: give the agent the archive tool"])
    asked = []

    def first_malformed(request):
        asked.append(request.sampling.temperature)
        return next(replies, "still no verdict")

    with AttributionStore(tmp_path / "a.jsonl") as out:
        asyncio.run(attribute_store([ep], ScriptedBackend(first_malformed), out, concurrency=1, progress=False))
    rows = [r for r in AttributionStore(tmp_path / "a.jsonl").read() if r["status"] != "skipped"]
    assert rows[0]["status"] == "ok" and rows[0]["attempts"] == 2 and rows[0]["attributable"]
    assert asked[:2] == [0.0, 0.7]  # the retry samples, so a greedy GRM can answer otherwise
    assert all(r["status"] == "error" and r["attempts"] == 2 and not r["attributable"] for r in rows[1:])
    assert all(r["detail"].startswith("malformed: ") for r in rows[1:])
