"""Engine configuration: budgets, the system (proactive, lifecycle, ReAct, the multi-agent baselines) and the
ablation switches.

A system is data: the sub-agents' communication actions (``comm``), the harness fields a revise may change and the
orchestrator's action set before and after its first sub-agents ran (``BASELINE_ACTIONS``). The paper's
multi-agent baselines differ from lifecycle re-orchestration only in that action set (sub-agents submit only):
- ``orchestra_o1`` (Orchestra-o1, re-orchestration): ``delegate_all`` writes several subtasks at once; their
  sub-agents run concurrently, each to its end, the results are joined, and the orchestrator may delegate again or
  finish.
- ``skill_mas`` (Skill-MAS / AutoAgents, offline orchestration): the first call writes the whole ``plan`` of agents;
  it runs in order, each agent given the earlier agents' results, and afterwards the orchestrator may only finish:
  the plan never changes once written.
- ``mas2`` (MAS², generate-execute-rectify): as ``skill_mas``, but after each executed plan the orchestrator may
  write a new one (rectify the agent structure with what the last round showed) or finish.
The single-agent systems have no orchestrator: one agent owns the task and the whole budget, with the tools
``SOLO_TOOLS`` names (None: every tool of the environment): ``react`` (ReAct) and ``mini_swe`` (Mini-SWE: bash is
its only tool, the SWE-bench loop of one shell command per step until it submits; it needs an environment with a
``bash`` tool, the SWE-bench one).

Budgets follow the paper: 300 total steps for GAIA/GAIA2 and 500 for SWE-bench, at most 10
sub-agents, a default of 30 (GAIA) / 50 (SWE) steps per sub-agent. A task may carry tighter budgets
of its own (the workplace suite does, so that a mid-run revision costs something); the engine uses
the smaller of the two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Literal

from porch_jax.backends import Sampling
from porch_jax.protocol import (
    COMM_ACTIONS,
    DELEGATE_ALL,
    FINISH,
    FULL_VIEW,
    ORCHESTRATOR_ACTIONS,
    PLAN,
    REVISABLE_FIELDS,
    SUBMIT,
    FeedbackView,
)

CORE_SYSTEMS = ("proactive", "lifecycle", "react")
# Each baseline's orchestrator actions: (before any sub-agent ran, after).
BASELINE_ACTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "orchestra_o1": ((DELEGATE_ALL, FINISH), (DELEGATE_ALL, FINISH)),
    "skill_mas": ((PLAN,), (FINISH,)),
    "mas2": ((PLAN, FINISH), (PLAN, FINISH)),
}
# The single-agent systems' tools (None: every tool of the environment).
SOLO_TOOLS: dict[str, tuple[str, ...] | None] = {"react": None, "mini_swe": ("bash",)}
BASELINES = (*BASELINE_ACTIONS, "mini_swe")
SYSTEMS = CORE_SYSTEMS + BASELINES
# Obs. 10: disable one revision kind; Obs. 11: hide one message field from the orchestrator.
REVISION_ABLATIONS = {"no_task": "subgoal", "no_context": "context", "no_tools": "tools", "no_budget": "budget"}
MESSAGE_ABLATIONS = {"no_status": "status", "no_request": "request", "no_evidence": "evidence"}
ABLATIONS = tuple(REVISION_ABLATIONS) + tuple(MESSAGE_ABLATIONS)


@dataclass(frozen=True)
class Budgets:
    total_steps: int = 300
    max_agents: int = 10
    default_agent_budget: int = 30


BUDGETS = {"gaia": Budgets(300, 10, 30), "gaia2": Budgets(300, 10, 30), "swe": Budgets(500, 10, 50)}


@dataclass(frozen=True)
class EngineConfig:
    system: str = "proactive"
    budgets: Budgets = Budgets()
    revisable: tuple[str, ...] = REVISABLE_FIELDS
    view: FeedbackView = FULL_VIEW
    max_decisions: int = 64  # orchestrator calls per episode, invalid ones included: a loop guard
    # Each evidence line the orchestrator sees is cut to this many characters (None: whole). The paper's Evidence
    # signal carries the key tool outputs; the cap bounds the orchestrator's context on long outputs.
    max_evidence_chars: int | None = 160
    orchestrator_sampling: Sampling = field(default_factory=lambda: Sampling(max_tokens=256))
    subagent_sampling: Sampling = field(default_factory=lambda: Sampling(max_tokens=256))
    # An orchestrator context over the model's length: "observe" records the failed call as an invalid decision
    # (counted as backend_error_kinds.context_length); "drop_oldest" removes the oldest decision and its feedback
    # and asks again (counted as context_compactions), keeping the instructions and the task.
    context_overflow: Literal["observe", "drop_oldest"] = "observe"
    # Few-shot: a worked protocol exchange in each role's system message (a delegation and a finish; a tool call
    # and a submission), for pretrained models that have never seen the protocol; off: zero-shot.
    few_shot: bool = False

    def __post_init__(self) -> None:
        if self.system not in SYSTEMS:
            raise ValueError(f"system must be one of {SYSTEMS}, got {self.system!r}")
        if self.context_overflow not in ("observe", "drop_oldest"):
            raise ValueError(f"context_overflow must be 'observe' or 'drop_oldest', got {self.context_overflow!r}")
        unknown = set(self.revisable) - set(REVISABLE_FIELDS)
        if unknown:
            raise ValueError(f"revisable has unknown fields {sorted(unknown)}; allowed {REVISABLE_FIELDS}")
        if self.max_decisions <= 0:
            raise ValueError(f"max_decisions must be > 0, got {self.max_decisions}")
        if self.max_evidence_chars is not None and self.max_evidence_chars <= 0:
            raise ValueError(f"max_evidence_chars must be > 0 or None (whole), got {self.max_evidence_chars}")

    @property
    def comm(self) -> tuple[str, ...]:
        """The sub-agents' communication actions: lifecycle, ReAct and the baselines' agents can only submit."""
        return COMM_ACTIONS if self.system == "proactive" else (SUBMIT,)

    @property
    def orchestrator_revisable(self) -> tuple[str, ...]:
        return self.revisable if self.system == "proactive" else ()

    def orchestrator_actions(self, started: bool) -> tuple[str, ...]:
        """The orchestrator's action names once sub-agents have (``started``) or have not yet run."""
        before, after = BASELINE_ACTIONS.get(self.system, (ORCHESTRATOR_ACTIONS, ORCHESTRATOR_ACTIONS))
        return after if started else before

    @property
    def prompt_actions(self) -> tuple[str, ...]:
        """Every action the orchestrator may use in an episode: the instructions list these."""
        return tuple(dict.fromkeys(self.orchestrator_actions(False) + self.orchestrator_actions(True)))

    def config_hash(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def system_config(name: str, base: EngineConfig = EngineConfig()) -> EngineConfig:
    """A system (``proactive``, ``lifecycle``, ``react`` or a baseline, ``BASELINES``) or an ablation of proactive (``no_task`` ... ``no_evidence``)."""
    if name in SYSTEMS:
        return dataclasses.replace(base, system=name)
    if name in REVISION_ABLATIONS:
        dropped = REVISION_ABLATIONS[name]
        return dataclasses.replace(base, system="proactive", revisable=tuple(f for f in base.revisable if f != dropped))
    if name in MESSAGE_ABLATIONS:
        return dataclasses.replace(
            base, system="proactive", view=dataclasses.replace(base.view, **{MESSAGE_ABLATIONS[name]: False})
        )
    raise ValueError(f"unknown system {name!r}; use one of {SYSTEMS + ABLATIONS}")
