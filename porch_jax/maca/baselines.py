"""MACA's comparison systems, run through the Backend interface (ChatRequest -> ChatResult):
Vanilla, CoT, Self-Consistency (CoT x 5, majority vote), Self-Refine, and the LLM routers of the
paper's Table 11 (no constraint / GraphSpec as a prompt hint / GraphSpec as a hard mask).

Every system returns a `RunResult` whose token cost (prompt + completion over all calls, the paper's
"Avg Cost") is counted by a `CostMeter`. A router decision is invalid when its reply does not name
exactly one action of A = pool + {STOP} (the step is wasted), or names an agent the structural mask H
forbids at that step (H from `policy.structural_mask`). Without the hard mask ("none", "hint") such an
agent still runs, since nothing constrains the router, but the decision counts as invalid; with it
("mask") the router is shown only H's agents and a forbidden choice is rejected.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable, Hashable, Sequence

import jax.numpy as jnp
import numpy as np

from porch_jax.backends import Backend, ChatRequest, CostMeter, MeteredBackend, Sampling
from porch_jax.envs.benchmarks.answers import extract_choice, extract_code, extract_number
from porch_jax.envs.benchmarks.base import Answer, BenchmarkTask
from porch_jax.maca.graphspec import GraphSpec
from porch_jax.maca.orchestrator import STOP, answer, router_prompt
from porch_jax.maca.policy import structural_mask
from porch_jax.maca.pools import AgentPool
from porch_jax.maca.settings import BASELINES

COT_SUFFIX = "\n\nLet's think step by step."
ROUTER_MODES = ("none", "hint", "mask")
ANSWER_SAMPLING = Sampling(max_tokens=1024)
ROUTER_SAMPLING = Sampling(max_tokens=32)
Extract = Callable[[str], Hashable | None]  # what a vote compares in an answer (`vote_key`)


@dataclasses.dataclass(frozen=True)
class RunResult:
    answer: str
    prompt_tokens: int
    completion_tokens: int
    calls: int
    path: tuple[str, ...] = ()  # what a system chose, in order: agents (routers, Puppeteer) or operators (MaAS)
    decisions: int = 0  # router decisions
    invalid_decisions: int = 0

    @property
    def cost(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_answer(self) -> Answer:
        return Answer(self.answer, self.prompt_tokens, self.completion_tokens)


def metered_result(text: str, meter: CostMeter, **extra) -> RunResult:
    """A system's answer `text` with the tokens and calls `meter` counted over all its roles."""
    usage = list(meter.by_role.values())
    return RunResult(
        text,
        sum(u.prompt_tokens for u in usage),
        sum(u.completion_tokens for u in usage),
        sum(u.calls for u in usage),
        **extra,
    )


async def ask(backend: Backend, system: str | None, user: str, *, role: str, sampling: Sampling) -> str:
    """One chat call as `role` (an optional system turn, one user turn); its reply's text."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return (await answer(backend, ChatRequest(messages=messages, sampling=sampling, role=role))).text


def majority(texts: Sequence[str], extract: Extract) -> tuple[str, Hashable | None, int]:
    """The first text whose extracted answer is the most common one, that answer and its count (ties: the
    earliest answer to reach the top count); the first text, None and 0 where nothing extracts."""
    answers = [extract(t) for t in texts]
    votes = collections.Counter(a for a in answers if a is not None)
    if not votes:
        return texts[0], None, 0
    top = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == top)
    return texts[answers.index(winner)], winner, top


def labelled(entries: Sequence[tuple[str, str]]) -> str:
    """(name, text) pairs as one block, each text under its "[name]" line: how agents read each other's answers."""
    return "\n\n".join(f"[{name}]\n{text}" for name, text in entries)


async def vanilla(backend: Backend, prompt: str, *, sampling: Sampling = ANSWER_SAMPLING) -> RunResult:
    """One call, the task prompt as is."""
    meter = CostMeter()
    text = await ask(MeteredBackend(backend, meter), None, prompt, role="solver", sampling=sampling)
    return metered_result(text, meter)


async def cot(backend: Backend, prompt: str, *, sampling: Sampling = ANSWER_SAMPLING) -> RunResult:
    """One call with a chain-of-thought cue."""
    meter = CostMeter()
    text = await ask(MeteredBackend(backend, meter), None, prompt + COT_SUFFIX, role="solver", sampling=sampling)
    return metered_result(text, meter)


async def self_consistency(
    backend: Backend,
    prompt: str,
    extract: Extract,
    *,
    samples: int = 5,
    temperature: float = 0.7,
    max_tokens: int = 1024,
    seed: int = 0,
) -> RunResult:
    """`samples` CoT completions (distinct seeds); returns their `majority`."""
    meter = CostMeter()
    metered = MeteredBackend(backend, meter)
    texts = [
        await ask(
            metered,
            None,
            prompt + COT_SUFFIX,
            role="solver",
            sampling=Sampling(temperature=temperature, max_tokens=max_tokens, seed=seed + i),
        )
        for i in range(samples)
    ]
    return metered_result(majority(texts, extract)[0], meter)


async def self_refine(
    backend: Backend, prompt: str, *, rounds: int = 2, sampling: Sampling = ANSWER_SAMPLING
) -> RunResult:
    """Generate, then up to `rounds` times critique and refine; stops when the critique finds no issue."""
    meter = CostMeter()
    metered = MeteredBackend(backend, meter)
    answer = await ask(metered, None, prompt + COT_SUFFIX, role="solver", sampling=sampling)
    return metered_result(await refine(metered, None, prompt, answer, rounds=rounds, sampling=sampling), meter)


async def refine(
    backend: Backend, system: str | None, prompt: str, draft: str, *, rounds: int, sampling: Sampling
) -> str:
    """Self-Refine's loop on a draft: up to `rounds` times a critique (role "critic") and, unless it finds no
    issue, a rewrite (role "solver"), each call with the system prompt `system` (None: none)."""
    for _ in range(rounds):
        feedback = await ask(
            backend,
            system,
            f"{prompt}\n\nProposed solution:\n{draft}\n\nCritique this solution. If it is correct and complete, "
            "reply exactly 'NO ISSUES'.",
            role="critic",
            sampling=sampling,
        )
        if feedback.strip().upper().startswith("NO ISSUES"):
            break
        draft = await ask(
            backend,
            system,
            f"{prompt}\n\nPrevious solution:\n{draft}\n\nFeedback:\n{feedback}\n\nWrite an improved solution, ending "
            "with the final answer in the same format.",
            role="solver",
            sampling=sampling,
        )
    return draft


def parse_router_choice(text: str, names: Sequence[str]) -> str | None:
    """The single action a router reply names: exact name on the first line, else the only name
    mentioned anywhere; None when it names none or several."""
    options = [*names, STOP]
    first = text.strip().splitlines()[0].strip().strip(".*`'\"") if text.strip() else ""
    exact = [o for o in options if o.lower() == first.lower()]
    if exact:
        return exact[0]
    mentioned = [o for o in options if re.search(rf"\b{re.escape(o)}\b", text, re.IGNORECASE)]
    return mentioned[0] if len(mentioned) == 1 else None


def _graphspec_hint(pool: AgentPool, spec: GraphSpec, prev: int) -> str:
    relevant = ", ".join(
        f"{a.name} ({q:.2f})" for a, q, keep in zip(pool, spec.relevance, spec.retained, strict=False) if keep
    )
    text = f"\nStructural prior (GraphSpec): relevant agents: {relevant}."
    if prev >= 0:
        row = spec.edge_prior[prev]
        likely = [pool.agents[j].name for j in np.argsort(-row)[:3] if spec.retained[j]]
        text += f" Likely next after {pool.agents[prev].name}: {', '.join(likely)}."
    return text + "\n"


async def llm_router(
    backend: Backend,
    prompt: str,
    pool: AgentPool,
    spec: GraphSpec,
    *,
    mode: str = "none",
    max_steps: int = 4,
    edge_threshold: float = 0.0,
    sampling: Sampling = ROUTER_SAMPLING,
    agent_sampling: Sampling = ANSWER_SAMPLING,
) -> RunResult:
    """An LLM (role "router") picks the next agent or STOP; the agent (role "agent") runs with its role
    prompt on the task and the transcript. The answer is the transcript, so the scorer reads the latest
    final answer in it."""
    if mode not in ROUTER_MODES:
        raise ValueError(f"mode must be one of {ROUTER_MODES}, got {mode!r}")
    meter = CostMeter()
    metered = MeteredBackend(backend, meter)
    transcript: list[str] = []
    path: list[str] = []
    prev, invalid, decisions = -1, 0, 0
    for _ in range(max_steps):
        mask = np.asarray(
            structural_mask(
                jnp.asarray(spec.participation),
                jnp.asarray(spec.edge_prior),
                jnp.asarray(prev),
                edge_threshold=edge_threshold,
            )
        )
        shown = mask[:-1] if mode == "mask" else np.ones(len(pool), bool)
        hint = _graphspec_hint(pool, spec, prev) if mode == "hint" else ""
        reply = await ask(
            metered,
            None,
            router_prompt(prompt, pool, shown, "\n\n".join(transcript) if transcript else "(nothing yet)", hint),
            role="router",
            sampling=sampling,
        )
        decisions += 1
        choice = parse_router_choice(reply, pool.names)
        if choice == STOP:
            break
        if choice is None:
            invalid += 1
            continue
        if not mask[pool.index(choice)]:
            invalid += 1
            if mode == "mask":
                continue
        agent = pool.agents[pool.index(choice)]
        context = prompt + ("\n\nWork so far:\n" + "\n\n".join(transcript) if transcript else "")
        output = await ask(metered, agent.prompt, context, role="agent", sampling=agent_sampling)
        transcript.append(f"[{agent.name}]\n{output}")
        path.append(agent.name)
        prev = pool.index(choice)
    return metered_result(
        "\n\n".join(transcript), meter, path=tuple(path), decisions=decisions, invalid_decisions=invalid
    )


def invalid_action_rate(results: Sequence[RunResult]) -> float:
    """Invalid router decisions over all router decisions (Table 11's metric)."""
    decisions = sum(r.decisions for r in results)
    return sum(r.invalid_decisions for r in results) / decisions if decisions else 0.0


def vote_key(task: BenchmarkTask) -> Extract:
    """What Self-Consistency votes on for a task: the number (math), the option letter (QA), or the extracted
    program with surrounding whitespace removed (code: identical programs vote together)."""
    if task.family == "math":
        return lambda text: (lambda x: None if x is None else round(x, 6))(extract_number(text))
    if task.family == "qa":
        return lambda text: extract_choice(text, task.data["n_options"])
    if task.family == "code":
        return lambda text: extract_code(text, task.data.get("entry_point")).strip() or None
    raise ValueError(f"{task.benchmark} {task.task_id}: no answer to vote on for family {task.family!r}")


def extracted(task: BenchmarkTask, text: str) -> str | float | bool | None:
    """What the scorer finds in a final answer, for the records: the number (math), the option letter (QA), True
    where a program is there (code); None where it finds nothing."""
    value = vote_key(task)(text)
    return (value is not None) or None if task.family == "code" else value


async def run_baseline(
    name: str,
    backend: Backend,
    task: BenchmarkTask,
    pool: AgentPool,
    spec: GraphSpec,
    *,
    max_steps: int = 4,
    edge_threshold: float = 0.0,
    sampling: Sampling = ANSWER_SAMPLING,
    seed: int = 0,
) -> RunResult:
    """One of `BASELINES` on one task: the single-model systems answer the prompt; the routers ("router_<mode>")
    route `pool` under the task's GraphSpec `spec` (MACA's, so the hint and the mask are the prior MACA uses)."""
    if name == "vanilla":
        return await vanilla(backend, task.prompt, sampling=sampling)
    if name == "cot":
        return await cot(backend, task.prompt, sampling=sampling)
    if name == "self_consistency":
        return await self_consistency(backend, task.prompt, vote_key(task), max_tokens=sampling.max_tokens, seed=seed)
    if name == "self_refine":
        return await self_refine(backend, task.prompt, sampling=sampling)
    if name.startswith("router_") and name.removeprefix("router_") in ROUTER_MODES:
        router_sampling = dataclasses.replace(ROUTER_SAMPLING, temperature=sampling.temperature)
        return await llm_router(
            backend,
            task.prompt,
            pool,
            spec,
            mode=name.removeprefix("router_"),
            max_steps=max_steps,
            edge_threshold=edge_threshold,
            sampling=router_sampling,
            agent_sampling=sampling,
        )
    raise ValueError(f"unknown baseline {name!r}; choose from {BASELINES}")
