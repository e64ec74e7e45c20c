"""MACA's adaptive multi-agent baselines, the two that learn on the training tasks before they answer: MaAS (Zhang et
al. 2025, an agentic supernet whose controller samples an architecture of operators per query) and Puppeteer (Dang
et al. 2025, a centralized orchestrator that picks the next agent from the evolving state). They run over the same
Backend interface, agent pools and exact response cache as every other system; multi_agent.py builds their
`Query`s and dispatches them by name.

Each learns a linear softmax policy over features of a frozen sentence encoder (the encoder MACA's GraphSpec uses)
by REINFORCE (`reinforce`): the episode reward is the benchmark checker's verdict minus a token cost (beta as MACA's
Eq. 12) and, optionally, a cost per model call; each task's samples share their mean reward as the baseline, so an
update moves probability toward what beat the task's own average. The policy's parameters are data
(`MaasController`, `PuppeteerPolicy`), updated by pure functions in numpy: a few hundred episodes of a linear policy
need no accelerator. A run's cost is the sum over its calls (one `MeteredBackend`), as for every system; training
costs are recorded apart, in the training history, not in the tokens per task.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from porch_jax.backends import Backend, CostMeter, MeteredBackend, Sampling
from porch_jax.envs.benchmarks.base import BenchmarkTask
from porch_jax.maca.baselines import (
    ANSWER_SAMPLING,
    COT_SUFFIX,
    Extract,
    RunResult,
    ask,
    labelled,
    majority,
    metered_result,
    refine,
)
from porch_jax.maca.encoder import SentenceEncoder
from porch_jax.maca.pools import Agent, AgentPool
from porch_jax.maca.settings import AdaptiveTraining, MaasConfig
from porch_jax.progress import ProgressLine

Check = Callable[[BenchmarkTask, str], bool]  # the benchmark's checker: is this answer correct?


@dataclasses.dataclass(frozen=True)
class Query:
    """A task as an adaptive system sees it: the agents it runs (MaAS: the team its operators use; Puppeteer: the
    agents it may pick) and what a vote compares in an answer."""

    task: BenchmarkTask
    agents: tuple[Agent, ...]
    extract: Extract


def softmax(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Probabilities over the allowed entries, 0 elsewhere."""
    z = np.where(allowed, logits, -np.inf)
    e = np.exp(z - z.max())
    return e / e.sum()


def one_hot(i: int, n: int) -> np.ndarray:
    out = np.zeros(n)
    out[i] = 1.0
    return out


def choose(probs: np.ndarray, rng: np.random.Generator | None, *, greedy: bool) -> int:
    """The mode (ties: the first), or a draw."""
    return int(np.argmax(probs)) if greedy else int(rng.choice(len(probs), p=probs))


def score(x: np.ndarray, action: int, probs: np.ndarray) -> np.ndarray:
    """d log softmax(x @ W)[action] / dW for a linear softmax policy (masked actions have probability 0 and no
    gradient)."""
    return np.outer(x, one_hot(action, len(probs)) - probs)


# ---------------------------------------------------------------- MaAS

OPERATORS = ("cot", "ensemble", "self_refine", "debate", "early_exit")
EARLY_EXIT = OPERATORS.index("early_exit")


@dataclasses.dataclass(frozen=True, eq=False)
class MaasController:
    """The supernet's query-conditioned distribution: at layer l, a linear softmax over OPERATORS given the
    query's embedding and the previous layer's operator (one-hot, START before the first layer)."""

    weights: np.ndarray  # [layers, dim + len(OPERATORS) + 1, len(OPERATORS)]

    @property
    def layers(self) -> int:
        return self.weights.shape[0]


def maas_controller(dim: int, layers: int) -> MaasController:
    """Zero weights: every operator equally likely at every layer (early exit excepted at the first)."""
    return MaasController(np.zeros((layers, dim + len(OPERATORS) + 1, len(OPERATORS))))


def _layer_input(query: np.ndarray, previous: int) -> np.ndarray:
    return np.concatenate([query, one_hot(previous + 1, len(OPERATORS) + 1)])


def operator_probs(controller: MaasController, query: np.ndarray, layer: int, previous: int = -1) -> np.ndarray:
    """P(operator | query, layer, previous operator; -1: START). The first layer cannot exit: there is no answer
    yet to keep."""
    allowed = np.ones(len(OPERATORS), bool)
    allowed[EARLY_EXIT] = layer > 0
    return softmax(_layer_input(query, previous) @ controller.weights[layer], allowed)


def sample_architecture(
    controller: MaasController, query: np.ndarray, rng: np.random.Generator | None, *, greedy: bool
) -> tuple[int, ...]:
    """One operator a layer, layer by layer, until early exit (kept as the last entry) or the last layer."""
    ops: list[int] = []
    for layer in range(controller.layers):
        ops.append(choose(operator_probs(controller, query, layer, ops[-1] if ops else -1), rng, greedy=greedy))
        if ops[-1] == EARLY_EXIT:
            break
    return tuple(ops)


def architecture_score(controller: MaasController, query: np.ndarray, architecture: Sequence[int]) -> np.ndarray:
    """d log Q(architecture | query) / d weights, the sum of its layers' terms."""
    out = np.zeros_like(controller.weights)
    for layer, op in enumerate(architecture):
        previous = architecture[layer - 1] if layer else -1
        out[layer] = score(_layer_input(query, previous), op, operator_probs(controller, query, layer, previous))
    return out


def _solve_prompt(prompt: str, previous: str | None) -> str:
    if previous is None:
        return prompt + COT_SUFFIX
    return (
        f"{prompt}\n\nA solution from the previous step:\n{previous}\n\nCheck it and write your own solution, "
        "ending with the final answer in the format asked."
    )


async def _solve_all(backend: Backend, query: Query, previous: str | None, sampling: Sampling) -> list[str]:
    context = _solve_prompt(query.task.prompt, previous)
    return list(
        await asyncio.gather(*(ask(backend, a.prompt, context, role="agent", sampling=sampling) for a in query.agents))
    )


async def cot_operator(backend: Backend, query: Query, previous: str | None, sampling: Sampling) -> str:
    """The team's first agent solves step by step (reading the previous layer's solution, where there is one)."""
    context = _solve_prompt(query.task.prompt, previous)
    return await ask(backend, query.agents[0].prompt, context, role="agent", sampling=sampling)


async def ensemble_operator(backend: Backend, query: Query, previous: str | None, sampling: Sampling) -> str:
    """Every agent of the team solves independently; the majority answer."""
    return majority(await _solve_all(backend, query, previous, sampling), query.extract)[0]


async def self_refine_operator(backend: Backend, query: Query, previous: str | None, sampling: Sampling) -> str:
    """The team's first agent drafts (at the first layer) or takes the previous solution, critiques it once and
    rewrites it unless the critique finds no issue."""
    leader, prompt = query.agents[0], query.task.prompt
    draft = previous
    if draft is None:
        draft = await ask(backend, leader.prompt, prompt + COT_SUFFIX, role="agent", sampling=sampling)
    return await refine(backend, leader.prompt, prompt, draft, rounds=1, sampling=sampling)


async def debate_operator(backend: Backend, query: Query, previous: str | None, sampling: Sampling) -> str:
    """Two rounds: the team answers independently, then each agent reads all the answers and revises its own; the
    majority of the second round."""
    first = await _solve_all(backend, query, previous, sampling)
    heard = labelled([(a.name, text) for a, text in zip(query.agents, first, strict=True)])
    context = (
        f"{query.task.prompt}\n\nAnswers of the agents:\n{heard}\n\nDebate them: point out any error, then write "
        "your own solution, ending with the final answer in the format asked."
    )
    second = await asyncio.gather(
        *(ask(backend, a.prompt, context, role="agent", sampling=sampling) for a in query.agents)
    )
    return majority(second, query.extract)[0]


Operator = Callable[[Backend, Query, str | None, Sampling], Awaitable[str]]
OPERATOR_RUNS: dict[str, Operator] = {
    "cot": cot_operator,
    "ensemble": ensemble_operator,
    "self_refine": self_refine_operator,
    "debate": debate_operator,
}


async def run_architecture(
    backend: Backend, query: Query, architecture: Sequence[int], *, sampling: Sampling = ANSWER_SAMPLING
) -> RunResult:
    """Executes the operators in order, each reading the previous one's answer; the last answer is the system's.
    `path`: the architecture's operator names, early exit included where it was chosen."""
    meter = CostMeter()
    metered = MeteredBackend(backend, meter)
    answer: str | None = None
    for op in architecture:
        if op == EARLY_EXIT:
            break
        answer = await OPERATOR_RUNS[OPERATORS[op]](metered, query, answer, sampling)
    return metered_result(answer or "", meter, path=tuple(OPERATORS[op] for op in architecture))


@dataclasses.dataclass(frozen=True, eq=False)
class Episode:
    """One run of an adaptive system: its result and d log pi(its choices) / d weights (REINFORCE's term)."""

    result: RunResult
    score: np.ndarray


async def maas(
    backend: Backend,
    query: Query,
    controller: MaasController,
    encoder: SentenceEncoder,
    *,
    rng: np.random.Generator | None = None,
    greedy: bool = True,
    sampling: Sampling = ANSWER_SAMPLING,
) -> Episode:
    """MaAS on one query: the controller picks an architecture from the query's embedding (the mode, or a sample
    with `rng`), which then runs with the query's team.

    The paper's supernet, as built here (where it leaves a choice open, or a choice does not carry over):
    - operators: CoT, Ensemble (the team's agents solve, majority vote: the paper's Ensemble and Self-Consistency in
      one, since agents answering at temperature 0 through the cache would repeat one sample), Self-Refine (one
      critique round), Debate (two rounds of the team) and Early Exit; ReAct and Testing are left out (these tasks
      give the agents no tools; Testing would run the code sandbox inside an answer);
    - one operator a layer, sampled from a softmax, where the paper may activate several a layer (its
      cumulative-probability threshold over a mixture of experts); `MaasConfig.layers` layers (3 by
      default: with Debate's six calls, at most 18 calls a task); a layer's operator reads the previous layer's
      answer; no exit at the first layer;
    - the controller is linear in the frozen encoder's query embedding and the previous operator (the paper's is a
      small network over query and operator embeddings); it is trained by REINFORCE with each query's mean reward
      as the baseline, on correctness minus beta * tokens (the paper's utility minus lambda * cost, as a
      Monte-Carlo policy gradient);
    - the operators' prompts are fixed (the paper also evolves them by textual gradients);
    - at test time the controller's mode is executed, layer by layer (the paper samples), so runs repeat."""
    x = encoder.encode([query.task.prompt])[0]
    architecture = sample_architecture(controller, x, rng, greedy=greedy)
    result = await run_architecture(backend, query, architecture, sampling=sampling)
    return Episode(result, architecture_score(controller, x, architecture))


# ---------------------------------------------------------------- Puppeteer


@dataclasses.dataclass(frozen=True, eq=False)
class PuppeteerPolicy:
    """pi(next agent or TERMINATE | state): a linear softmax over the pool's agents then TERMINATE (index N),
    on `state_features`."""

    weights: np.ndarray  # [2 * dim + N + 2, N + 1]

    @property
    def agents(self) -> int:
        return self.weights.shape[1] - 1


def puppeteer_policy(dim: int, agents: int) -> PuppeteerPolicy:
    """Zero weights: a uniform choice among the allowed actions."""
    return PuppeteerPolicy(np.zeros((2 * dim + agents + 2, agents + 1)))


def state_features(
    task: np.ndarray, reply: np.ndarray, previous: int, step: int, agents: int, max_steps: int
) -> np.ndarray:
    """The state S_t as the frozen encoder sees it: the task's embedding, the latest reply's (zeros before the
    first), which agent acted last (one-hot, none first) and how far the episode is (t / max_steps)."""
    return np.concatenate([task, reply, one_hot(previous + 1, agents + 1), [step / max_steps]])


async def puppeteer(
    backend: Backend,
    query: Query,
    pool: AgentPool,
    policy: PuppeteerPolicy,
    encoder: SentenceEncoder,
    *,
    max_steps: int,
    rng: np.random.Generator | None = None,
    greedy: bool = True,
    sampling: Sampling = ANSWER_SAMPLING,
) -> Episode:
    """Puppeteer on one query: at each step the policy picks one of the query's agents (pool indices) or
    TERMINATE from the current state; the agent runs with its role prompt on the task and the work so far (the
    request MACA's own agent calls make, so the cache shares them). The episode ends at TERMINATE or after
    `max_steps` agents; the answer is the last agent's reply. `path`: the agents in the order chosen.

    Choices the paper leaves open, or that do not carry over:
    - the state representation is the frozen sentence encoder on the task and the latest reply, with the last
      agent and the step (the paper reads a frozen 70B reward model's hidden state of the whole trajectory);
      the policy head is linear;
    - the agents are the pool's role agents of the task's family and the auxiliary ones, one model behind all
      (the paper's agents pair models with reasoning patterns and tools);
    - TERMINATE is not offered before the first agent, so there is always an answer; the answer is the last
      agent's, not a vote;
    - one agent a step (the paper may also branch into parallel paths);
    - REINFORCE with each task's mean reward as the baseline; the cost is beta * tokens plus, optionally, a
      constant per step (the paper's cost grows with the step, F * log(1 + t / phi));
    - at test time the policy's mode is executed."""
    n = policy.agents
    allowed = np.zeros(n + 1, bool)
    allowed[[pool.index(a.name) for a in query.agents]] = True
    meter = CostMeter()
    metered = MeteredBackend(backend, meter)
    task = encoder.encode([query.task.prompt])[0]
    reply = np.zeros_like(task)
    total = np.zeros_like(policy.weights)
    transcript: list[str] = []
    path: list[str] = []
    last, previous, decisions = "", -1, 0
    for step in range(max_steps):
        x = state_features(task, reply, previous, step, n, max_steps)
        allowed[n] = step > 0
        probs = softmax(x @ policy.weights, allowed)
        action = choose(probs, rng, greedy=greedy)
        total += score(x, action, probs)
        decisions += 1
        if action == n:
            break
        agent = pool.agents[action]
        context = query.task.prompt + ("\n\nWork so far:\n" + "\n\n".join(transcript) if transcript else "")
        last = await ask(metered, agent.prompt, context, role="agent", sampling=sampling)
        transcript.append(f"[{agent.name}]\n{last}")
        path.append(agent.name)
        reply, previous = encoder.encode([last])[0], action
    return Episode(metered_result(last, meter, path=tuple(path), decisions=decisions), total)


# ---------------------------------------------------------------- training

Policy = MaasController | PuppeteerPolicy
Run = Callable[[Policy, Query, np.random.Generator], Awaitable[Episode]]


def reward(config: AdaptiveTraining, correct: bool, result: RunResult) -> float:
    return float(correct) - config.token_cost_weight * result.cost / config.token_unit - config.step_cost * result.calls


def batch(iteration: int, tasks: int, size: int) -> list[int]:
    """An iteration's tasks: the training tasks in turn, `size` at a time (wrapping around; each at most once)."""
    return [(iteration * size + j) % tasks for j in range(min(size, tasks))]


async def reinforce(
    policy: Policy,
    queries: Sequence[Query],
    run: Run,
    check: Check,
    config: AdaptiveTraining,
    *,
    seed: int = 0,
    concurrency: int = 8,
    progress: Callable[[str], None] | None = None,
) -> tuple[Policy, list[dict[str, Any]]]:
    """`config.iterations` REINFORCE updates: each samples `config.samples` episodes of the current policy on each
    of the iteration's tasks (at most `concurrency` at once), scores them with the benchmark's checker and moves the
    weights by learning_rate * mean((reward - the task's mean reward) * score). Episode k of task b in iteration i
    draws from its own generator (seed, i, b, k), so a rerun samples the same episodes whatever order the calls
    finish in, and the response cache replays them. Returns the policy and, per iteration, the number of episodes
    and their mean reward, accuracy, tokens and calls; `progress` gets a line (the last iteration's figures, rate,
    ETA) at most every 30 s and after the last."""
    if not queries:
        return policy, []
    limit = asyncio.Semaphore(concurrency)
    line = None if progress is None else ProgressLine(config.iterations, progress, unit="iterations")

    async def episode(current: Policy, i: int, b: int, k: int) -> tuple[Episode, bool]:
        async with limit:
            done = await run(current, queries[b], np.random.default_rng((seed, i, b, k)))
        return done, await asyncio.to_thread(check, queries[b].task, done.result.answer)

    history = []
    for i in range(config.iterations):
        picked = batch(i, len(queries), config.tasks_per_iteration)
        runs = await asyncio.gather(*(episode(policy, i, b, k) for b in picked for k in range(config.samples)))
        rewards = np.array([reward(config, ok, e.result) for e, ok in runs]).reshape(len(picked), config.samples)
        advantages = (rewards - rewards.mean(axis=1, keepdims=True)).reshape(-1)
        step = sum(a * e.score for a, (e, _) in zip(advantages, runs, strict=True)) / len(runs)
        policy = dataclasses.replace(policy, weights=policy.weights + config.learning_rate * step)
        history.append(
            {
                "iteration": i,
                "episodes": len(runs),
                "reward": float(rewards.mean()),
                "accuracy": float(np.mean([ok for _, ok in runs])),
                "tokens": float(np.mean([e.result.cost for e, _ in runs])),
                "calls": float(np.mean([e.result.calls for e, _ in runs])),
            }
        )
        if line is not None:
            last = history[-1]
            line(
                i + 1,
                f"iteration {i + 1}/{config.iterations}: reward {last['reward']:.3f}, accuracy {last['accuracy']:.2f}, "
                f"{last['tokens']:,.0f} tokens an episode",
            )
    return policy, history


async def train_maas(
    backend: Backend,
    queries: Sequence[Query],
    check: Check,
    encoder: SentenceEncoder,
    config: MaasConfig,
    *,
    sampling: Sampling = ANSWER_SAMPLING,
    seed: int = 0,
    concurrency: int = 8,
    progress: Callable[[str], None] | None = None,
) -> tuple[MaasController, list[dict[str, Any]]]:
    """MaAS's controller trained on `queries` (the training tasks) from the uniform supernet."""

    async def run(controller: Policy, query: Query, rng: np.random.Generator) -> Episode:
        return await maas(backend, query, controller, encoder, rng=rng, greedy=False, sampling=sampling)

    start = maas_controller(encoder.dim, config.layers)
    return await reinforce(start, queries, run, check, config, seed=seed, concurrency=concurrency, progress=progress)


async def train_puppeteer(
    backend: Backend,
    queries: Sequence[Query],
    pool: AgentPool,
    check: Check,
    encoder: SentenceEncoder,
    config: AdaptiveTraining,
    *,
    max_steps: int,
    sampling: Sampling = ANSWER_SAMPLING,
    seed: int = 0,
    concurrency: int = 8,
    progress: Callable[[str], None] | None = None,
) -> tuple[PuppeteerPolicy, list[dict[str, Any]]]:
    """Puppeteer's policy trained on `queries` (the training tasks) from the uniform one."""

    async def run(policy: Policy, query: Query, rng: np.random.Generator) -> Episode:
        return await puppeteer(
            backend, query, pool, policy, encoder, max_steps=max_steps, rng=rng, greedy=False, sampling=sampling
        )

    start = puppeteer_policy(encoder.dim, len(pool))
    return await reinforce(start, queries, run, check, config, seed=seed, concurrency=concurrency, progress=progress)


@dataclasses.dataclass(frozen=True, eq=False)
class Learned:
    """What the adaptive systems learned on the training tasks, with the frozen encoder their features come from
    (None: that system was not trained)."""

    encoder: SentenceEncoder
    maas: MaasController | None = None
    puppeteer: PuppeteerPolicy | None = None
