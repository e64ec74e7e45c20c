"""Run scenarios through ARE's GAIA2 runner with our agent (or ARE's oracle) and its judge, offline.

Sources: a directory of GAIA2-format JSON traces (loaded with ARE's GAIA2 loader), and/or ids of
scenarios registered in ARE (its tutorials). GAIA2 traces are judged by ARE's
``GraphPerEventJudge``: offline (``judge="scripted"``) it runs the hard checks (ids, counts, order,
times) plus ARE's scripted checks from ``checks/<scenario_id>.json`` in place of the LLM soft
checks; ``judge="llm"`` uses a judge model behind ``judge_endpoint`` (ARE's LiteLLM engine).
Registered scenarios are judged by their own ``validate``. Results: a JSON summary, ARE's exported
traces under ``output_dir``, and our episode records (outcome = the verdict) in a trajectory store.

Policies: ``scripted_oracle`` (the scenario's own oracle plan, through our protocol) or ``llm``: the
orchestrator and the sub-agents each on their own endpoint (``--orchestrator_*`` and
``--executor_*`` flags, porch_jax.backends.spec; the executor falls back to the orchestrator's
endpoint when it names no model), with the API key read from the variable each names.

Runs in the ARE venv: ``.venv-are/bin/python -m porch_jax.envs.are.runner --help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from are.simulation.agents.are_simulation_agent_config import LLMEngineConfig
from are.simulation.benchmark.local_loader import local_scenario_iterator
from are.simulation.multi_scenario_runner import MultiScenarioRunner
from are.simulation.scenarios.config import MAX_SCENARIO_DURATION, MAX_TIME_SCENARIO_DURATION, MultiScenarioRunnerConfig
from are.simulation.scenarios.scenario_imported_from_json.utils import get_scenario_duration, preprocess_scenario
from are.simulation.scenarios.utils.registry import registry
from are.simulation.utils.countable_iterator import CountableIterator
from are.simulation.validation.configs import (
    GraphPerEventJudgeConfig,
    ScriptedGraphPerEventJudgeConfig,
    ToolCheckerParam,
    create_judge_engine,
)
from are.simulation.validation.constants import TOOL_ARG_CHECKER_TYPE_REGISTRY, CheckerType, ToolArgCheckerTypeRegistry

from porch_jax.backends import ScriptedBackend
from porch_jax.backends.spec import EndpointSpec, add_endpoint_flags, endpoint_from_flags
from porch_jax.envs.are.agent import AGENT_NAME, AgentSettings, PorchAgentBuilder, PorchAgentConfigBuilder, run_key
from porch_jax.envs.are.env import AREEnvironment
from porch_jax.envs.are.plan import oracle_plan
from porch_jax.envs.are.scripted import ScriptedOracle
from porch_jax.rollout import BUDGETS, EngineConfig, system_config
from porch_jax.rollout.config import replace_nested
from porch_jax.trajectories import EpisodeRecord, Outcome, TrajectoryStore

POLICIES = ("scripted_oracle", "llm")
ENDPOINT_ROLES = ("orchestrator", "executor")


@dataclass(frozen=True)
class RunSpec:
    output_dir: str
    dataset: str | None = None  # directory of GAIA2-format JSON scenarios
    checks: str | None = None  # directory of <scenario_id>.json scripted checks
    scenarios: tuple[str, ...] = ()  # ARE-registered scenario ids
    oracle: bool = False
    policy: str = "scripted_oracle"
    system: str = "proactive"
    orchestrator: EndpointSpec = EndpointSpec()
    executor: EndpointSpec = EndpointSpec()
    judge: str = "scripted"
    judge_model: str = ""
    judge_endpoint: str = ""
    judge_provider: str = "openai"
    seconds_per_step: float = 2.0
    timeout_s: int = 600
    store: str | None = None
    # JSON of EngineConfig fields over GAIA2's defaults (rollout.config.replace_nested), e.g.
    # '{"max_decisions": 4, "budgets": {"total_steps": 8}, "orchestrator_sampling": {"max_tokens": 96}}':
    # sampling per role (max tokens, temperature, thinking), evidence kept, context rule, few-shot.
    engine: str = ""


def _offline_engine(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("the offline GAIA2 judge has no LLM: soft checks are replaced by scripted checks")


def load_checks(directory: str | None, scenario_id: str) -> dict[str, list[ToolCheckerParam]]:
    """ARE scripted checks for one scenario: {oracle event id: [ToolCheckerParam]} (none if no file)."""
    path = Path(directory, f"{scenario_id}.json") if directory else None
    if path is None or not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {
        event_id: [
            ToolCheckerParam(
                arg_name=c["arg_name"],
                checker_type=CheckerType(c["checker_type"]),
                tool_name=c["tool_name"],
                checker_args=c.get("checker_args", {}),
            )
            for c in checks
        ]
        for event_id, checks in raw.items()
    }


def judge_config(spec: RunSpec, scenario: Any) -> GraphPerEventJudgeConfig:
    """The GAIA2 judge for one scenario, with per-tool judges only for the scenario's own apps (ARE
    builds every tool's LLM-checker prompts up front: ~10 s per scenario here for the full registry)."""
    scenario.initialize()
    apps = {app.name for app in scenario.apps or []}
    per_tool = ToolArgCheckerTypeRegistry(
        {k: v for k, v in TOOL_ARG_CHECKER_TYPE_REGISTRY.items() if k.split("__")[0] in apps}
    )
    if spec.judge == "scripted":
        return ScriptedGraphPerEventJudgeConfig(
            engine=_offline_engine,
            per_tool_arg_to_checker_type=per_tool,
            event_id_to_checker_params=load_checks(spec.checks, scenario.scenario_id),
        )
    if spec.judge == "llm":
        return GraphPerEventJudgeConfig(
            per_tool_arg_to_checker_type=per_tool,
            engine=create_judge_engine(
                LLMEngineConfig(
                    model_name=spec.judge_model, provider=spec.judge_provider, endpoint=spec.judge_endpoint or None
                )
            ),
        )
    raise ValueError(f"judge must be 'scripted' or 'llm', got {spec.judge!r}")


def load_scenarios(spec: RunSpec) -> list[Any]:
    """Scenarios ready to run: GAIA2 traces preprocessed as ARE's runner does, then registered ones."""
    scenarios = []
    if spec.dataset:
        for scenario, _ in local_scenario_iterator(spec.dataset):
            if spec.oracle:
                scenario.initialize()
                scenario.patch_oracle_user_message_order()
            else:
                preprocess_scenario(
                    scenario,
                    judge_config=judge_config(spec, scenario),
                    max_scenario_duration=get_scenario_duration(
                        scenario, MAX_TIME_SCENARIO_DURATION, MAX_SCENARIO_DURATION
                    ),
                )
            scenarios.append(scenario)
    for scenario_id in spec.scenarios:
        scenario = registry.get_scenario(scenario_id)()
        scenario.initialize()
        scenarios.append(scenario)
    if not scenarios:
        raise ValueError("no scenarios: give a dataset directory and/or registered scenario ids")
    return sorted(scenarios, key=lambda s: s.scenario_id)


def make_policies(spec: RunSpec):
    """The policy factory for the agent builder: (scenario, adapter) -> (orchestrator, sub-agent)."""
    if spec.policy == "scripted_oracle":

        def scripted(scenario: Any, adapter: AREEnvironment):
            names = {t.name: t._public_name for t in scenario.get_tools()}
            oracle = ScriptedOracle(oracle_plan(scenario, adapter.clock.env, names), adapter.tool_names())
            return ScriptedBackend(oracle.orchestrator), ScriptedBackend(oracle.subagent)

        return scripted
    if spec.policy == "llm":
        if not spec.orchestrator.configured:
            raise ValueError("policy 'llm' needs --orchestrator_model (and --orchestrator_urls for a served model)")
        orchestrator = spec.orchestrator.backend()
        executor = (spec.executor if spec.executor.configured else spec.orchestrator).backend()
        return lambda scenario, adapter: (orchestrator, executor)
    raise ValueError(f"policy must be one of {POLICIES}, got {spec.policy!r}")


def engine_config(spec: RunSpec) -> EngineConfig:
    """GAIA2's budgets with the run's ``engine`` fields over them (a bad key or value raises naming it)."""
    base = EngineConfig(budgets=BUDGETS["gaia2"])
    if not spec.engine:
        return base
    try:
        changes = json.loads(spec.engine)
    except json.JSONDecodeError as e:
        raise ValueError(f"--engine: not JSON ({e})") from None
    if not isinstance(changes, dict):
        raise ValueError(f"--engine: must be a JSON object of EngineConfig fields, got {spec.engine!r}")
    return replace_nested(base, changes)


def run(spec: RunSpec) -> dict[str, Any]:
    """Run every scenario once; returns {"success_rate", "scenarios": {id: verdict}} and writes it."""
    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    scenarios = load_scenarios(spec)
    builder = PorchAgentBuilder(
        make_policies(spec),
        AgentSettings(
            engine=system_config(spec.system, engine_config(spec)),
            seconds_per_step=spec.seconds_per_step,
        ),
    )
    config = MultiScenarioRunnerConfig(
        agent=None if spec.oracle else AGENT_NAME,
        oracle=spec.oracle,
        export=True,
        output_dir=str(out / "are"),
        max_concurrent_scenarios=1,
        timeout_seconds=spec.timeout_s,
        executor_type="thread",
        enable_caching=False,
        log_level="WARNING",
        model=spec.policy,
        model_provider="local",
    )
    runner = MultiScenarioRunner(agent_config_builder=PorchAgentConfigBuilder(), agent_builder=builder)
    pairs = [(s, None) for s in scenarios]
    result = runner.run_with_events(config, CountableIterator(iter(pairs), len(pairs)))
    verdicts = {}
    for (scenario_id, run_number), r in sorted(result.scenario_results.items(), key=lambda kv: kv[0][0]):
        rationale = "" if r.rationale in (None, "None") else r.rationale
        verdicts[scenario_id] = {
            "success": bool(r.success),
            "rationale": rationale,
            "exception": repr(r.exception) if r.exception else "",
            "turns": len(builder.records.get(f"{scenario_id}#{run_number or 1}", [])),
        }
    summary = {
        "success_rate": sum(v["success"] for v in verdicts.values()) / len(verdicts),
        "mode": "oracle" if spec.oracle else f"{spec.policy}/{spec.system}",
        "scenarios": verdicts,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if spec.store and not spec.oracle:
        _store_records(TrajectoryStore(spec.store), scenarios, builder.records, verdicts)
    return summary


def _store_records(
    store: TrajectoryStore,
    scenarios: list[Any],
    records: dict[str, list[EpisodeRecord]],
    verdicts: dict[str, dict[str, Any]],
) -> None:
    """Each turn's episode with the scenario's verdict as its outcome (the judge scores the whole run), except a turn
    cut short because its backend could not answer: it stays retryable (the verdict would judge the outage)."""
    for scenario in scenarios:
        verdict = verdicts.get(scenario.scenario_id, {"success": False, "rationale": "", "exception": "no verdict"})
        ok = verdict["success"]
        why = verdict["rationale"] or verdict["exception"] or "no reason given"
        for r in records.get(run_key(scenario), []):
            if not r.outcome.retryable:
                r.outcome = Outcome(ok, float(ok), "judge: success" if ok else f"judge: failed; {why}"[:2000])
            r.meta["are"] = {
                "scenario_id": scenario.scenario_id,
                "nb_turns": getattr(scenario, "nb_turns", 1) or 1,
                "tags": [getattr(t, "value", str(t)) for t in scenario.tags],
            }
            store.append(r)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = RunSpec(output_dir="")
    for f in dataclasses.fields(RunSpec):
        flag = f"--{f.name}"
        if f.name in ENDPOINT_ROLES:
            add_endpoint_flags(p, f.name)
        elif f.name == "oracle":
            p.add_argument(flag, action="store_true")
        elif f.name == "scenarios":
            p.add_argument(flag, nargs="*", default=[])
        else:
            kind = type(getattr(defaults, f.name)) if getattr(defaults, f.name) is not None else str
            p.add_argument(flag, type=kind, default=getattr(defaults, f.name), required=f.name == "output_dir")
    args = vars(p.parse_args(argv))
    endpoints = {role: endpoint_from_flags(args, role) for role in ENDPOINT_ROLES}
    logging.getLogger().setLevel(logging.WARNING)
    summary = run(RunSpec(**{**args, **endpoints, "scenarios": tuple(args["scenarios"])}))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
