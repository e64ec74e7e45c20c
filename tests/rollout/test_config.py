"""Engine settings as data: partial mappings over an EngineConfig, and the comparison's roles from endpoints."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAIServer, Step, reply_with

from porch_jax.backends import Sampling
from porch_jax.backends.spec import EndpointSpec
from porch_jax.rollout import BUDGETS, EngineConfig
from porch_jax.rollout.compare import ComparisonConfig, run_comparison
from porch_jax.trajectories import TrajectoryStore
from porch_jax.typed_config import ConfigError, from_dict


def test_a_partial_mapping_merges_field_by_field_and_names_an_unknown_key():
    base = EngineConfig(budgets=BUDGETS["gaia2"])
    cfg = from_dict(
        EngineConfig,
        json.loads(
            json.dumps(
                {
                    "budgets": {"total_steps": 8},
                    "orchestrator_sampling": {"max_tokens": 96, "stop": ["</x>"], "thinking": False},
                    "revisable": ["subgoal"],
                    "max_evidence_chars": None,
                }
            )
        ),
        path="engine",
        base=base,
    )
    assert cfg.budgets == BUDGETS["gaia2"].__class__(8, 10, 30)  # the other budget fields are GAIA2's
    assert cfg.orchestrator_sampling == Sampling(max_tokens=96, stop=("</x>",), thinking=False)
    assert cfg.subagent_sampling == base.subagent_sampling and cfg.revisable == ("subgoal",)
    assert cfg.max_evidence_chars is None
    with pytest.raises(ConfigError, match=r"engine\.orchestrator_sampling\.max_tokns: unknown key"):
        from_dict(EngineConfig, {"orchestrator_sampling": {"max_tokns": 3}}, path="engine", base=base)
    with pytest.raises(ConfigError, match="engine.subagent_sampling: max_tokens: must be > 0"):
        from_dict(EngineConfig, {"subagent_sampling": {"max_tokens": 0}}, path="engine", base=base)
    with pytest.raises(ConfigError, match="engine.budgets.total_steps: expected an int"):
        from_dict(EngineConfig, {"budgets": {"total_steps": "8"}}, path="engine", base=base)
    with pytest.raises(ConfigError, match="max_evidence_chars"):
        from_dict(EngineConfig, {"max_evidence_chars": 0}, path="engine", base=base)


def test_the_comparison_plays_a_served_orchestrator_named_by_its_endpoint(tmp_path, monkeypatch):
    """The orchestrator endpoint (a local test server playing a text-only SGLang-style one, its key in a variable) decides;
    the executor stays scripted. Its sampling and evidence settings come from the config's engine section."""
    call = '<tool_call>{"name": "finish", "arguments": {"answer": "x"}}</tool_call>'
    server = FakeOpenAIServer(default=Step(reply=reply_with(call)))
    monkeypatch.setenv("PORCH_TEST_ORCH_KEY", "sk-compare-secret")
    try:
        cfg = ComparisonConfig(
            run_dir=str(tmp_path),
            systems=("proactive",),
            num_tasks=3,
            processes=1,
            engine=EngineConfig(orchestrator_sampling=Sampling(max_tokens=77, thinking=False), max_decisions=2),
            orchestrator=EndpointSpec("policy", (server.url,), "sglang", "PORCH_TEST_ORCH_KEY", timeout_s=5.0),
        )
        rows = run_comparison(cfg)
    finally:
        server.close()
    assert rows[0].n == 3
    assert len(server.requests) == 3  # one finish per episode
    headers, body = server.requests[0]
    assert body["max_tokens"] == 77 and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert headers["Authorization"] == "Bearer sk-compare-secret"
    records = TrajectoryStore(tmp_path / "proactive.jsonl").read()
    assert [d.action["name"] for r in records for d in r.decisions] == ["finish"] * 3
    assert "sk-compare-secret" not in (tmp_path / "proactive.jsonl").read_text()
    assert "sk-compare-secret" not in (tmp_path / "settings.json").read_text()


def test_a_standard_format_server_plays_with_the_default_endpoint_and_its_records_say_re_tokenized(tmp_path):
    """A local test server that speaks only the standard chat-completions format (no token ids, no logprobs, no
    vLLM extras), answering 429 with Retry-After first: the endpoint's default arguments play it."""
    call = '<tool_call>{"name": "finish", "arguments": {"answer": "x"}}</tool_call>'
    server = FakeOpenAIServer([Step(429, headers={"Retry-After": "1"})], default=Step(reply=reply_with(call)))
    try:
        cfg = ComparisonConfig(
            run_dir=str(tmp_path),
            systems=("proactive",),
            num_tasks=1,
            processes=1,
            engine=EngineConfig(max_decisions=2),
            orchestrator=EndpointSpec("policy", (server.url,)),
        )
        rows = run_comparison(cfg)
    finally:
        server.close()
    assert rows[0].n == 1 and len(server.requests) == 2  # the 429, then the answer
    assert not {"return_token_ids", "return_prompt_text", "top_k"} & set(server.requests[1][1])
    (record,) = TrajectoryStore(tmp_path / "proactive.jsonl").read()
    assert [(d.action["name"], d.token_source, d.action_token_ids) for d in record.decisions] == [
        ("finish", "none", [])
    ]
