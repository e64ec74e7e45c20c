"""16 workplace episodes through the rollout engine with the orchestrator and the sub-agents both
served by vLLM (no scripted policy anywhere), recorded by the resumable runner.

The tiny model's weights are random, so left alone it never writes a parseable action. vLLM's
structured outputs (``choice``) constrain each role's reply to one valid action text; the model
still samples every token, so the records carry real token ids and logprobs and every turn runs
the full path: chat template with tools, HTTP, protocol parser, engine, environment, store.
"""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from porch_jax.backends import Sampling
from porch_jax.backends.openai_chat import VLLMBackend
from porch_jax.envs.workplace import TOOLS, WorkplaceEnv, make_tasks
from porch_jax.protocol import Delegate, Harness, Message, Submit, render_action
from porch_jax.rollout import Budgets, Engine, EngineConfig, run_episodes, system_config
from porch_jax.rows import decisions as data
from porch_jax.trajectories import TrajectoryStore

pytestmark = pytest.mark.slow

DELEGATE = render_action(Delegate(Harness("Look it up.", (), TOOLS[:1], 1)))
SUBMIT = render_action(Submit("ok", Message(status="done")))


def test_sixteen_workplace_episodes_on_vllm(vllm_server, tmp_path):
    def backend(choice: str) -> VLLMBackend:
        return VLLMBackend(
            vllm_server.base_url,
            vllm_server.model,
            api_key=vllm_server.api_key,
            timeout_s=300.0,
            extra_body={"structured_outputs": {"choice": [choice]}},
        )

    orchestrator, subagent = backend(DELEGATE), backend(SUBMIT)
    sampling = Sampling(temperature=1.0, max_tokens=192)
    config = system_config(
        "proactive",
        EngineConfig(
            budgets=Budgets(8, 3, 1), max_decisions=2, orchestrator_sampling=sampling, subagent_sampling=sampling
        ),
    )
    engine = Engine(WorkplaceEnv, orchestrator, subagent, config)
    tasks = make_tasks(16)

    async def run():
        async with orchestrator, subagent:
            with TrajectoryStore(tmp_path / "episodes.jsonl") as store:
                summary = await run_episodes(
                    tasks, lambda t: engine.run(t, episode_id=t.task_id), store, concurrency=16, progress=False
                )
        return summary

    summary = asyncio.run(run())
    print(f"16 episodes on vLLM in {summary.wall_s:.1f} s")

    records = TrajectoryStore(tmp_path / "episodes.jsonl").read()
    assert summary.completed == len(records) == 16 and summary.errors == 0
    for record in records:
        assert record.meta["backend_errors"] == {"orchestrator": 0, "subagent": 0}
        assert record.meta["invalid"] == {"orchestrator": 0, "subagent": 0}
        assert record.cost["orchestrator"].calls == 2 and record.cost["subagent"].calls == 2
        for decision in record.decisions:
            assert decision.action_text == DELEGATE and decision.action["name"] == "delegate"
            assert len(decision.action_token_ids) == len(decision.action_logprobs) > 0
            assert all(lp <= 0.0 for lp in decision.action_logprobs)
            assert [s.kind for s in decision.segment] == ["comm"] and decision.segment[0].text == SUBMIT
    assert orchestrator.retries == subagent.retries == 0
    # The records carry the server's own ids, and our rendering of each context is the prompt vLLM tokenized
    # (its venv has another transformers): decision_prompt raises PromptMismatch otherwise.
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    assert data.token_sources(records) == {"sampler": 0, "server": 32, "none": 0}
    for record in records:
        for decision in record.decisions:
            assert decision.prompt_token_ids
            assert data.decision_prompt(tokenizer, record.episode_id, decision) == decision.prompt_token_ids
