"""The MACA orchestration rollout (Sec. 2.3): a policy picks the next agent of the pool or STOP, the
structural mask H (Eq. 11) restricts its choice, and the chosen agent runs through a Backend.

A state s_t is (task, agents called so far, remaining token budget). An episode ends at STOP, after
`max_steps` agent calls, or once the spent tokens reach the budget (the call that crosses it still runs
and is paid for in full: the cost of a call is known only after it). The answer is the transcript of
agent outputs, so a benchmark scorer reads the latest final answer in it (as the LLM routers in
`baselines` do). Every step records the prompt and completion tokens its call spent.

Two worlds run through the same loop: `synthetic_world` (the synthetic pool's agents served as a
Backend, success drawn from the pool's known competences) and `benchmark_world` (the pool's role
prompts on any Backend: vLLM, embedded JAX or scripted; success from the benchmark's scorer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import numpy as np

from porch_jax.backends import Backend, BackendError, ChatRequest, ChatResult, Sampling
from porch_jax.envs.benchmarks.base import Benchmark, BenchmarkTask
from porch_jax.maca.graphspec import GraphSpec
from porch_jax.maca.policy import structural_mask
from porch_jax.maca.pools import AgentPool
from porch_jax.maca.settings import Constraint, RolloutConfig
from porch_jax.maca.synthetic import SyntheticPool, SyntheticTask

STOP = "STOP"
AGENT_SAMPLING = Sampling(max_tokens=1024)


@dataclasses.dataclass(frozen=True)
class OrchestrationTask:
    """A task x with its token budget b; `source` is what the judge scores against."""

    task_id: str
    prompt: str
    budget: int
    family: str
    source: Any = None


@dataclasses.dataclass(frozen=True)
class State:
    """s_t = (x, history h_t, budget b_t)."""

    task: OrchestrationTask
    history: tuple[int, ...] = ()
    spent: int = 0

    @property
    def prev(self) -> int:
        """The agent called last, -1 before the first call (the structural mask's row)."""
        return self.history[-1] if self.history else -1

    @property
    def remaining(self) -> int:
        return self.task.budget - self.spent


def render_state(state: State, names: Sequence[str], *, max_task_words: int | None = None) -> str:
    """The compact text an LM policy reads; the action's name follows it as the continuation."""
    words = state.task.prompt.split()
    task = " ".join(words[:max_task_words] if max_task_words else words)
    called = " > ".join(names[i] for i in state.history) or "none"
    return f"Task: {task}\nCalled: {called}\nBudget left: {max(state.remaining, 0)}\nNext:"


def router_prompt(task: str, pool: AgentPool, shown: np.ndarray, so_far: str, hint: str = "") -> str:
    """The LLM router's user turn (Table 11): the task, the agents `shown` (bool [N]) with their descriptions,
    STOP, an optional GraphSpec hint and the work so far; the reply is one agent name or STOP."""
    agents = "\n".join(f"- {a.name}: {a.description}" for a, s in zip(pool, shown, strict=False) if s)
    return (
        f"Task:\n{task}\n\nAgents you can call:\n{agents}\n- {STOP}: end; the latest answer is final.\n{hint}\n"
        f"Work so far:\n{so_far}\n\nReply with exactly one agent name, or {STOP}."
    )


def render_router_state(
    state: State, pool: AgentPool, allowed: np.ndarray, *, max_task_words: int | None = None
) -> str:
    """A state as the router prompt a pretrained instruction LM reads: the task (its first `max_task_words`
    words), the agents Eq. 11's H allows (`allowed`: bool [N + 1], STOP last and always listed), the agents called
    so far in order and the budget left."""
    words = state.task.prompt.split()
    task = " ".join(words[:max_task_words] if max_task_words else words)
    called = "\n".join(f"{k}. {pool.agents[i].name}" for k, i in enumerate(state.history, 1)) or "(nothing yet)"
    so_far = f"{called}\nBudget left: {max(state.remaining, 0)} tokens"
    return router_prompt(task, pool, np.asarray(allowed)[: len(pool)], so_far)


@dataclasses.dataclass(frozen=True)
class Step:
    """One decision: the state, the allowed set H (bool [A]), the rollout policy's log-probs [A], the
    action (N = STOP) and the tokens its agent call spent (0 for STOP)."""

    state: State
    mask: np.ndarray = dataclasses.field(repr=False)
    log_probs: np.ndarray = dataclasses.field(repr=False)
    action: int = -1
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclasses.dataclass(frozen=True)
class Episode:
    """A finished episode. Reprs stay short: asyncio formats a finished task's result in some paths."""

    task: OrchestrationTask
    steps: tuple[Step, ...] = dataclasses.field(repr=False)
    answer: str = dataclasses.field(repr=False)
    correct: bool = False

    @property
    def path(self) -> tuple[int, ...]:
        """The agents called, in order (STOP excluded)."""
        n = len(self.steps[0].mask) - 1 if self.steps else 0
        return tuple(s.action for s in self.steps if s.action != n)

    @property
    def cost(self) -> int:
        return sum(s.tokens for s in self.steps)


class ActionScorer(Protocol):
    def __call__(self, states: Sequence[State], masks: np.ndarray) -> np.ndarray:
        """log pi(a | s) [B, A] for states with allowed sets masks bool [B, A] (-inf where masked)."""
        ...


class Judge(Protocol):
    def __call__(self, task: OrchestrationTask, path: tuple[int, ...], answer: str, rng: np.random.Generator) -> bool:
        """Whether the episode's answer is correct (R_acc)."""
        ...


@dataclasses.dataclass(frozen=True)
class AgentCall:
    """The typed view of an agent call (`ChatRequest.state`): scripted and synthetic backends read it."""

    task: OrchestrationTask
    history: tuple[int, ...]
    agent: int


@dataclasses.dataclass(frozen=True)
class AgentWorld:
    """Where agents run: the pool, the backend serving them and the judge of a finished episode."""

    pool: AgentPool
    backend: Backend
    judge: Judge
    sampling: Sampling = AGENT_SAMPLING


async def answer(backend: Backend, request: ChatRequest) -> ChatResult:
    """The backend's reply; a prompt over the model's context length is answered with nothing (an empty reply,
    finish_reason "context_length", no tokens spent: the server refused it), so a long transcript ends one agent's
    contribution instead of the run. Every other failure propagates."""
    try:
        return await backend.chat(request)
    except BackendError as e:
        if e.kind != "context_length":
            raise
        return ChatResult(text="", finish_reason="context_length")


async def call_agent(world: AgentWorld, state: State, agent: int, transcript: Sequence[str]) -> ChatResult:
    """Runs `agent` with its role prompt on the task and the work so far (role "agent")."""
    spec = world.pool.agents[agent]
    context = state.task.prompt + ("\n\nWork so far:\n" + "\n\n".join(transcript) if transcript else "")
    messages = [{"role": "system", "content": spec.prompt}, {"role": "user", "content": context}]
    request = ChatRequest(
        messages=messages, sampling=world.sampling, role="agent", state=AgentCall(state.task, state.history, agent)
    )
    return await answer(world.backend, request)


def transcript_entry(world: AgentWorld, agent: int, text: str) -> str:
    return f"[{world.pool.agents[agent].name}]\n{text}"


def bucket(n: int, minimum: int = 8) -> int:
    """The power of two >= n (at least `minimum`): jitted functions see few shapes, so compile few times."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())


def pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """`x` with zero rows appended up to `rows`."""
    out = np.zeros((rows, *x.shape[1:]), x.dtype)
    out[: len(x)] = x
    return out


@functools.partial(jax.jit, static_argnames=("edge_threshold", "conditional"))
def _batched_mask(z, p_prior, prev, edge_threshold: float, conditional: bool = False):
    return jax.vmap(functools.partial(structural_mask, edge_threshold=edge_threshold, conditional=conditional))(
        z, p_prior, prev
    )


def action_masks(
    states: Sequence[State], specs: Sequence[GraphSpec] | None, constraint: Constraint, n_agents: int
) -> np.ndarray:
    """H for each state, bool [B, N + 1] (STOP always allowed); all True without the mask."""
    if not constraint.use_mask or specs is None:
        return np.ones((len(states), n_agents + 1), bool)
    rows = bucket(len(states))
    z = pad_rows(np.stack([s.participation for s in specs]), rows)
    p = pad_rows(np.stack([s.edge_prior for s in specs]), rows)
    prev = pad_rows(np.array([st.prev for st in states], np.int32), rows)
    return np.asarray(_batched_mask(z, p, prev, float(constraint.edge_threshold), bool(constraint.conditional)))[
        : len(states)
    ]


def choose(log_probs: np.ndarray, rng: np.random.Generator, *, greedy: bool) -> np.ndarray:
    """Actions [B]: the mode, or a sample by the Gumbel-max trick (masked actions have -inf)."""
    if greedy:
        return np.argmax(log_probs, axis=-1)
    return np.argmax(log_probs + rng.gumbel(size=log_probs.shape), axis=-1)


async def rollout(
    tasks: Sequence[OrchestrationTask],
    policy: ActionScorer,
    world: AgentWorld,
    specs: Sequence[GraphSpec] | None,
    config: RolloutConfig,
    rng: np.random.Generator,
) -> list[Episode]:
    """Runs one episode per task in lockstep: each round scores every live state in one policy call,
    then runs the chosen agents concurrently. `specs[i]` is task i's GraphSpec (None: no structure)."""
    n = len(world.pool)
    states = [State(t) for t in tasks]
    steps: list[list[Step]] = [[] for _ in tasks]
    transcripts: list[list[str]] = [[] for _ in tasks]
    live = list(range(len(tasks)))
    while live:
        masks = action_masks(
            [states[i] for i in live], None if specs is None else [specs[i] for i in live], config.constraint, n
        )
        log_probs = np.asarray(policy([states[i] for i in live], masks), np.float32)
        actions = choose(log_probs, rng, greedy=config.greedy)
        calls = [(i, int(a)) for i, a in zip(live, actions, strict=False) if a != n]
        results = await asyncio.gather(*(call_agent(world, states[i], a, transcripts[i]) for i, a in calls))
        by_task = dict(zip((i for i, _ in calls), results, strict=False))
        still = []
        for i, mask, lp, a in zip(live, masks, log_probs, actions, strict=False):
            if a == n:
                steps[i].append(Step(states[i], mask, lp, n))
                continue
            r = by_task[i]
            steps[i].append(Step(states[i], mask, lp, int(a), r.prompt_tokens, r.completion_tokens))
            transcripts[i].append(transcript_entry(world, int(a), r.text))
            states[i] = State(
                tasks[i], states[i].history + (int(a),), states[i].spent + r.prompt_tokens + r.completion_tokens
            )
            if len(states[i].history) < config.max_steps and states[i].remaining > 0:
                still.append(i)
        live = still
    return [_finish(world, t, tuple(s), tr, rng) for t, s, tr in zip(tasks, steps, transcripts, strict=False)]


def _finish(
    world: AgentWorld, task: OrchestrationTask, steps: tuple[Step, ...], transcript: list[str], rng: np.random.Generator
) -> Episode:
    episode = Episode(task, steps, "\n\n".join(transcript))
    return dataclasses.replace(episode, correct=bool(world.judge(task, episode.path, episode.answer, rng)))


async def run_path(
    world: AgentWorld, task: OrchestrationTask, path: Sequence[int], rng: np.random.Generator
) -> tuple[bool, int]:
    """Executes a fixed agent sequence (a sampled structure's walk, Algorithm 1 line 4): (correct, tokens)."""
    state, transcript = State(task), []
    for agent in path:
        r = await call_agent(world, state, int(agent), transcript)
        transcript.append(transcript_entry(world, int(agent), r.text))
        state = State(task, state.history + (int(agent),), state.spent + r.prompt_tokens + r.completion_tokens)
    return bool(world.judge(task, tuple(int(a) for a in path), "\n\n".join(transcript), rng)), state.spent


# ---------------------------------------------------------------------------------------------------
# The synthetic world: agents with known competences behind the Backend interface.
# ---------------------------------------------------------------------------------------------------


class SyntheticAgentBackend:
    """Serves the synthetic pool's agents: token counts as `SyntheticPool.run` charges them, for the
    call described by `request.state` (an `AgentCall` on a synthetic task)."""

    def __init__(self, world: SyntheticPool):
        self.world = world

    async def chat(self, request: ChatRequest) -> ChatResult:
        call = request.state
        if not isinstance(call, AgentCall) or not isinstance(call.task.source, SyntheticTask):
            raise TypeError("SyntheticAgentBackend serves only agent calls on synthetic tasks (ChatRequest.state)")
        outcome = self.world.run(call.task.source, (*call.history, call.agent), np.random.default_rng(0))
        name = self.world.pool.agents[call.agent].name
        return ChatResult(
            text=f"{name}: done.",
            prompt_tokens=outcome.prompt_tokens[-1],
            completion_tokens=outcome.completion_tokens[-1],
        )


@dataclasses.dataclass(frozen=True)
class SyntheticJudge:
    """R_acc ~ Bernoulli(p(path)), p from the pool's known competences; `probability` gives p itself."""

    world: SyntheticPool

    def probability(self, task: OrchestrationTask, path: Sequence[int]) -> float:
        return self.world.success_probability(task.source, path)

    def __call__(self, task: OrchestrationTask, path: tuple[int, ...], answer: str, rng: np.random.Generator) -> bool:
        return bool(rng.random() < self.probability(task, path))


def synthetic_world(world: SyntheticPool) -> AgentWorld:
    return AgentWorld(world.pool, SyntheticAgentBackend(world), SyntheticJudge(world))


def synthetic_tasks(tasks: Sequence[SyntheticTask]) -> list[OrchestrationTask]:
    return [OrchestrationTask(t.task_id, t.text, t.budget, t.family, t) for t in tasks]


# ---------------------------------------------------------------------------------------------------
# Benchmarks: the pool's role prompts on a real backend, scored by the benchmark's checker.
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchmarkJudge:
    benchmark: Benchmark

    def __call__(self, task: OrchestrationTask, path: tuple[int, ...], answer: str, rng: np.random.Generator) -> bool:
        return bool(path) and self.benchmark.check(task.source, answer)


def benchmark_world(
    benchmark: Benchmark, pool: AgentPool, backend: Backend, sampling: Sampling = AGENT_SAMPLING
) -> AgentWorld:
    return AgentWorld(pool, backend, BenchmarkJudge(benchmark), sampling)


def benchmark_tasks(tasks: Sequence[BenchmarkTask], budget: int) -> list[OrchestrationTask]:
    return [OrchestrationTask(f"{t.benchmark}/{t.task_id}", t.prompt, budget, t.family, t) for t in tasks]
