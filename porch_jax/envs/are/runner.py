"""Run scenarios through ARE's GAIA2 runner with our agent (or ARE's oracle) and its judge, offline.

Sources: a directory of GAIA2-format JSON traces (loaded with ARE's GAIA2 loader), and/or ids of
scenarios registered in ARE (its tutorials). GAIA2 traces are judged by ARE's
``GraphPerEventJudge``: offline (``judge="scripted"``) it runs the hard checks (ids, counts, order,
times) plus ARE's scripted checks from ``checks/<scenario_id>.json`` in place of the LLM soft
checks; ``judge="llm"`` uses a judge model behind ``judge_endpoint`` (ARE's LiteLLM engine).
Registered scenarios are judged by their own ``validate``. A run is (scenario, run) pairs, ``concurrency`` at a
time, resumed from ``verdicts.jsonl`` (``run``). Results: a JSON summary, a table by capability, ARE's exported
traces under ``output_dir``, and our episode records (outcome = the verdict) in a trajectory store.

Policies: ``scripted_oracle`` (the scenario's own oracle plan, through our protocol), ``reworded_oracle`` (the
same with every answer to the user reworded: the check that ARE's LLM soft checks reach the judge) or ``llm``: the
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
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import litellm
from are.simulation.agents.are_simulation_agent_config import LLMEngineConfig
from are.simulation.agents.llm.litellm.litellm_engine import LiteLLMEngine, LiteLLMModelConfig
from are.simulation.benchmark.scenario_loader import find_scenario_paths, load_scenario
from are.simulation.multi_scenario_runner import process_scenario
from are.simulation.scenarios.config import MAX_SCENARIO_DURATION, MAX_TIME_SCENARIO_DURATION, MultiScenarioRunnerConfig
from are.simulation.scenarios.scenario_imported_from_json.utils import get_scenario_duration, preprocess_scenario
from are.simulation.scenarios.utils.registry import registry
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
from porch_jax.rollout.pairs import PairOutcome, pair_id, record_tokens, results_by, write_results
from porch_jax.trajectories import EpisodeRecord, Outcome, TrajectoryStore
from porch_jax.trajectories.jsonl import AppendOnlyJsonl
from porch_jax.typed_config import from_dict

POLICIES = ("scripted_oracle", "reworded_oracle", "llm")
REWORDING = "To confirm: "  # reworded_oracle's prefix to each answer
ENDPOINT_ROLES = ("orchestrator", "executor")
CAPABILITIES = ("execution", "search", "adaptability", "time", "ambiguity")  # GAIA2's splits (ARE's CapabilityTag)
HUB_DATASET = "meta-agents-research-environments/gaia2"  # what ARE's `gaia2-run` loads, one config per capability


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
    judge_api_key_env: str = ""  # the variable holding the judge endpoint's key (read at start, never logged)
    judge_max_tokens: int = 256  # per soft check: a small served judge would otherwise run to its context length
    seconds_per_step: float = 2.0
    timeout_s: int = 600
    store: str | None = None
    runs: int = 1  # each scenario N times (the GAIA2 leaderboard runs 3)
    concurrency: int = 1  # (scenario, run) pairs at once, each in its own thread and ARE environment
    # GAIA2 from the hub (needs `datasets` and a reachable hub): a config (a capability, or "mini") and a split, as
    # `gaia2-run` takes them; or hub_rows, a local JSONL file in the hub's row format ({"scenario_id", "data"}).
    hub_config: str = ""
    hub_split: str = "validation"
    hub_rows: str = ""
    limit: int = 0  # at most this many scenarios (0: all)
    # JSON of EngineConfig fields over GAIA2's defaults (typed_config.from_dict with a base), e.g.
    # '{"max_decisions": 4, "budgets": {"total_steps": 8}, "orchestrator_sampling": {"max_tokens": 96}}':
    # sampling per role (max tokens, temperature, thinking), evidence kept, context rule, few-shot.
    engine: str = ""


def _offline_engine(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("the offline GAIA2 judge has no LLM: soft checks are replaced by scripted checks")


class CappedJudgeEngine(LiteLLMEngine):
    """ARE's LiteLLM judge engine, its completions capped at ``max_tokens`` (ARE's own sends no cap)."""

    def __init__(self, model_config: LiteLLMModelConfig, max_tokens: int):
        super().__init__(model_config)
        self.max_tokens = max_tokens

    def chat_completion(self, messages: list[dict[str, Any]], stop_sequences=(), **kwargs: Any) -> tuple[str, None]:
        response = litellm.completion(
            model=self.model_config.model_name,
            custom_llm_provider=self.model_config.provider,
            messages=[self._convert_message_to_litellm_format(m) for m in messages],
            api_base=self.model_config.endpoint,
            api_key=self.model_config.api_key,
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        text = (response.choices[0].message.content or "").replace("False", "false").replace("True", "true")
        for stop in stop_sequences:
            text = text.split(stop)[0]
        return text, None


def judge_engine(spec: RunSpec) -> Any:
    """The judge LLM behind ARE's soft checks: ARE's default engine, or a served endpoint with its key's variable."""
    if not spec.judge_endpoint and not spec.judge_api_key_env:
        return create_judge_engine(LLMEngineConfig(model_name=spec.judge_model, provider=spec.judge_provider))
    key = os.environ.get(spec.judge_api_key_env) if spec.judge_api_key_env else None
    if spec.judge_api_key_env and not key:
        raise ValueError(f"judge_api_key_env: ${spec.judge_api_key_env} is not set")
    config = LiteLLMModelConfig(
        model_name=spec.judge_model, provider=spec.judge_provider, endpoint=spec.judge_endpoint or None, api_key=key
    )
    return CappedJudgeEngine(config, spec.judge_max_tokens)


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
            engine=judge_engine(spec),
        )
    raise ValueError(f"judge must be 'scripted' or 'llm', got {spec.judge!r}")


@dataclass(frozen=True)
class ScenarioSource:
    load: Callable[[], Any]  # a fresh copy: each (scenario, run) pair plays its own (apps hold a run's state)
    gaia2: bool  # a GAIA2 trace (judged by ARE's GAIA2 judge); else a registered scenario (its own validate)


def scenario_loaders(spec: RunSpec) -> dict[str, ScenarioSource]:
    """{scenario id: its source} over every source given."""
    loaders: dict[str, ScenarioSource] = {}

    def add(scenario_id: str, load: Callable[[], Any], where: str, gaia2: bool = True) -> None:
        if scenario_id in loaders:
            raise ValueError(f"{where}: scenario id {scenario_id!r} appears twice")
        loaders[scenario_id] = ScenarioSource(load, gaia2)

    def from_json(text: str, where: str) -> Callable[[], Any]:
        def load() -> Any:
            scenario, _ = load_scenario(text, where, False)
            if scenario is None:
                raise ValueError(f"{where}: ARE could not import this GAIA2 scenario (its log says why)")
            return scenario

        return load

    if spec.dataset:
        fs, paths = find_scenario_paths(spec.dataset)
        for path in sorted(paths):
            with fs.open(path, "r") as f:
                load = from_json(f.read(), path)
            add(load().scenario_id, load, path)  # the id is inside the trace
    for n, (scenario_id, text, where) in enumerate(hub_rows(spec)):
        if spec.limit and n >= spec.limit:
            break
        add(scenario_id, from_json(text, where), where)
    for scenario_id in spec.scenarios:
        add(scenario_id, registry.get_scenario(scenario_id), f"ARE's registry: {scenario_id}", gaia2=False)
    if not loaders:
        raise ValueError("no scenarios: give a dataset directory, hub rows or a hub config, and/or registered ids")
    return dict(sorted(loaders.items()))


def hub_rows(spec: RunSpec) -> list[tuple[str, str, str]]:
    """(scenario id, scenario JSON, where) of the GAIA2 rows: a local file in the hub's row format, or the hub."""
    if spec.hub_rows:
        rows = []
        for n, line in enumerate(Path(spec.hub_rows).read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"{spec.hub_rows}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from None
            for field in ("scenario_id", "data"):
                if not isinstance(row.get(field), str) or not row[field]:
                    raise ValueError(f"{where}: a GAIA2 row needs a non-empty string {field!r}")
            rows.append((row["scenario_id"], row["data"], where))
        return rows
    if not spec.hub_config:
        return []
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ValueError(
            f"hub_config={spec.hub_config!r} needs the hub ({HUB_DATASET}) and HF_HUB_OFFLINE=1 is set: "
            "pass --hub_rows FILE (rows in the hub's format) or --dataset DIR instead"
        )
    from datasets import load_dataset  # ARE's own pin; only a hub run needs it

    ds = load_dataset(HUB_DATASET, name=spec.hub_config, split=spec.hub_split, streaming=True)
    return [
        (row["scenario_id"], row["data"], f"{HUB_DATASET}/{spec.hub_config}/{spec.hub_split}#{n}")
        for n, row in enumerate(ds)
        if row.get("scenario_id")
    ]


def prepare(spec: RunSpec, source: ScenarioSource) -> Any:
    """A fresh copy of a scenario made ready as ARE's runner makes it: oracle order, or the judge and the time
    limit; a registered scenario initialized (its own validate judges it)."""
    scenario = source.load()
    if not source.gaia2:
        scenario.initialize()
        return scenario
    if spec.oracle:
        scenario.initialize()
        scenario.patch_oracle_user_message_order()
    else:
        preprocess_scenario(
            scenario,
            judge_config=judge_config(spec, scenario),
            max_scenario_duration=get_scenario_duration(scenario, MAX_TIME_SCENARIO_DURATION, MAX_SCENARIO_DURATION),
        )
    return scenario


def capabilities(spec: RunSpec, scenario: Any) -> list[str]:
    """A scenario's GAIA2 capabilities: its hub config's, else its capability tags (none: "untagged")."""
    if spec.hub_config in CAPABILITIES:
        return [spec.hub_config]
    tags = {str(getattr(t, "value", t)).lower() for t in getattr(scenario, "tags", ()) or ()}
    return sorted(tags & set(CAPABILITIES)) or ["untagged"]


def make_policies(spec: RunSpec):
    """The policy factory for the agent builder: (scenario, adapter) -> (orchestrator, sub-agent). Served
    backends are built per scenario run: concurrent runs each hold their own connections and event loop."""
    if spec.policy in ("scripted_oracle", "reworded_oracle"):
        prefix = REWORDING if spec.policy == "reworded_oracle" else ""

        def scripted(scenario: Any, adapter: AREEnvironment):
            names = {t.name: t._public_name for t in scenario.get_tools()}
            plan = oracle_plan(scenario, adapter.clock.env, names)
            oracle = ScriptedOracle(plan, adapter.tool_names(), answer_prefix=prefix)
            return ScriptedBackend(oracle.orchestrator), ScriptedBackend(oracle.subagent)

        return scripted
    if spec.policy == "llm":
        if not spec.orchestrator.configured:
            raise ValueError("policy 'llm' needs --orchestrator_model (and --orchestrator_urls for a served model)")
        executor = spec.executor if spec.executor.configured else spec.orchestrator
        return lambda scenario, adapter: (spec.orchestrator.backend(), executor.backend())
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
    return from_dict(EngineConfig, changes, path="engine", base=base)


class VerdictLedger(AppendOnlyJsonl):
    """``verdicts.jsonl``: one line per played (scenario, run) pair, the judge's verdict and the pair's episode
    records. A pair is finished when a line for it is not retryable; the trajectory store is rebuilt from these lines
    (so a kill between the two writes loses nothing and duplicates nothing)."""

    writer_name = "another GAIA2 run"

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for lineno, raw in self.raw_lines():
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError as e:
                raise ValueError(f"{self.path}:{lineno}: not a verdict line ({e})") from None
        return out

    def append(self, line: dict[str, Any]) -> None:
        self.write_lines((json.dumps(line) + "\n").encode())


def finished(lines: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{pair id: its finished line}; raises if a pair was finished twice (what resume must never do)."""
    done: dict[str, dict[str, Any]] = {}
    for line in lines:
        if line["retryable"]:
            continue
        if line["pair"] in done:
            raise ValueError(f"pair {line['pair']} has two finished verdicts")
        done[line["pair"]] = line
    return done


def play_pair(spec: RunSpec, builder: PorchAgentBuilder, source: ScenarioSource, run_number: int) -> dict[str, Any]:
    """One (scenario, run) pair through ARE's scenario runner and judge (``process_scenario``, what its
    multi-scenario runner calls per scenario, minus its main-thread signal handlers); the pair's verdict line."""
    scenario = prepare(spec, source)
    scenario.run_number = run_number
    config = MultiScenarioRunnerConfig(
        agent=None if spec.oracle else AGENT_NAME,
        oracle=spec.oracle,
        export=True,
        output_dir=str(Path(spec.output_dir, "are", f"run{run_number}")),
        max_concurrent_scenarios=1,
        timeout_seconds=spec.timeout_s,
        executor_type="thread",
        enable_caching=False,
        log_level="WARNING",
        model=spec.policy,
        model_provider="local",
    )
    Path(config.output_dir).mkdir(parents=True, exist_ok=True)
    r = process_scenario((scenario, None), config, PorchAgentConfigBuilder(), builder)
    records = builder.records.pop(run_key(scenario), [])
    ok = bool(r.success)
    rationale = "" if r.rationale in (None, "None") else r.rationale
    exception = repr(r.exception) if r.exception else ""
    retryable = any(rec.outcome.retryable for rec in records)
    why = rationale or exception or "no reason given"
    for rec in records:
        if not rec.outcome.retryable:
            rec.outcome = Outcome(ok, float(ok), "judge: success" if ok else f"judge: failed; {why}"[:2000])
        rec.meta["are"] = {
            "scenario_id": scenario.scenario_id,
            "run": run_number,
            "nb_turns": getattr(scenario, "nb_turns", 1) or 1,
            "tags": [getattr(t, "value", str(t)) for t in scenario.tags],
        }
    return {
        "pair": pair_id(scenario.scenario_id, run_number),
        "scenario_id": scenario.scenario_id,
        "run": run_number,
        "success": ok and not retryable,
        "retryable": retryable,
        "rationale": rationale,
        "exception": exception,
        "capabilities": capabilities(spec, scenario),
        "turns": len(records),
        "tokens": sum(record_tokens(rec) for rec in records),
        "records": [rec.to_dict() for rec in records],
    }


def bounded(play: Callable[[], dict[str, Any]], timeout_s: float, pair: tuple[str, int]) -> dict[str, Any]:
    """``play()`` within ``timeout_s`` (every wait is bounded); past it the pair is a finished failure, as ARE's
    runner records a scenario past its timeout, and the abandoned thread's late result is dropped."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(play())
        except BaseException as e:  # handed to the caller: a fault of ours stops the run, it is not a verdict
            box.append(e)

    worker = threading.Thread(target=target, daemon=True, name=f"gaia2-{pair[0]}#{pair[1]}")
    worker.start()
    worker.join(timeout_s)
    if box and isinstance(box[0], BaseException):
        raise box[0]
    if box:
        return box[0]
    scenario_id, run_number = pair
    why = f"timed out after {timeout_s:g} s"
    return {
        "pair": pair_id(scenario_id, run_number),
        "scenario_id": scenario_id,
        "run": run_number,
        "success": False,
        "retryable": False,
        "rationale": "",
        "exception": why,
        "capabilities": ["untagged"],
        "turns": 0,
        "tokens": 0,
        "records": [],
    }


def _sync_store(store: TrajectoryStore, lines: Sequence[dict[str, Any]], have: set[str]) -> None:
    """Append the records of finished pairs the store lacks (one batch per pair)."""
    for line in lines:
        if line["retryable"]:
            continue
        records = [EpisodeRecord.from_dict(d) for d in line["records"] if d["episode_id"] not in have]
        if records:
            store.append_many(records)
            have.update(r.episode_id for r in records)


def run(spec: RunSpec) -> dict[str, Any]:
    """Every (scenario, run) pair not finished in ``output_dir/verdicts.jsonl``, ``concurrency`` at a time; then the
    summary of every finished pair (``summary.json``) and the table by capability (``results.json``/``.md``).

    Summary: ``success_rate`` over finished pairs, ``pairs`` {pair id: verdict}, ``scenarios`` {scenario id: the
    verdict of its first run}, ``played`` (pairs this call ran)."""
    if spec.runs < 1 or spec.concurrency < 1:
        raise ValueError(f"runs and concurrency must be >= 1, got runs={spec.runs}, concurrency={spec.concurrency}")
    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    loaders = scenario_loaders(spec)
    builder = PorchAgentBuilder(
        make_policies(spec),
        AgentSettings(engine=system_config(spec.system, engine_config(spec)), seconds_per_step=spec.seconds_per_step),
    )
    ledger = VerdictLedger(out / "verdicts.jsonl")
    store = TrajectoryStore(spec.store) if spec.store and not spec.oracle else None
    have = {r.episode_id for r in store} if store is not None else set()
    lines = ledger.lines()
    done = finished(lines)
    if store is not None:
        _sync_store(store, lines, have)
    todo = [(sid, r) for r in range(1, spec.runs + 1) for sid in loaders if pair_id(sid, r) not in done]
    lock = threading.Lock()

    def one(pair: tuple[str, int]) -> None:
        line = bounded(lambda: play_pair(spec, builder, loaders[pair[0]], pair[1]), spec.timeout_s, pair)
        with lock:  # the verdict (with its records) is durable first, then the store catches up from it
            ledger.append(line)
            if store is not None:
                _sync_store(store, [line], have)
            print(f"[gaia2] {line['pair']}: {'success' if line['success'] else 'failed'}", flush=True)

    with ThreadPoolExecutor(spec.concurrency) as pool:
        for f in [pool.submit(one, p) for p in todo]:
            f.result()
    ledger.close()
    if store is not None:
        store.close()
    return summarize(spec, finished(VerdictLedger(out / "verdicts.jsonl").lines()), played=len(todo))


def summarize(spec: RunSpec, done: dict[str, dict[str, Any]], *, played: int = 0) -> dict[str, Any]:
    pairs = {
        k: {f: v[f] for f in ("success", "rationale", "exception", "turns", "capabilities")} for k, v in done.items()
    }
    first: dict[str, dict[str, Any]] = {}
    for line in sorted(done.values(), key=lambda v: v["run"]):
        first.setdefault(line["scenario_id"], pairs[line["pair"]])
    outcomes = [
        PairOutcome(v["scenario_id"], v["run"], v["success"], v["tokens"], tuple(v["capabilities"]))
        for v in done.values()
    ]
    rows = results_by(outcomes)
    mode = "oracle" if spec.oracle else f"{spec.policy}/{spec.system}"
    write_results(spec.output_dir, rows, {"mode": mode, "runs": spec.runs}, title="GAIA2 capability")
    summary = {
        "success_rate": sum(v["success"] for v in done.values()) / max(1, len(done)),
        "mode": mode,
        "played": played,
        "pairs": pairs,
        "scenarios": dict(sorted(first.items())),
    }
    Path(spec.output_dir, "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


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
