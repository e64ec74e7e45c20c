"""MACA's multi-agent comparison systems, over the same Backend interface, agent pools and exact response cache as
MACA and the single-model baselines (baselines.py): ComplexCoT (Fu et al. 2023), DyLAN (Liu et al. 2023), MacNet
(Qian et al. 2024), AgentVerse (Chen et al. 2023) and AgentPrune (Zhang et al. 2024); and the adaptive ones that
learn on the training tasks first, MaAS and Puppeteer (adaptive.py: `train_adaptive` trains them, `run_system`
runs what they learned).

The multi-agent systems' agents are the task family's agents of MACA's pool (`team`: the first TEAM_SIZE in pool
order, cycled when the family has fewer; AgentVerse recruits among the family's and the auxiliary agents), each
running with its own role prompt: the systems differ in how agents talk, not in who they are. ComplexCoT is one
model call. Every call goes through one `MeteredBackend`, so a `RunResult`'s cost is the sum over all its calls.
A system that returns more than the answer (DyLAN's importance scores, MacNet's edges, AgentPrune's kept edges)
returns a typed run record holding the `RunResult`; `run_system` is the dispatcher over every name of
`settings.BASELINES`, the single-model ones delegated to `baselines.run_baseline`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable, Sequence

import numpy as np

from porch_jax.backends import Backend, CostMeter, MeteredBackend, Sampling
from porch_jax.backends.cache import scope
from porch_jax.envs.benchmarks.base import BenchmarkTask
from porch_jax.maca.adaptive import Check, Learned, Query, maas, puppeteer, train_maas, train_puppeteer
from porch_jax.maca.baselines import (
    ANSWER_SAMPLING,
    COT_SUFFIX,
    Extract,
    RunResult,
    ask,
    labelled,
    majority,
    metered_result,
    run_baseline,
    vote_key,
)
from porch_jax.maca.encoder import SentenceEncoder
from porch_jax.maca.graphspec import GraphSpec
from porch_jax.maca.pools import Agent, AgentPool
from porch_jax.maca.settings import ADAPTIVE, MULTI_AGENT, AdaptiveTraining, MaasConfig, training_scope

TOPOLOGIES = ("chain", "tree", "mesh")


def team(pool: AgentPool, family: str, size: int) -> tuple[Agent, ...]:
    """`size` agents of `family` in pool order, cycled when the family has fewer."""
    members = [a for a in pool if a.family == family]
    if not members:
        raise ValueError(f"the pool has no {family!r} agents")
    return tuple(members[i % len(members)] for i in range(size))


# ---------------------------------------------------------------- ComplexCoT


@dataclasses.dataclass(frozen=True)
class Exemplar:
    question: str
    rationale: str
    steps: int  # Fu et al.'s complexity: the reasoning steps of the rationale


def lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def exemplar(task: BenchmarkTask) -> Exemplar:
    """A training task as a worked example: its question, the most detailed solution its data holds, then the
    reference answer. Steps: GSM-Hard's program, one per non-empty line (Fu et al. count a rationale's lines);
    SVAMP's equation, one per arithmetic operation; code, the lines of the reference's body. The QA benchmarks hold no
    worked solution: their exemplars are the answer alone, one step each, so ComplexCoT there is plain few-shot
    with the first training tasks."""
    data = task.data
    if task.family == "code":  # the whole function in one fenced block, as the pool's code agents write it
        program = f"{data.get('prompt', '')}{task.reference}"
        return Exemplar(task.prompt, f"```python\n{program.strip()}\n```", lines(task.reference))
    if "code" in data:
        work = str(data["code"]).strip()
        return Exemplar(task.prompt, f"{work}\n{task.reference}", lines(work))
    if "equation" in data:
        equation = str(data["equation"]).strip()
        steps = len(re.findall(r"[\d)]\s*[-+*/](?=\s*[\d(.-])", equation))  # binary operators: after an operand
        return Exemplar(task.prompt, f"Equation: {equation}\n{task.reference}", max(steps, 1))
    return Exemplar(task.prompt, task.reference, 1)


def most_complex(pool: Sequence[Exemplar], k: int) -> tuple[Exemplar, ...]:
    """The `k` exemplars with the most steps (ties: pool order), the selection Fu et al. found best."""
    order = sorted(range(len(pool)), key=lambda i: (-pool[i].steps, i))
    return tuple(pool[i] for i in order[:k])


def complex_cot_prompt(prompt: str, shots: Sequence[Exemplar]) -> str:
    blocks = [f"Question: {e.question}\nAnswer: Let's think step by step.\n{e.rationale}" for e in shots]
    return "\n\n".join([*blocks, f"Question: {prompt}\nAnswer: {COT_SUFFIX.strip()}"])


async def complex_cot(
    backend: Backend, prompt: str, exemplars: Sequence[Exemplar], *, k: int = 4, sampling: Sampling = ANSWER_SAMPLING
) -> RunResult:
    """One call, few-shot with the `k` most complex exemplars of the training split (complexity-based prompting).
    Choices: exemplars come from the held-out task's own benchmark's training tasks, their rationales from the
    dataset's worked solutions (`exemplar`); k = 4 rather than the paper's 8 keeps the prompt within small models'
    context; the paper's complexity-based voting over sampled chains is left out (Self-Consistency covers voting)."""
    meter = CostMeter()
    text = await ask(
        MeteredBackend(backend, meter),
        None,
        complex_cot_prompt(prompt, most_complex(exemplars, k)),
        role="solver",
        sampling=sampling,
    )
    return metered_result(text, meter)


# ---------------------------------------------------------------- DyLAN

RATINGS = re.compile(r"ratings?\s*:\s*([0-9][0-9 ,.;/]*)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class DylanRun:
    result: RunResult
    agents: tuple[str, ...]
    rounds: int  # rounds run before consensus or the limit
    importance: tuple[float, ...]  # per agent, summing to 1

    def ranking(self) -> tuple[str, ...]:
        """Agents by importance, highest first (ties: agent order)."""
        return tuple(self.agents[i] for i in sorted(range(len(self.agents)), key=lambda i: -self.importance[i]))


def parse_ratings(text: str, n: int) -> np.ndarray:
    """The scores (1-5) the last 'Ratings:' line gives the previous round's n answers; uniform where the reply
    gives none or a count other than n, so a rater that ignores the format spreads its weight evenly."""
    found = RATINGS.findall(text)
    scores = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", found[-1])] if found else []
    if len(scores) != n or sum(scores) <= 0:
        return np.ones(n)
    return np.clip(np.asarray(scores), 0.0, 5.0)


def without_ratings(text: str) -> str:
    """The answer part of a reply: what comes before its last 'Ratings:' line, so neither the next round nor the
    answer extraction reads the scores as an answer."""
    found = list(RATINGS.finditer(text))
    return text[: found[-1].start()].rstrip() if found else text


def propagate_importance(ratings: Sequence[np.ndarray], k: int) -> np.ndarray:
    """DyLAN's agent importance: the last round's nodes share weight 1 evenly; each node passes its weight back to
    the previous round's nodes in proportion to its (row-normalised) ratings of them; an agent's importance is the
    weight its nodes collect over all rounds, normalised. ratings[t][i, j]: agent i at round t + 2 rating agent j's
    answer at round t + 1."""
    node = np.full(k, 1.0 / k)
    total = node.copy()
    for rated in reversed(ratings):
        share = rated / rated.sum(axis=1, keepdims=True)
        node = node @ share
        total += node
    return total / total.sum()


def _dylan_prompt(prompt: str, previous: Sequence[tuple[str, str]]) -> str:
    if not previous:
        return prompt + COT_SUFFIX
    return (
        f"{prompt}\n\nAnswers of the previous round:\n{labelled(previous)}\n\nUse them to write your own solution, "
        "ending with the final answer in the format asked. Then, on a last line, rate each previous answer "
        f"1-5 for correctness and helpfulness, in order: 'Ratings: ' then {len(previous)} numbers."
    )


async def dylan(
    backend: Backend,
    prompt: str,
    agents: Sequence[Agent],
    extract: Extract,
    *,
    rounds: int = 3,
    consensus: float = 2 / 3,
    sampling: Sampling = ANSWER_SAMPLING,
) -> DylanRun:
    """A layered network of agents (Liu et al. 2023): round 1 answers the task independently; every later round's
    agents read all of the previous round's answers, answer and rate them. After each round, when at least
    `consensus` of the round's answers agree (extracted by `extract`), the network stops early. The answer is the
    last round's majority. Choices: the network is fully connected between rounds (DyLAN's default before agent
    selection); ratings come in the same reply as the answer (one call per node); the early stop is checked from
    round 1 on; a round's agents are asked concurrently; the importance scores are reported, not used to pick a
    team for later tasks (DyLAN's agent selection runs offline on a training set)."""
    meter = CostMeter()
    metered = MeteredBackend(backend, meter)
    previous: list[tuple[str, str]] = []
    ratings: list[np.ndarray] = []
    texts: list[str] = []
    ran = 0
    for _ in range(rounds):
        ran += 1
        context = _dylan_prompt(prompt, previous)
        replies = await asyncio.gather(
            *(ask(metered, a.prompt, context, role="agent", sampling=sampling) for a in agents)
        )
        if previous:
            ratings.append(np.stack([parse_ratings(x, len(previous)) for x in replies]))
        texts = [without_ratings(x) for x in replies]
        previous = [(a.name, x) for a, x in zip(agents, texts, strict=True)]
        _, _, count = majority(texts, extract)
        if count / len(agents) > consensus - 1e-9:
            break
    text, _, _ = majority(texts, extract)
    importance = propagate_importance(ratings, len(agents))
    return DylanRun(
        metered_result(text, meter), tuple(a.name for a in agents), ran, tuple(float(x) for x in importance)
    )


# ---------------------------------------------------------------- MacNet

Edge = tuple[int, int]


def topology(kind: str, n: int) -> tuple[Edge, ...]:
    """A DAG on nodes 0..n-1 numbered in topological order, its single sink n - 1. chain: i -> i + 1; tree: a
    binary in-tree (leaves first, the root is the sink), node n-1-c feeding node n-1-(c - 1) // 2; mesh: every
    i -> j with i < j."""
    if kind not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {TOPOLOGIES}, got {kind!r}")
    if kind == "chain":
        return tuple((i, i + 1) for i in range(n - 1))
    if kind == "tree":
        return tuple(sorted((n - 1 - c, n - 1 - (c - 1) // 2) for c in range(1, n)))
    return tuple((i, j) for j in range(n) for i in range(j))


@dataclasses.dataclass(frozen=True)
class MacNetRun:
    result: RunResult
    edges: tuple[Edge, ...]
    inputs: tuple[tuple[int, ...], ...]  # per node, the nodes whose answers its prompt held


def _refine_prompt(prompt: str, received: Sequence[tuple[str, str]]) -> str:
    if not received:
        return prompt + COT_SUFFIX
    return (
        f"{prompt}\n\nSolutions from earlier agents:\n{labelled(received)}\n\nReview them and write an improved "
        "solution, ending with the final answer in the format asked."
    )


async def macnet(
    backend: Backend,
    prompt: str,
    agents: Sequence[Agent],
    *,
    kind: str = "chain",
    sampling: Sampling = ANSWER_SAMPLING,
) -> MacNetRun:
    """Agents on a directed acyclic graph (Qian et al. 2024), one agent a node: a source node solves the task; every
    other node reads only its predecessors' answers, along its in-edges, and refines them into its own; the sink's
    answer is the system's. Choices: a node's refinement is one call with its role prompt (the paper's
    instructor-assistant dialogue on each edge collapsed to one turn); only the answers travel along edges, not the
    whole history (MacNet's memory control); the tree points to the sink so there is one final answer."""
    meter = CostMeter()
    metered = MeteredBackend(backend, meter)
    edges = topology(kind, len(agents))
    outputs: list[str] = []
    inputs: list[tuple[int, ...]] = []
    for j, agent in enumerate(agents):
        preds = tuple(i for i, d in edges if d == j)
        context = _refine_prompt(prompt, [(agents[i].name, outputs[i]) for i in preds])
        outputs.append(await ask(metered, agent.prompt, context, role="agent", sampling=sampling))
        inputs.append(preds)
    return MacNetRun(metered_result(outputs[-1], meter), edges, tuple(inputs))


# ---------------------------------------------------------------- AgentVerse

ACCEPT = "ACCEPT"


@dataclasses.dataclass(frozen=True)
class AgentVerseRun:
    result: RunResult
    rounds: int
    accepted: bool
    experts: tuple[tuple[str, ...], ...]  # who was recruited each round


def recruited(text: str, candidates: Sequence[Agent], size: int) -> tuple[Agent, ...]:
    """The candidates a recruiter reply names, in the order it names them, at most `size`; the first `size`
    candidates where it names none."""
    at = {a.name: m.start() for a in candidates if (m := re.search(rf"\b{re.escape(a.name)}\b", text, re.IGNORECASE))}
    named = sorted(at, key=at.get)
    chosen = [a for n in named for a in candidates if a.name == n][:size]
    return tuple(chosen) if chosen else tuple(candidates[:size])


def _recruit_prompt(prompt: str, candidates: Sequence[Agent], size: int, feedback: str) -> str:
    listing = "\n".join(f"- {a.name}: {a.description}" for a in candidates)
    note = f"\n\nThe previous attempt was rejected with this feedback:\n{feedback}" if feedback else ""
    return (
        f"Task:\n{prompt}{note}\n\nCandidate experts:\n{listing}\n\nRecruit up to {size} experts best suited to solve "
        "this task together. Reply with their names, most important first (it leads the group)."
    )


async def _decide(metered: Backend, prompt: str, experts: Sequence[Agent], feedback: str, sampling: Sampling) -> str:
    """Vertical decision-making: the leading expert proposes, the others review, the leader revises when a
    reviewer finds an issue."""
    leader, reviewers = experts[0], experts[1:]
    note = f"\n\nFeedback on an earlier attempt:\n{feedback}" if feedback else ""
    proposal = await ask(metered, leader.prompt, prompt + note + COT_SUFFIX, role="agent", sampling=sampling)
    reviews = [
        await ask(
            metered,
            r.prompt,
            f"{prompt}\n\nProposed solution:\n{proposal}\n\nReview it. If it is correct, reply exactly 'NO ISSUES'.",
            role="agent",
            sampling=sampling,
        )
        for r in reviewers
    ]
    issues = [
        (r.name, x) for r, x in zip(reviewers, reviews, strict=True) if not x.strip().upper().startswith("NO ISSUES")
    ]
    if not issues:
        return proposal
    return await ask(
        metered,
        leader.prompt,
        f"{prompt}\n\nYour solution:\n{proposal}\n\nReviews:\n{labelled(issues)}\n\nWrite the revised solution, "
        "ending with the final answer in the format asked.",
        role="agent",
        sampling=sampling,
    )


async def agentverse(
    backend: Backend,
    prompt: str,
    candidates: Sequence[Agent],
    *,
    size: int = 3,
    rounds: int = 3,
    sampling: Sampling = ANSWER_SAMPLING,
) -> AgentVerseRun:
    """Recruit, decide, execute, evaluate, repeat (Chen et al. 2023): a recruiter (role "recruiter") picks `size`
    experts from `candidates`; they reach a decision (`_decide`); the decision is executed; an evaluator (role
    "evaluator") accepts it or gives feedback, which the next round's recruitment and decision read. Stops when the
    evaluator accepts or after `rounds`; the answer is the last decision. Choices: the vertical structure (the
    paper's choice for reasoning and coding), execution is writing the decision out as the final solution (these
    tasks have no tools, so execution adds no call), the evaluator accepts by starting its reply with ACCEPT."""
    meter = CostMeter()
    metered = MeteredBackend(backend, meter)
    feedback, decision, accepted = "", "", False
    teams: list[tuple[str, ...]] = []
    for _ in range(rounds):
        reply = await ask(
            metered, None, _recruit_prompt(prompt, candidates, size, feedback), role="recruiter", sampling=sampling
        )
        experts = recruited(reply, candidates, size)
        teams.append(tuple(a.name for a in experts))
        decision = await _decide(metered, prompt, experts, feedback, sampling)
        verdict = await ask(
            metered,
            None,
            f"Task:\n{prompt}\n\nSolution:\n{decision}\n\nEvaluate the solution. If it is correct and complete, reply "
            f"exactly '{ACCEPT}'; otherwise explain what is wrong.",
            role="evaluator",
            sampling=sampling,
        )
        accepted = verdict.strip().upper().startswith(ACCEPT)
        if accepted:
            break
        feedback = verdict
    return AgentVerseRun(metered_result(decision, meter), len(teams), accepted, tuple(teams))


# ---------------------------------------------------------------- AgentPrune


@dataclasses.dataclass(frozen=True)
class CommEdge:
    """A communication channel from agent `sender` to agent `receiver`: within a round ("spatial", sender before
    receiver) or from one round to the next ("temporal"); one mask per channel, shared by every round."""

    kind: str
    sender: int
    receiver: int


@dataclasses.dataclass(frozen=True)
class Message:
    round: int
    edge: CommEdge


@dataclasses.dataclass(frozen=True)
class AgentPruneRun:
    result: RunResult
    kept: tuple[CommEdge, ...]
    pruned: tuple[CommEdge, ...]
    messages: tuple[Message, ...]  # every message delivered, in order


def channels(k: int) -> tuple[CommEdge, ...]:
    """The complete spatio-temporal graph of k agents: spatial i -> j for i < j, temporal i -> j for all i, j."""
    spatial = [CommEdge("spatial", i, j) for j in range(k) for i in range(j)]
    return (*spatial, *(CommEdge("temporal", i, j) for j in range(k) for i in range(k)))


def prune(edges: Sequence[CommEdge], weight: Callable[[CommEdge], float], ratio: float) -> tuple[CommEdge, ...]:
    """One-shot magnitude pruning: the round(ratio * |edges|) lowest-weight edges go (ties: the later edge goes
    first), the rest are kept in their order."""
    drop = round(ratio * len(edges))
    order = sorted(range(len(edges)), key=lambda i: (weight(edges[i]), -i))
    gone = set(order[:drop])
    return tuple(e for i, e in enumerate(edges) if i not in gone)


def _pruned_prompt(prompt: str, heard: Sequence[tuple[str, str]]) -> str:
    if not heard:
        return prompt + COT_SUFFIX
    return (
        f"{prompt}\n\nMessages from other agents:\n{labelled(heard)}\n\nTake them into account and write your own "
        "solution, ending with the final answer in the format asked."
    )


async def agentprune(
    backend: Backend,
    prompt: str,
    agents: Sequence[Agent],
    extract: Extract,
    weights: np.ndarray,
    *,
    rounds: int = 2,
    ratio: float = 0.5,
    sampling: Sampling = ANSWER_SAMPLING,
) -> AgentPruneRun:
    """A spatio-temporal communication graph among `agents` (Zhang et al. 2024), pruned once before any message is
    sent: each channel's weight is `weights[sender, receiver]`, the lowest `ratio` of channels are removed, and the
    agents then talk over the kept ones for `rounds` rounds (agent order within a round; a temporal channel
    delivers the sender's previous-round answer). The answer is the last round's majority (by `extract`).
    Choices: the weights are an estimate the caller supplies (`run_system` passes MACA's learned edge prior among
    the team, P_prior, which is learned on the training tasks as AgentPrune's masks are, instead of the paper's
    policy-gradient mask training; self channels, which P_prior lacks, get the team's mean weight); spatial and
    temporal channels share that matrix and one pruning ratio (0.5); the paper's final decision agent is replaced by
    the majority vote."""
    meter = CostMeter()
    metered = MeteredBackend(backend, meter)
    every = channels(len(agents))
    kept = prune(every, lambda e: float(weights[e.sender, e.receiver]), ratio)
    messages: list[Message] = []
    last: list[str] = []
    for t in range(rounds):
        now: list[str] = []
        for j, agent in enumerate(agents):
            inbound = [e for e in kept if e.receiver == j and (e.kind == "spatial" or t > 0)]
            heard = [(agents[e.sender].name, (now if e.kind == "spatial" else last)[e.sender]) for e in inbound]
            messages.extend(Message(t, e) for e in inbound)
            now.append(await ask(metered, agent.prompt, _pruned_prompt(prompt, heard), role="agent", sampling=sampling))
        last = now
    text, _, _ = majority(last, extract)
    return AgentPruneRun(metered_result(text, meter), kept, tuple(e for e in every if e not in kept), tuple(messages))


# ---------------------------------------------------------------- dispatch

TEAM_SIZE = 3  # agents per system: the fewest for which DyLAN's 2/3 consensus and a majority vote mean something


def candidates(pool: AgentPool, family: str) -> list[Agent]:
    """The agents a system may choose among on a task of `family`: the family's and the auxiliary ones."""
    return [a for a in pool if a.family in (family, "auxiliary")]


def adaptive_query(name: str, task: BenchmarkTask, pool: AgentPool) -> Query:
    """`task` as adaptive system `name` runs it, in training and at test time alike: MaAS's operators use the
    family's team (as the other multi-agent systems do); Puppeteer picks among AgentVerse's candidates."""
    agents = team(pool, task.family, TEAM_SIZE) if name == "maas" else candidates(pool, task.family)
    return Query(task, tuple(agents), vote_key(task))


async def train_adaptive(
    names: Sequence[str],
    backend: Backend,
    tasks: Sequence[BenchmarkTask],
    pool: AgentPool,
    check: Check,
    encoder: SentenceEncoder,
    *,
    maas_config: MaasConfig = MaasConfig(),
    puppeteer_config: AdaptiveTraining = AdaptiveTraining(),
    max_steps: int = 4,
    sampling: Sampling = ANSWER_SAMPLING,
    seed: int = 0,
    concurrency: int = 8,
    log: Callable[[str], None] | None = None,
) -> tuple[Learned, dict[str, list[dict]]]:
    """Trains each adaptive system of `names` on `tasks` (the training split, scored by `check`) through `backend`;
    returns what they learned (for `run_system`) and each one's training history. Puppeteer's episodes have
    `max_steps` agents at most, as at test time. Each system's calls count under the response cache's scope
    `training_scope(name)`. With `log`, each system's training logs its iterations with rate and ETA."""
    learned, history = Learned(encoder), {}

    def progress(name: str) -> Callable[[str], None] | None:
        return None if log is None else lambda line: log(f"{name} training: {line}")

    if "maas" in names:
        queries = [adaptive_query("maas", t, pool) for t in tasks]
        with scope(training_scope("maas")):
            controller, history["maas"] = await train_maas(
                backend,
                queries,
                check,
                encoder,
                maas_config,
                sampling=sampling,
                seed=seed,
                concurrency=concurrency,
                progress=progress("maas"),
            )
        learned = dataclasses.replace(learned, maas=controller)
    if "puppeteer" in names:
        queries = [adaptive_query("puppeteer", t, pool) for t in tasks]
        with scope(training_scope("puppeteer")):
            policy, history["puppeteer"] = await train_puppeteer(
                backend,
                queries,
                pool,
                check,
                encoder,
                puppeteer_config,
                max_steps=max_steps,
                sampling=sampling,
                seed=seed,
                concurrency=concurrency,
                progress=progress("puppeteer"),
            )
        learned = dataclasses.replace(learned, puppeteer=policy)
    return learned, history


async def run_system(
    name: str,
    backend: Backend,
    task: BenchmarkTask,
    pool: AgentPool,
    spec: GraphSpec,
    *,
    exemplars: Sequence[BenchmarkTask] = (),
    max_steps: int = 4,
    edge_threshold: float = 0.0,
    sampling: Sampling = ANSWER_SAMPLING,
    seed: int = 0,
    learned: Learned | None = None,
) -> RunResult:
    """One of `settings.BASELINES` on one task. The multi-agent systems run a team of the task family's agents;
    ComplexCoT draws its exemplars from `exemplars` of the task's benchmark (the study's training tasks); AgentPrune
    estimates its channel weights from `spec`'s edge prior; MaAS and Puppeteer act greedily by what `learned` holds
    (`train_adaptive` on the training tasks), Puppeteer with at most `max_steps` agents. The rest go to
    `baselines.run_baseline`."""
    if name in ADAPTIVE:
        return await _run_adaptive(name, backend, task, pool, learned, max_steps, sampling)
    if name not in MULTI_AGENT:
        return await run_baseline(
            name,
            backend,
            task,
            pool,
            spec,
            max_steps=max_steps,
            edge_threshold=edge_threshold,
            sampling=sampling,
            seed=seed,
        )
    if name == "complex_cot":
        shots = [exemplar(t) for t in exemplars if t.benchmark == task.benchmark and t.task_id != task.task_id]
        return await complex_cot(backend, task.prompt, shots, sampling=sampling)
    members = team(pool, task.family, TEAM_SIZE)
    if name == "dylan":
        return (await dylan(backend, task.prompt, members, vote_key(task), sampling=sampling)).result
    if name.startswith("macnet_"):
        return (
            await macnet(backend, task.prompt, members, kind=name.removeprefix("macnet_"), sampling=sampling)
        ).result
    if name == "agentverse":
        recruits = candidates(pool, task.family)
        return (await agentverse(backend, task.prompt, recruits, size=TEAM_SIZE, sampling=sampling)).result
    at = [pool.index(a.name) for a in members]
    weights = np.array(spec.edge_prior, dtype=float)[np.ix_(at, at)]
    # the prior has no self-loops (edges.py): an agent's channel to its own next round gets the team's mean weight,
    # so no missing estimate decides whether it is kept
    off = ~np.eye(len(at), dtype=bool)
    np.fill_diagonal(weights, weights[off].mean())
    return (await agentprune(backend, task.prompt, members, vote_key(task), weights, sampling=sampling)).result


async def _run_adaptive(
    name: str,
    backend: Backend,
    task: BenchmarkTask,
    pool: AgentPool,
    learned: Learned | None,
    max_steps: int,
    sampling: Sampling,
) -> RunResult:
    policy = getattr(learned, name, None)
    if policy is None:
        raise ValueError(f"{name} acts by what it learned on the training tasks: pass learned=train_adaptive(...)")
    query = adaptive_query(name, task, pool)
    if name == "maas":
        return (await maas(backend, query, policy, learned.encoder, sampling=sampling)).result
    run = await puppeteer(backend, query, pool, policy, learned.encoder, max_steps=max_steps, sampling=sampling)
    return run.result
