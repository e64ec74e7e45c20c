"""The scripted expert orchestrator for the workplace suite: good, but not perfect, on purpose.

It delegates one clause per sub-agent with the tools, context and budget the clause needs, except:
- random slips at configurable rates on a clause's first delegation (omit a context fact, omit a
  tool, mis-scope the subgoal, under-budget), which imitation learning averages away; and
- systematic blind spots tied to task features, which imitation copies: it does not hand over facts
  found two or more delegations earlier ("handover_2back"), does not grant the archive tool
  ("archive"), and budgets file reads as if the item were on the first pages ("long_file"). By
  default on every such delegation; ``blind_rate`` makes a blind spot act on only a share of them
  (the expert demonstrates the fix on the rest), so that a policy imitating it sometimes makes the
  fix and outcome-weighted training on its own successes has something to reweight.
At run time it reads only what the engine shows it (message fields removed by an ablation are
absent): it checks a request against the quoted evidence and rejects what the evidence does not
support; with no request it falls back on its own planner (blind spots included); with no status
it does not learn what the sub-agent already did (a booking the change made stale). It is
stateless: each call replays the episode from the view, so runs are deterministic and resumable.

It plays every system from the action set the view names: with ``plan`` (Skill-MAS / AutoAgents, MAS²) it writes
one sub-agent per unfinished clause, in order, with what it knows now (the plan's execution hands each agent the
earlier results); with ``delegate_all`` (Orchestra-o1) it delegates at once every unfinished clause whose inputs
are done (the next layer of the clauses' dependencies); with neither, one clause per ``delegate``. A redone clause
carries the lessons its failed sub-agent's feedback taught, so MAS²'s rectified plan differs from the first.

``sees="context"``: the expert writes only what the context it is given shows. Under a context window (the engine
dropping old turns) the view still holds the whole history, but a recorded decision keeps only the window; an
expert copying a fact found outside it (a two-back hand-over) would teach imitation to write facts it cannot see.
So a fact's value, or a booking to cancel, goes into an action only where it appears in the request's messages.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from porch_jax.envs.base import Feedback, OrchestratorView
from porch_jax.envs.workplace.clauses import KIND, parse_clause, parse_facts, work
from porch_jax.envs.workplace.subagent import apply_change, read_notice
from porch_jax.envs.workplace.tasks import WorkplaceTask
from porch_jax.protocol import (
    DELEGATE,
    DELEGATE_ALL,
    PLAN,
    Delegate,
    DelegateAll,
    Finish,
    Harness,
    Message,
    OrchestratorAction,
    Plan,
    RequestTarget,
    Revise,
    Stop,
    render_action,
)

BLIND_SPOTS = ("handover_2back", "archive", "long_file")


@dataclass(frozen=True)
class ExpertConfig:
    p_omit_context: float = 0.1
    p_omit_tool: float = 0.1
    p_misscope: float = 0.1
    p_underbudget: float = 0.1
    blind_spots: tuple[str, ...] = BLIND_SPOTS
    budget_margin: int = 1
    file_budget: int = 4  # the long_file blind spot's budget for any file clause
    # The share of delegations on which a blind spot acts (drawn per task seed, clause and blind spot); on
    # the others the expert gets that part right. 1.0: always blind (imitation never sees the fix). One
    # rate for every blind spot, or a mapping blind spot -> rate (blind spots it leaves out: 1.0).
    blind_rate: float | Mapping[str, float] = 1.0

    def __post_init__(self) -> None:
        unknown = set(self.blind_spots) - set(BLIND_SPOTS)
        rates = self.blind_rate if isinstance(self.blind_rate, Mapping) else {}
        if unknown or set(rates) - set(BLIND_SPOTS):
            raise ValueError(
                f"unknown blind spots {sorted(unknown | (set(rates) - set(BLIND_SPOTS)))}; known: {BLIND_SPOTS}"
            )
        if not all(0.0 <= float(r) <= 1.0 for r in (rates.values() if rates else [self.blind_rate])):
            raise ValueError(f"blind rates must be in [0, 1], got {self.blind_rate}")

    def rate(self, spot: str) -> float:
        if isinstance(self.blind_rate, Mapping):
            return float(self.blind_rate.get(spot, 1.0))
        return float(self.blind_rate)


@dataclass
class _Clause:
    text: str  # the user's current requirement (notifications may change it)
    done: bool = False
    attempts: int = 0
    tools: set[str] = field(default_factory=set)  # lessons learnt from feedback, kept for re-delegation
    context: set[str] = field(default_factory=set)
    budget: int = 0
    cancel: list[str] = field(default_factory=list)  # bookings to cancel first
    clarified: bool = False
    stale: set[str] = field(default_factory=set)  # harness fields a notification outdated for a live agent


@dataclass(frozen=True)
class _Fix:
    subgoal: bool = False
    context: bool = False
    tools: bool = False
    budget: bool = False
    note: str = ""
    reject: bool = False
    give_up: bool = False


@dataclass
class _State:
    clauses: list[_Clause]
    facts: dict[str, str] = field(default_factory=dict)
    agent_clause: dict[int, int] = field(default_factory=dict)
    harness: dict[int, Harness] = field(default_factory=dict)
    live: set[int] = field(default_factory=set)
    used: dict[int, int] = field(default_factory=dict)  # steps each agent has used
    response: tuple[int, _Fix] | None = None  # to the last feedback, when it was a request


def _notices_in(msg: Message) -> list[str]:
    """Notification texts quoted in a message's status or evidence."""
    texts = list(msg.evidence)
    if msg.status:
        texts += re.findall(r"(?:user change|note): (.+?)(?=; done: |; note: |$)", msg.status)
    return texts


class ScriptedExpert:
    """A backend policy: ``ScriptedBackend(ScriptedExpert())``; reads ``request.state`` (OrchestratorView), and with
    ``sees="context"`` limits what it writes to what ``request.messages`` show (module docstring)."""

    def __init__(self, config: ExpertConfig = ExpertConfig(), *, sees: Literal["history", "context"] = "history"):
        if sees not in ("history", "context"):
            raise ValueError(f"sees must be 'history' or 'context', got {sees!r}")
        self.cfg, self.sees = config, sees

    def __call__(self, request: Any) -> str:
        shown = "\n".join(str(m.get("content") or "") for m in request.messages) if self.sees == "context" else None
        return render_action(self.decide(request.state, shown))

    # ---- the decision ------------------------------------------------------------------------
    def decide(self, view: OrchestratorView, shown: str | None = None) -> OrchestratorAction:
        """The next action; with `shown` (the context's text), the facts and bookings it writes are those shown."""
        task: WorkplaceTask = view.task
        st = self._replay(view)
        if shown is not None:
            st.facts = {k: v for k, v in st.facts.items() if v in shown}
            for c in st.clauses:
                c.cancel = [r for r in c.cancel if r in shown]
        if st.response is not None:
            aid, fix = st.response
            if aid in view.live:
                return self._respond(st, aid, fix, view)
        if view.live:  # a paused agent we no longer need
            return Stop(min(view.live), "not needed")
        idx = next((i for i, c in enumerate(st.clauses) if not c.done), None)
        room = view.max_agents - view.agents_used
        if idx is None or room <= 0 or view.steps_left <= 0 or not ({PLAN, DELEGATE_ALL, DELEGATE} & set(view.actions)):
            return Finish(self._answer(task, st))
        if PLAN in view.actions:
            return Plan(tuple(self._harness(view, st, i) for i in self._undone(st)[:room]))
        if DELEGATE_ALL in view.actions:
            return DelegateAll(tuple(self._harness(view, st, i) for i in self._ready(st)[:room]))
        return Delegate(self._harness(view, st, idx))

    def _respond(self, st: _State, aid: int, fix: _Fix, view: OrchestratorView) -> OrchestratorAction:
        if fix.give_up:
            return Stop(aid, "re-delegating")
        if fix.reject:
            return Revise(aid, note=fix.note)
        c, h = st.clauses[st.agent_clause[aid]], st.harness[aid]
        want = {
            "subgoal": fix.subgoal or "subgoal" in c.stale,
            "context": fix.context or "context" in c.stale,
            "tools": fix.tools,
            "budget": fix.budget,
        }
        if any(on and f not in view.revisable for f, on in want.items()):
            return Stop(aid, "re-delegating with a corrected harness")
        changes: dict[str, Any] = {}
        if want["subgoal"]:
            changes["subgoal"] = "; ".join([f"cancel cab {r}" for r in c.cancel] + [c.text])
        if want["context"]:
            changes["context"] = self._fresh(st, tuple(dict.fromkeys(h.context + self._facts(st, c.context))))
        if want["tools"]:
            changes["tools"] = tuple(sorted(set(h.tools) | c.tools))
        # Pay for the communication step, and for the whole new subgoal when it changed.
        need = c.budget if fix.budget else h.budget + 1
        if want["subgoal"]:
            need = max(
                need,
                st.used[aid]
                + sum(work(parse_clause(p)) for p in changes["subgoal"].split("; "))
                + 1
                + self.cfg.budget_margin,
            )
        if fix.budget or "budget" in view.revisable:
            changes["budget"] = max(h.budget, need)
        return Revise(aid, note=fix.note, **changes)

    # ---- replay ------------------------------------------------------------------------------
    def _replay(self, view: OrchestratorView) -> _State:
        task: WorkplaceTask = view.task
        st = _State([_Clause(t) for t in task.clauses])
        for turn in view.turns:
            a, fb = turn.action, turn.feedback
            if isinstance(a, (Revise, Stop)) and st.response is not None and st.response[0] == a.agent_id:
                st.response = None
            if isinstance(a, DelegateAll):
                self._joined(st, a, fb)
            elif isinstance(a, Delegate) and fb.agent_id is not None:
                idx = next(i for i, c in enumerate(st.clauses) if not c.done)
                st.agent_clause[fb.agent_id] = idx
                st.harness[fb.agent_id] = a.harness
                st.clauses[idx].attempts += 1
            elif isinstance(a, Revise) and a.agent_id in st.harness:
                st.harness[a.agent_id] = a.apply(st.harness[a.agent_id])
                st.clauses[st.agent_clause[a.agent_id]].stale.clear()
            elif isinstance(a, Stop):
                st.live.discard(a.agent_id)
            self._feedback(st, fb)
            for text in fb.notifications:
                self._notice(st, text)
        return st

    def _joined(self, st: _State, action: DelegateAll, fb: Feedback) -> None:
        """A plan or a parallel delegation: its clauses are those the expert chose from the same state, and each
        sub-agent's feedback is read as a single delegation's."""
        chosen = self._undone(st) if isinstance(action, Plan) else self._ready(st)
        for idx, h, part in zip(chosen, action.harnesses, fb.parts, strict=False):
            if part.agent_id is None:
                continue
            st.agent_clause[part.agent_id] = idx
            st.harness[part.agent_id] = h
            st.clauses[idx].attempts += 1
        for part in fb.parts:
            self._feedback(st, part)

    @staticmethod
    def _undone(st: _State) -> list[int]:
        return [i for i, c in enumerate(st.clauses) if not c.done]

    def _ready(self, st: _State) -> list[int]:
        """Unfinished clauses whose needed facts come from done clauses (or from none): a parallel wave (never empty
        while a clause is unfinished: the first unfinished one heads it when no clause is ready)."""
        out: list[int] = []
        for i in self._undone(st):
            clause = parse_clause(st.clauses[i].text)
            producers = {self._producer(st, k) for k in (KIND[clause.kind].needs(clause.args) if clause else ())}
            if all(p in (i, len(st.clauses)) or st.clauses[p].done for p in producers):
                out.append(i)
        return out or self._undone(st)[:1]

    def _feedback(self, st: _State, fb: Feedback) -> None:
        aid = fb.agent_id
        if aid is None or aid not in st.agent_clause:
            return
        c = st.clauses[st.agent_clause[aid]]
        msg = fb.message or Message()
        if fb.budget:
            st.harness[aid] = dataclasses.replace(st.harness[aid], budget=fb.budget)
        st.used[aid] = fb.steps_used
        if fb.event in ("revise", "stop"):
            st.live.add(aid)
            st.response = (aid, self._interpret(st, c, fb, msg))
            return
        st.live.discard(aid)
        if fb.event == "submit" and fb.result is not None:
            st.facts.update(parse_facts([fb.result]))
            clause = parse_clause(c.text)
            c.done = clause is not None and KIND[clause.kind].product(clause.args) in st.facts
            for text in _notices_in(msg):
                self._notice(st, text)
        if not c.done and (msg.request is not None or msg.status):
            self._interpret(st, c, fb, msg)  # a partial return or an exhausted budget: learn for the redo

    def _notice(self, st: _State, text: str, only: _Clause | None = None) -> bool:
        """Apply a user change the expert itself reads in ``text``; True if it was relevant."""
        for c in st.clauses:
            clause = parse_clause(c.text)
            ch = read_notice(text, [clause], misread=False) if clause and (only is None or only is c) else None
            if ch is None:
                continue
            if ch.clause is not None:
                self._set_clause(st, c, ch.clause)
            if ch.fact is not None:
                key, st.facts[key] = ch.fact
                for other in st.clauses:
                    parsed = parse_clause(other.text)
                    if parsed and key in KIND[parsed.kind].needs(parsed.args):
                        other.stale.add("context")
                        other.context.add(key)
                        self._redo(st, other)
            return True
        return False

    def _set_clause(self, st: _State, c: _Clause, text: str) -> None:
        """The user now wants ``text`` for clause ``c``; clauses that depend on it follow."""
        texts = apply_change([x.text for x in st.clauses], st.clauses.index(c), text)
        for x, new in zip(st.clauses, texts, strict=False):
            if x.text != new:
                x.text = new
                x.stale.add("subgoal")
                self._redo(st, x)

    @staticmethod
    def _redo(st: _State, c: _Clause) -> None:
        """A done clause whose requirement changed must be done again, undoing its booking first."""
        if not c.done:
            return
        c.done = False
        if parse_clause(c.text).kind == "cab" and "cab booking" in st.facts:
            c.cancel.append(st.facts.pop("cab booking"))

    def _interpret(self, st: _State, c: _Clause, fb: Feedback, msg: Message) -> _Fix:
        """What the visible message asks for, checked against its evidence; lessons go into ``c``."""
        req, status, evidence = msg.request, msg.status or "", msg.evidence
        clause = parse_clause(c.text)
        if fb.event == "stop":
            return _Fix(give_up=True)
        if (req is not None and req.operation == "update") or status.startswith("user change"):
            return self._user_change(st, c, req, status, evidence)
        target = req.target if req is not None else self._target(status)
        if target is RequestTarget.TOOLS:
            lacks = next((m[1] for e in evidence if (m := re.search(r"context lacks '(.+?)'", e))), None)
            if lacks is not None:  # the evidence shows a missing fact, not a missing tool
                c.context.add(lacks)
                return _Fix(context=True, note=f"use the context for {lacks}")
            tool = req.detail if req is not None else None
            if tool is None:
                c.tools |= self._planned_tools(clause)
            elif evidence and not self._supports(tool, clause, evidence):
                return _Fix(reject=True, note=f"{tool} not needed: evidence does not show it")
            else:
                c.tools.add(tool)
            return _Fix(tools=True)
        if target is RequestTarget.CONTEXT:
            if req is not None:
                key: str | None = req.detail
            else:  # the status or the evidence names the missing fact
                m = re.search(r"(?:missing context|context lacks) '(.+?)'", " ".join((status,) + evidence))
                key = m[1] if m else None
            if key is not None:
                c.context.add(key)
            return _Fix(context=True)
        if target is RequestTarget.BUDGET:
            m = re.search(r"\+(\d+)", req.detail) if req is not None else None
            if m:
                c.budget = fb.budget + int(m[1])
            else:
                left = re.search(r"(\d+) tool steps of work left", status)
                c.budget = fb.steps_used + 1 + int(left[1]) + 1 if left else fb.budget + 2
            c.budget = max(c.budget, fb.budget + 1)
            return _Fix(budget=True)
        if target is RequestTarget.TASK:
            c.clarified = True
            return _Fix(subgoal=True, note="subgoal restated")
        return _Fix(note="continue")

    def _user_change(self, st: _State, c: _Clause, req: Any, status: str, evidence: tuple[str, ...]) -> _Fix:
        quoted = [e for e in evidence if read_notice(e, [parse_clause(c.text)], misread=False)]
        if evidence and not quoted:
            return _Fix(reject=True, note="rejected: the notification is about something else")
        before = (c.text, dict(st.facts))
        if quoted or req is None:
            if not any([self._notice(st, t, c) for t in quoted or _notices_in(Message(status))]):
                return _Fix(reject=True, note="rejected: no change to this task")
        elif req.target is RequestTarget.TASK:  # no evidence shown: take the request on trust
            self._set_clause(st, c, req.detail.split("; ")[-1])
        else:
            st.facts.update(parse_facts([req.detail]))
        c.cancel += re.findall(r"booked (R\d+)", status)  # only the status says what was already done
        c.context |= {k for k in st.facts if st.facts.get(k) != before[1].get(k)}
        return _Fix(
            subgoal=c.text != before[0] or bool(c.cancel), context=st.facts != before[1], note="user change applied"
        )

    @staticmethod
    def _target(status: str) -> RequestTarget | None:
        for words, target in (
            (("missing context", "cannot read"), RequestTarget.CONTEXT),
            (("no tool",), RequestTarget.TOOLS),
            (("budget",), RequestTarget.BUDGET),
            (("ambiguous", "seat count", "several", "outside"), RequestTarget.TASK),
        ):
            if any(w in status for w in words):
                return target
        return None

    def _supports(self, tool: str, clause: Any, evidence: tuple[str, ...]) -> bool:
        if tool == "archive" and any(re.search(r"no \d{4} figure on the current page", e) for e in evidence):
            return True
        return clause is not None and tool in self._planned_tools(clause)

    def _planned_tools(self, clause: Any, archive_blind: bool | None = None) -> set[str]:
        """The clause kind's tools, less archive where that blind spot acts: on a delegation the
        caller says (``archive_blind``, drawn per delegation); when answering a request, wherever
        the blind spot is configured."""
        tools = set(KIND[clause.kind].tools) if clause else set()
        blind = "archive" in self.cfg.blind_spots if archive_blind is None else archive_blind
        return tools - {"archive"} if blind else tools

    # ---- delegation --------------------------------------------------------------------------
    def _harness(self, view: OrchestratorView, st: _State, idx: int) -> Harness:
        cfg, c = self.cfg, st.clauses[idx]
        clause = parse_clause(c.text)
        kind = KIND[clause.kind]
        rng = random.Random(f"expert:{view.seed}:{idx}")
        subgoal = c.text
        blind = {spot for spot in cfg.blind_spots if self._blind(view.seed, idx, spot)}
        tools = self._planned_tools(clause, archive_blind="archive" in blind)
        needs = list(kind.needs(clause.args))
        if "handover_2back" in blind:
            needs = [k for k in needs if self._producer(st, k) > idx - 2]
        budget = work(clause) + 1 + cfg.budget_margin
        if "long_file" in blind and clause.kind == "file":
            budget = min(budget, cfg.file_budget)
        if c.attempts == 0:
            omit_ctx, omit_tool, misscope, under = (
                rng.random() < p for p in (cfg.p_omit_context, cfg.p_omit_tool, cfg.p_misscope, cfg.p_underbudget)
            )
            if omit_ctx and needs:
                needs.remove(rng.choice(needs))
            if omit_tool and len(tools) > 0:
                tools.discard(rng.choice(sorted(tools)))
            if misscope and not c.clarified:
                subgoal = self._misscope(clause, c.text)
            if under:
                budget = max(1, budget - 2)
        context = self._fresh(st, self._facts(st, set(needs) | c.context))
        tools |= c.tools
        subgoal = "; ".join([f"cancel cab {r}" for r in c.cancel] + [subgoal])
        budget = max(budget, c.budget) + len(c.cancel)
        return Harness(subgoal, context, tuple(sorted(tools)), max(1, min(budget, view.steps_left)))

    def _blind(self, seed: Any, idx: int, spot: str) -> bool:
        """Whether ``spot`` acts on clause ``idx``'s delegations (an own stream: slips are unchanged)."""
        rate = self.cfg.rate(spot)
        return rate >= 1.0 or (rate > 0.0 and random.Random(f"expert-blind:{seed}:{idx}:{spot}").random() < rate)

    @staticmethod
    def _producer(st: _State, key: str) -> int:
        for i, c in enumerate(st.clauses):
            clause = parse_clause(c.text)
            if clause and KIND[clause.kind].product(clause.args) == key:
                return i
        return len(st.clauses)

    @staticmethod
    def _facts(st: _State, keys: set[str]) -> tuple[str, ...]:
        return tuple(f"{k}: {st.facts[k]}" for k in sorted(keys) if k in st.facts)

    @staticmethod
    def _fresh(st: _State, context: tuple[str, ...]) -> tuple[str, ...]:
        """Context lines with the expert's current value for every key (a user change may update one)."""
        keys = list(dict.fromkeys(line.split(": ", 1)[0] for line in context))
        return tuple(f"{k}: {st.facts[k]}" for k in keys if k in st.facts)

    @staticmethod
    def _misscope(clause: Any, text: str) -> str:
        a = clause.args
        if clause.kind == "phone":
            return f"find phone of {a['person'].split()[0]}"
        if clause.kind == "cab" and "seats" in a:
            return f"book cab to {a['event']}"
        if clause.kind == "mail" and "person" in a:
            return f"find {a['item']} in mail"
        return text

    @staticmethod
    def _answer(task: WorkplaceTask, st: _State) -> str:
        if task.answer_key and task.answer_key in st.facts:
            return f"{task.answer_key}: {st.facts[task.answer_key]}"
        return "done"
