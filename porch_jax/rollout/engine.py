"""The interleaved orchestrator / sub-agent engine (POrchestra), with its baselines and ablations.

Delegate starts a sub-agent; it runs tool steps until it communicates; communication pauses it and
hands control to the orchestrator, which may Revise it (the update record enters its memory and
the same worker resumes with its history), Stop it, Delegate more, or Finish. Lifecycle
re-orchestration is the same loop with submit as the only communication action (the orchestrator
acts only when a sub-agent returns); ReAct is one agent with every tool and the whole budget, Mini-SWE the same
agent with bash as its only tool (rollout/config.py SOLO_TOOLS).
The multi-agent baselines are the lifecycle loop with another orchestrator action set (rollout/config.py):
``delegate_all`` (Orchestra-o1) runs its sub-agents concurrently, each to its end, and joins their feedback into
one; ``plan`` (Skill-MAS / AutoAgents, MAS²) runs its sub-agents one after another, each given the results of
those before it, and joins their feedback the same way. Concurrent sub-agents share the global clock and the total
budget; a notification goes to whichever sub-agent steps first after it arrives, as in the sequential systems.

Every model reply goes through the protocol parser, scripted or not; a reply that does not parse
is an observation to the model and a counted invalid action, never a crash, and so is a backend
failure of the request's own making (a context too long, a bad request). A backend that could not
answer at all (``backends.base.UNAVAILABLE_KINDS``: down, stalled or overloaded past its retries)
ends the episode as a retryable failure instead: the outage is not the policy's doing, so the
record says ``outcome.retryable`` and a resumed run plays the episode again. Time is the global count of sub-agent steps: notifications arrive on it, budgets are
counted on it, and each decision records it, so intervention delay can be measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from porch_jax.backends import Backend, ChatRequest, ChatResult, CostMeter, MeteredBackend
from porch_jax.backends.base import error_kind, unavailable
from porch_jax.envs.base import Environment, Feedback, MemoryItem, OrchestratorView, SubagentView, Turn
from porch_jax.protocol import (
    Delegate,
    DelegateAll,
    Finish,
    Harness,
    Message,
    Plan,
    ProtocolError,
    Revise,
    ReviseRequest,
    Stop,
    StopRequest,
    Submit,
    ToolCall,
    comm_feedback,
    harness_update_text,
    observation_message,
    orchestrator_example,
    orchestrator_system_prompt,
    parse_orchestrator_action,
    parse_subagent_action,
    render_feedback,
    subagent_example,
    subagent_messages,
    subagent_tool_schemas,
    task_message,
    to_call,
    with_example,
)
from porch_jax.rollout.config import SOLO_TOOLS, EngineConfig
from porch_jax.trajectories import DecisionRecord, EpisodeRecord, Outcome, RoleCost, SubStep


@dataclass
class _Agent:
    id: int
    harness: Harness
    memory: list[MemoryItem] = field(default_factory=list)
    chat: list[dict[str, str]] = field(default_factory=list)
    steps_used: int = 0
    paused: bool = False


@dataclass
class _Episode:
    task: Any
    env: Environment
    orchestrator: Backend
    subagent: Backend
    total: int
    max_agents: int
    seed: int
    clock: int = 0
    agents: dict[int, _Agent] = field(default_factory=dict)
    invalid: dict[str, int] = field(default_factory=lambda: {"orchestrator": 0, "subagent": 0})
    backend_errors: dict[str, int] = field(default_factory=lambda: {"orchestrator": 0, "subagent": 0})
    # By kind: backend failures (backends.ERROR_KINDS) and unparseable replies (the ProtocolError's class).
    error_kinds: dict[str, dict[str, int]] = field(default_factory=lambda: {"orchestrator": {}, "subagent": {}})
    invalid_kinds: dict[str, dict[str, int]] = field(default_factory=lambda: {"orchestrator": {}, "subagent": {}})
    compactions: int = 0  # orchestrator contexts shortened to fit the model (EngineConfig.context_overflow)
    last_error_kind: str | None = None

    def count(self, table: dict[str, dict[str, int]], role: str, kind: str) -> None:
        table[role][kind] = table[role].get(kind, 0) + 1

    @property
    def steps_left(self) -> int:
        return max(0, self.total - self.clock)

    @property
    def live(self) -> tuple[int, ...]:
        return tuple(i for i, a in self.agents.items() if a.paused)


class Engine:
    """Runs one episode per ``run`` call; safe to share across concurrent episodes.

    ``env_factory`` makes a fresh environment per episode. Backends are wrapped per episode in a
    cost meter, so the record's cost covers every orchestrator and sub-agent call.
    """

    def __init__(
        self,
        env_factory: Callable[[], Environment],
        orchestrator: Backend,
        subagent: Backend,
        config: EngineConfig = EngineConfig(),
        *,
        system_name: str | None = None,
    ):
        self.env_factory, self.orchestrator, self.subagent, self.cfg = env_factory, orchestrator, subagent, config
        self.system_name = system_name or config.system
        self._hash = config.config_hash()
        self._schemas: dict[tuple[str, ...], list[dict[str, Any]]] = {}

    async def run(self, task: Any, *, seed: int | None = None, episode_id: str | None = None) -> EpisodeRecord:
        env = self.env_factory()
        env.reset(task)
        meter = CostMeter()
        b = self.cfg.budgets
        ep = _Episode(
            task,
            env,
            MeteredBackend(self.orchestrator, meter),
            MeteredBackend(self.subagent, meter),
            min(b.total_steps, getattr(task, "total_budget", None) or b.total_steps),
            min(b.max_agents, getattr(task, "max_agents", None) or b.max_agents),
            getattr(task, "seed", 0) if seed is None else seed,
        )
        try:
            if self.cfg.system in SOLO_TOOLS:
                answer, decisions, ended, extra = await self._react(ep)
            else:
                answer, decisions, ended, extra = await self._orchestrate(ep)
            score = env.score(answer)
            reason = score.reason if ended == "finish" else f"{ended}; {score.reason}"
            outcome = Outcome(score.success, score.score, reason)
        except _Unavailable as e:  # a placeholder record: no decisions, the cause and the counts so far
            answer, decisions, ended, extra = None, [], "backend_unavailable", {}
            outcome = Outcome(False, 0.0, f"backend_unavailable: {e}"[:2000], retryable=True)
        meta = {
            "steps": ep.clock,
            "total_budget": ep.total,
            "agents": len(ep.agents),
            "invalid": ep.invalid,
            "backend_errors": ep.backend_errors,
            "backend_error_kinds": ep.error_kinds,
            "invalid_kinds": ep.invalid_kinds,
            "context_compactions": ep.compactions,
            # what the orchestrator's chat template was rendered with (the thinking switch): training renders the
            # recorded contexts the same way (rows.decisions.decision_prompt)
            "template_kwargs": self.cfg.orchestrator_sampling.template_kwargs,
            "ended": ended,
            "answer": answer,
            "decision_clock": [d.meta["clock"] for d in decisions],
            "deliveries": [dataclasses.asdict(d) for d in env.deliveries()],
            **extra,
        }
        if hasattr(task, "features"):
            meta.update(template=getattr(task, "template", ""), features=list(task.features))
        return EpisodeRecord(
            episode_id=episode_id or f"{self.system_name}/{getattr(task, 'task_id', ep.seed)}",
            task_id=str(getattr(task, "task_id", ep.seed)),
            env=env.name,
            system=self.system_name,
            config_hash=self._hash,
            seed=ep.seed,
            outcome=outcome,
            cost={role: RoleCost(**c) for role, c in meter.to_dict().items()},
            decisions=decisions,
            meta=meta,
        )

    # ---- backend calls -----------------------------------------------------------------------
    async def _chat(self, ep: _Episode, backend: Backend, request: ChatRequest) -> ChatResult | str:
        """The result, or an error string when the backend failed (after its own retries); raises ``_Unavailable``
        when the backend could not answer at all, which ends the episode as retryable."""
        ep.last_error_kind = None
        try:
            return await backend.chat(request)
        except Exception as e:  # a failed call is an observation, not a crash
            ep.backend_errors[request.role] += 1
            ep.last_error_kind = error_kind(e)
            ep.count(ep.error_kinds, request.role, ep.last_error_kind)
            if unavailable(e):
                raise _Unavailable(f"{request.role} call: {type(e).__name__}: {e}") from e
            return f"Error (backend): {type(e).__name__}: {str(e)[:120]}"

    # ---- orchestrated systems ----------------------------------------------------------------
    async def _orchestrate(self, ep: _Episode) -> tuple[str | None, list[DecisionRecord], str, dict[str, Any]]:
        cfg, env = self.cfg, ep.env
        revisable = cfg.orchestrator_revisable
        limits = f"budget {ep.total} steps, {ep.max_agents} agents"
        default = min(cfg.budgets.default_agent_budget, ep.total)
        if getattr(ep.task, "total_budget", None) is None:  # tasks with their own tight budget size each agent
            limits += f", {default} steps per agent by default"
        messages = [
            {
                "role": "system",
                "content": orchestrator_system_prompt(
                    env.tool_names(), revisable=revisable, max_agents=ep.max_agents, actions=cfg.prompt_actions
                ),
            },
            task_message(f"{ep.task.text} ({limits})"),
        ]
        if cfg.few_shot and env.tool_names():
            messages = with_example(messages, orchestrator_example(env.tool_names()[0]))
        decisions: list[DecisionRecord] = []
        turns: list[Turn] = []
        grace = 1  # decisions allowed once the total budget is spent (to finish)
        while len(decisions) < cfg.max_decisions:
            context = list(messages)
            actions = cfg.orchestrator_actions(started=bool(ep.agents))
            view = OrchestratorView(
                ep.task,
                tuple(turns),
                ep.live,
                len(ep.agents),
                ep.max_agents,
                ep.steps_left,
                min(default, ep.steps_left),
                revisable,
                cfg.comm,
                ep.seed,
                actions,
            )
            clock = ep.clock
            result = await self._chat(
                ep, ep.orchestrator, ChatRequest(context, None, cfg.orchestrator_sampling, "orchestrator", view)
            )
            # Over the model's context: drop the oldest decision and its feedback (never the instructions or the
            # task) and ask again, while there is one to drop.
            while (
                ep.last_error_kind == "context_length" and cfg.context_overflow == "drop_oldest" and len(messages) > 2
            ):
                _drop_oldest_turn(messages)
                ep.compactions += 1
                context = list(messages)
                result = await self._chat(
                    ep, ep.orchestrator, ChatRequest(context, None, cfg.orchestrator_sampling, "orchestrator", view)
                )
            text = "" if isinstance(result, str) else result.text  # a failed call produced no text
            action, error = None, None
            if isinstance(result, str):
                error = result
            else:
                try:
                    action = parse_orchestrator_action(
                        text,
                        truncated=result.finish_reason == "length",
                        available_tools=env.tool_names(),
                        agent_ids=ep.live,
                        revisable=revisable,
                        actions=actions,
                    )
                except ProtocolError as e:
                    error = e.observation
                    ep.invalid["orchestrator"] += 1  # unparseable replies only: a failed call is a backend error
                    ep.count(ep.invalid_kinds, "orchestrator", type(e).__name__)
            segment: list[SubStep] = []
            if action is None:
                fb = Feedback("invalid", text=error or "")
            else:
                fb = await self._apply(ep, action, segment)
            notes = tuple(env.poll_notifications(ep.clock)) if not isinstance(action, Finish) else ()
            fb = dataclasses.replace(fb, notifications=notes)
            feedback_text = "\n".join([fb.text] + [f"[notification] {n}" for n in notes])
            decisions.append(
                DecisionRecord(
                    index=len(decisions),
                    context=context,
                    action_text=text,
                    action_token_ids=[] if isinstance(result, str) else list(result.token_ids),
                    action_logprobs=[] if isinstance(result, str) else list(result.logprobs),
                    action=None if action is None else to_call(action),
                    feedback=feedback_text,
                    agent_id=fb.agent_id,
                    segment=segment,
                    parse_error=error,
                    meta={"clock": clock, "event": fb.event},
                    token_source="none" if isinstance(result, str) else result.token_source,
                    prompt_token_ids=[] if isinstance(result, str) else list(result.prompt_token_ids),
                )
            )
            if isinstance(action, Finish):
                return action.answer, decisions, "finish", {}
            turns.append(Turn(action, fb))
            if text:
                messages.append({"role": "assistant", "content": text})
            messages.append(observation_message(feedback_text))
            if ep.steps_left == 0:
                if grace == 0:
                    return None, decisions, "total_budget_exhausted", {}
                grace -= 1
        return None, decisions, "decision_limit", {}

    async def _apply(self, ep: _Episode, action: Any, segment: list[SubStep]) -> Feedback:
        if isinstance(action, Finish):
            return Feedback("finish", text="episode finished")
        if isinstance(action, Stop):
            agent = ep.agents[action.agent_id]
            agent.paused = False
            return Feedback(
                "stopped",
                agent.id,
                steps_used=agent.steps_used,
                budget=agent.harness.budget,
                text=f"[agent {agent.id} stopped]",
            )
        if isinstance(action, DelegateAll):  # Plan included
            return await self._delegate_all(ep, action, segment)
        if isinstance(action, Delegate):
            if len(ep.agents) >= ep.max_agents:
                return Feedback("rejected", text=f"rejected: at most {ep.max_agents} sub-agents")
            if ep.steps_left == 0:
                return Feedback("rejected", text="rejected: total budget exhausted")
            return await self._run_agent(ep, self._spawn(ep, action.harness), segment)
        assert isinstance(action, Revise)
        agent = ep.agents[action.agent_id]
        new = action.apply(agent.harness)
        if new.budget > agent.steps_used + ep.steps_left:
            new = dataclasses.replace(new, budget=agent.steps_used + ep.steps_left)
        update = harness_update_text(agent.harness, new, action.note)
        agent.memory.append(MemoryItem("update", update))
        agent.chat.append(observation_message(update))
        agent.harness, agent.paused = new, False
        return await self._run_agent(ep, agent, segment)

    def _spawn(self, ep: _Episode, harness: Harness) -> _Agent:
        """A new sub-agent with ``harness``, its budget cut to the total steps left."""
        if harness.budget > ep.steps_left:
            harness = dataclasses.replace(harness, budget=ep.steps_left)
        agent = _Agent(len(ep.agents), harness)
        ep.agents[agent.id] = agent
        return agent

    # ---- the baselines' joined delegations ----------------------------------------------------
    async def _delegate_all(self, ep: _Episode, action: DelegateAll, segment: list[SubStep]) -> Feedback:
        """Run every subtask (concurrently for ``delegate_all``, in order for ``plan``) and join their feedback:
        a call that asks for more sub-agents than are left starts none, so the orchestrator can write a smaller one."""
        left = ep.max_agents - len(ep.agents)
        if len(action.harnesses) > left:
            return Feedback("rejected", text=f"rejected: {len(action.harnesses)} subtasks, {left} sub-agents left")
        if ep.steps_left == 0:
            return Feedback("rejected", text="rejected: total budget exhausted")
        run = self._run_plan if isinstance(action, Plan) else self._run_concurrently
        parts = await run(ep, action.harnesses, segment)
        skipped = len(action.harnesses) - len(parts)
        lines = [p.text for p in parts] + (
            [f"[{skipped} subtasks not started: total budget exhausted]"] * (skipped > 0)
        )
        return Feedback("joined", text="\n".join(lines), parts=tuple(parts))

    async def _run_concurrently(
        self, ep: _Episode, harnesses: tuple[Harness, ...], segment: list[SubStep]
    ) -> list[Feedback]:
        """Orchestra-o1: every sub-agent starts at once and runs to its end; they take turns step by step (each step
        yields to the event loop), so scripted backends interleave deterministically and served ones overlap."""
        agents = [self._spawn(ep, h) for h in harnesses]
        tasks = [asyncio.ensure_future(self._run_agent(ep, a, segment, interleave=True)) for a in agents]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:  # one failed (an unavailable backend): the others stop with the episode
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _run_plan(self, ep: _Episode, harnesses: tuple[Harness, ...], segment: list[SubStep]) -> list[Feedback]:
        """An offline plan: the sub-agents run in the written order, each given every result line of those before it
        as context (the plan's shared memory); the subtasks left when the total budget runs out do not start."""
        parts: list[Feedback] = []
        found: list[str] = []
        for h in harnesses:
            if ep.steps_left == 0:
                break
            context = tuple(dict.fromkeys(h.context + tuple(found)))
            fb = await self._run_agent(ep, self._spawn(ep, dataclasses.replace(h, context=context)), segment)
            parts.append(fb)
            found += [line for line in (fb.result or "").splitlines() if line.strip()]
        return parts

    # ---- a sub-agent's execution segment -----------------------------------------------------
    async def _run_agent(
        self, ep: _Episode, agent: _Agent, segment: list[SubStep], solo: bool = False, interleave: bool = False
    ) -> Feedback:
        cfg, env = self.cfg, ep.env
        while True:
            if interleave:
                await asyncio.sleep(0)  # let the other concurrent sub-agents take their step
            h = agent.harness
            if agent.steps_used >= h.budget or ep.steps_left == 0:
                return self._exhausted(
                    ep, agent, "budget_exhausted" if agent.steps_used >= h.budget else "total_budget_exhausted"
                )
            for text in env.poll_notifications(ep.clock):
                agent.memory.append(MemoryItem("notification", text))
                agent.chat.append(observation_message(f"[notification] {text}"))
                segment.append(SubStep(agent.id, h.version, "notification", text))
            view = SubagentView(agent.id, h, agent.steps_used, tuple(agent.memory), cfg.comm, solo, ep.seed)
            messages = subagent_messages(h, agent.chat, comm=cfg.comm)
            if cfg.few_shot and h.tools:
                messages = with_example(messages, subagent_example(*_first_argument(env, h.tools[0])))
            request = ChatRequest(
                messages,
                self._tool_schemas(env, h.tools),
                cfg.subagent_sampling,
                "subagent",
                view,
            )
            result = await self._chat(ep, ep.subagent, request)
            ep.clock += 1
            agent.steps_used += 1
            text = "" if isinstance(result, str) else result.text
            try:
                if isinstance(result, str):
                    raise _BackendFailure(result)
                action = parse_subagent_action(text, h.tools, cfg.comm, truncated=result.finish_reason == "length")
            except (ProtocolError, _BackendFailure) as e:
                ep.invalid["subagent"] += isinstance(e, ProtocolError)
                if isinstance(e, ProtocolError):
                    ep.count(ep.invalid_kinds, "subagent", type(e).__name__)
                obs = e.observation if isinstance(e, ProtocolError) else str(e)
                agent.memory.append(MemoryItem("error", obs))
                agent.chat += ([{"role": "assistant", "content": text}] if text else []) + [observation_message(obs)]
                segment.append(SubStep(agent.id, h.version, "error", text, None, obs))
                continue
            agent.chat.append({"role": "assistant", "content": text})
            if isinstance(action, ToolCall):
                try:
                    out = env.call_tool(agent.id, action.name, action.arguments)
                except Exception as e:  # an environment bug must not end the episode unrecorded
                    out = f"error: tool failed ({type(e).__name__})"
                agent.memory.append(MemoryItem("call", out, action.name, dict(action.arguments)))
                agent.chat.append(observation_message(out, agent.steps_used, h.budget))
                segment.append(SubStep(agent.id, h.version, "tool", text, action.name, out))
                continue
            agent.memory.append(MemoryItem("comm", text, to_call(action)["name"], message=action.message))
            segment.append(SubStep(agent.id, h.version, "comm", text, to_call(action)["name"]))
            agent.paused = isinstance(action, (ReviseRequest, StopRequest))
            shown = self._shown(action.message)
            fb_text = comm_feedback(
                agent.id,
                action,
                version=h.version,
                steps_used=agent.steps_used,
                budget=h.budget,
                view=cfg.view,
                max_evidence_chars=cfg.max_evidence_chars,
            )
            event = {Submit: "submit", ReviseRequest: "revise", StopRequest: "stop"}[type(action)]
            return Feedback(
                event,
                agent.id,
                action.result if isinstance(action, Submit) else None,
                shown,
                agent.steps_used,
                h.budget,
                text=fb_text,
            )

    def _exhausted(self, ep: _Episode, agent: _Agent, event: str) -> Feedback:
        """The structured report of a sub-agent whose budget ran out: a result is never lost."""
        outputs = tuple(m.text for m in agent.memory if m.kind == "call")[-2:]
        msg = Message(f"budget exhausted after {agent.steps_used} steps without a submit", None, outputs)
        agent.paused = False
        text = render_feedback(
            agent.id,
            event,
            message=msg,
            version=agent.harness.version,
            steps_used=agent.steps_used,
            budget=agent.harness.budget,
            view=self.cfg.view,
            max_evidence_chars=self.cfg.max_evidence_chars,
        )
        return Feedback(event, agent.id, None, self._shown(msg), agent.steps_used, agent.harness.budget, text=text)

    def _shown(self, msg: Message) -> Message:
        """The message as the orchestrator sees it under the message ablation."""
        v = self.cfg.view
        return Message(
            msg.status if v.status else None, msg.request if v.request else None, msg.evidence if v.evidence else ()
        )

    def _tool_schemas(self, env: Environment, tools: tuple[str, ...]) -> list[dict[str, Any]]:
        if tools not in self._schemas:
            self._schemas[tools] = subagent_tool_schemas(env.tool_schemas(tools), self.cfg.comm)
        return self._schemas[tools]

    # ---- ReAct, Mini-SWE -----------------------------------------------------------------------
    async def _react(self, ep: _Episode) -> tuple[str | None, list[DecisionRecord], str, dict[str, Any]]:
        tools = SOLO_TOOLS[self.cfg.system] or tuple(ep.env.tool_names())
        missing = [t for t in tools if t not in ep.env.tool_names()]
        if missing:
            raise ValueError(f"{self.cfg.system} needs the tools {missing}; {ep.env.name} has {ep.env.tool_names()}")
        agent = _Agent(0, Harness(ep.task.text, (), tools, ep.total))
        ep.agents[0] = agent
        segment: list[SubStep] = []
        fb = await self._run_agent(ep, agent, segment, solo=True)
        answer = fb.result if fb.event == "submit" else None
        extra = {"segment": [dataclasses.asdict(s) for s in segment]}
        return answer, [], "finish" if answer is not None else fb.event, extra


class _BackendFailure(Exception):
    pass


class _Unavailable(Exception):
    """The backend could not answer a call (``backends.base.unavailable``): the episode ends as retryable."""


def _drop_oldest_turn(messages: list[dict[str, Any]]) -> None:
    """Remove the oldest decision (its reply, if any) and its feedback, which ends the turn, after the system message
    and the task."""
    end = next(i for i in range(2, len(messages)) if messages[i]["role"] == "user")
    del messages[2 : end + 1]


def _first_argument(env: Environment, tool: str) -> tuple[str, str]:
    """(tool, the name of its first parameter) for the few-shot example; "query" when the schema names none."""
    schema = env.tool_schemas((tool,))[0]
    properties = schema.get("function", schema).get("parameters", {}).get("properties", {})
    return tool, next(iter(properties), "query")
