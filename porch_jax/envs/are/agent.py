"""Our orchestrator and sub-agents as an ARE agent (``RunnableARESimulationAgent``).

``run_scenario`` runs one engine episode per user turn: it waits (in simulated time) for the user's
message, runs the engine on it with the scenario's apps as tools, sends the orchestrator's final
answer to the user through ARE (which ends the turn and, in GAIA2, lets the judge release the next
one), and repeats for the scenario's ``nb_turns``. Episode records go to the builder's sink; the
runner adds the judge's verdict. ``PorchAgentBuilder``/``PorchAgentConfigBuilder`` plug this agent
into ARE's ``ScenarioRunner`` / ``MultiScenarioRunner`` (the GAIA2 runner) under the name ``porch``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from are.simulation.agents.agent_builder import AbstractAgentBuilder
from are.simulation.agents.agent_config_builder import AbstractAgentConfigBuilder
from are.simulation.agents.agent_execution_result import AgentExecutionResult
from are.simulation.agents.are_simulation_agent import RunnableARESimulationAgent
from are.simulation.agents.are_simulation_agent_config import ARESimulationReactAgentConfig
from are.simulation.apps.agent_user_interface import AgentUserInterface

from porch_jax.backends import Backend
from porch_jax.envs.are.clock import SimClock
from porch_jax.envs.are.env import AREEnvironment, Gaia2Task
from porch_jax.envs.are.scripted import turn_text
from porch_jax.rollout import BUDGETS, Engine, EngineConfig
from porch_jax.trajectories import EpisodeRecord

AGENT_NAME = "porch"
# (scenario, environment adapter) -> (orchestrator backend, sub-agent backend)
PolicyFactory = Callable[[Any, AREEnvironment], tuple[Backend, Backend]]


@dataclass(frozen=True)
class AgentSettings:
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(budgets=BUDGETS["gaia2"]))
    seconds_per_step: float = 2.0  # simulated time one sub-agent step takes
    max_user_wait_s: float = 300.0  # simulated time to wait for the next user message


def run_key(scenario: Any) -> str:
    return f"{scenario.scenario_id}#{getattr(scenario, 'run_number', None) or 1}"


class PorchAREAgent(RunnableARESimulationAgent):
    def __init__(
        self,
        env: Any,
        policies: PolicyFactory,
        settings: AgentSettings,
        sink: Callable[[str, list[EpisodeRecord]], None],
    ):
        self.env, self.policies, self.settings, self.sink = env, policies, settings, sink
        self._stopped = threading.Event()

    def run_scenario(
        self, scenario: Any, notification_system: Any, initial_agent_logs: Any = None
    ) -> AgentExecutionResult:
        for app in scenario.apps or []:
            if isinstance(app, AgentUserInterface):
                app.wait_for_user_response = False  # user messages come as notifications, never as replies
        clock = SimClock(self.env)
        clock.freeze()
        adapter = AREEnvironment(clock, scenario.get_tools(), self.settings.seconds_per_step)
        orchestrator, subagent = self.policies(scenario, adapter)
        records: list[EpisodeRecord] = []
        history: list[tuple[str, str]] = []
        answer = ""
        try:
            for turn in range(getattr(scenario, "nb_turns", None) or 1):
                messages = adapter.wait_for_user(self.settings.max_user_wait_s)
                if not messages or self._stopped.is_set():
                    break
                task = Gaia2Task(
                    f"{scenario.scenario_id}/turn{turn}", turn_text(history, messages), turn, scenario.seed
                )
                engine = Engine(lambda: adapter, orchestrator, subagent, self.settings.engine)
                record = asyncio.run(
                    engine.run(task, episode_id=f"{engine.system_name}/{run_key(scenario)}/turn{turn}")
                )
                records.append(record)
                answer = record.meta.get("answer") or ""
                adapter.send_to_user(answer)
                history.append(("\n".join(messages), answer))
            adapter.drain(self.settings.max_user_wait_s)
        finally:
            clock.release()
            self.sink(run_key(scenario), records)
        return AgentExecutionResult(output=answer, metadata={"turns": len(records)})

    def stop(self) -> None:
        self._stopped.set()


class PorchAgentConfigBuilder(AbstractAgentConfigBuilder):
    def build(self, agent_name: str) -> ARESimulationReactAgentConfig:
        if agent_name != AGENT_NAME:
            raise ValueError(f"agent {agent_name!r} not found; this builder makes {AGENT_NAME!r}")
        return ARESimulationReactAgentConfig(agent_name=agent_name)


class PorchAgentBuilder(AbstractAgentBuilder):
    """Builds one ``PorchAREAgent`` per scenario run and collects their episode records."""

    def __init__(self, policies: PolicyFactory, settings: AgentSettings = AgentSettings()):
        self.policies, self.settings = policies, settings
        self.records: dict[str, list[EpisodeRecord]] = {}
        self._lock = threading.Lock()

    def list_agents(self) -> list[str]:
        return [AGENT_NAME]

    def build(self, agent_config: Any, env: Any = None, mock_responses: list[str] | None = None) -> PorchAREAgent:
        if env is None:
            raise ValueError("the porch agent drives the scenario's environment: pass env")
        return PorchAREAgent(env, self.policies, self.settings, self._store)

    def _store(self, key: str, records: list[EpisodeRecord]) -> None:
        with self._lock:
            self.records[key] = records
