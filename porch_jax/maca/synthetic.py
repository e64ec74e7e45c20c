"""A SYNTHETIC agent pool for showing MACA's learning on a CPU: the shipped agents (names, role
descriptions) with hand-set, known competences and token costs per task family, and templated tasks.
Nothing here is measured from an LLM; it is a controlled world whose right answers are known.

The world's rules (what GraphSpec and a policy should discover):
- Only agents of the task's family act; auxiliary ones act weakly (TaskPlanner prepares, RedTeamCritic
  checks); agents of other families only spend tokens.
- A solver writes a solution that is correct with probability `skill` (minus HARD_PENALTY on hard
  tasks), plus the preparer's bonus if a preparer ran immediately before it (the prep -> solve edge).
- A checker repairs a wrong solution with probability `skill`, fully right after a solver and half as
  well later (the solve -> check edge); a fixer repairs only right after a checker (check -> fix).
- Every call costs prompt tokens (the task plus everything said so far) and its completion tokens.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from porch_jax.maca.pools import TASK_FAMILIES, AgentPool, load_pool

HARD_PENALTY = 0.25  # solver skill lost on hard tasks
HARD_TOKEN_FACTOR = 1.5  # completions are longer on hard tasks
MAX_SUCCESS = 0.98


@dataclasses.dataclass(frozen=True)
class Competence:
    """role: prep | solve | check | fix | none. skill: the role's probability (prep: the bonus it gives)."""

    role: str
    skill: float
    tokens: int  # completion tokens per call (easy task)


COMPETENCES: dict[str, dict[str, Competence]] = {
    "math": {
        "WordProblemParser": Competence("prep", 0.30, 120),
        "MathSolver": Competence("solve", 0.55, 260),
        "AlgebraSimplifier": Competence("solve", 0.45, 220),
        "ArithmeticChecker": Competence("check", 0.45, 150),
        "StepChecker": Competence("check", 0.55, 180),
        "GeneralCritic": Competence("check", 0.25, 160),
    },
    "code": {
        "AlgorithmDesigner": Competence("prep", 0.30, 150),
        "CodeWriting": Competence("solve", 0.55, 300),
        "CodeReviewer": Competence("check", 0.30, 180),
        "UnitTestWriter": Competence("check", 0.30, 220),
        "EdgeCaseHunter": Competence("check", 0.25, 160),
        "BugFixer": Competence("fix", 0.60, 280),
    },
    "qa": {
        "TaskRouter": Competence("prep", 0.30, 80),
        "AnalyzeAgent": Competence("solve", 0.60, 200),
        "ChoiceEliminator": Competence("solve", 0.50, 180),
        "EvidenceChecker": Competence("check", 0.40, 150),
        "Skeptic": Competence("check", 0.30, 150),
        "QASynthesizer": Competence("solve", 0.45, 120),
    },
}
AUXILIARY: dict[str, Competence] = {
    "TaskPlanner": Competence("prep", 0.10, 100),
    "Summarizer": Competence("none", 0.0, 80),
    "BudgetController": Competence("none", 0.0, 40),
    "RedTeamCritic": Competence("check", 0.15, 140),
}
BYSTANDER = Competence("none", 0.0, 200)  # an agent of another family: talks, changes nothing

_TEMPLATES: dict[str, tuple[str, ...]] = {
    "math": (
        "{name} buys {a} boxes of {item} at ${p} per box and sells {b} boxes for ${q} each. How many dollars of profit does {name} make?",
        "A train travels {a} miles in {b} hours, then {c} miles in {d} hours. What is its average speed in miles per hour?",
        "{name} has {a} {item}. {name} gives {b} to each of {c} friends and then buys {d} more. How many {item} does {name} have now?",
        "A rectangle is {a} meters long and {b} meters wide. A path {c} meters wide runs around it. What is the area of the path in square meters?",
        "{name} saves ${a} every week for {b} weeks and spends {c} percent of the savings on {item}. How much money is left?",
    ),
    "code": (
        "Write a Python function `{fn}(nums: list[int]) -> int` that returns the {what} of the list, or 0 for an empty list.",
        "Implement `{fn}(s: str) -> bool` in Python: return True if the string {prop}, otherwise False.",
        "Write a Python function `{fn}(items: list[str], k: int) -> list[str]` that returns the {k} most frequent strings, ties broken alphabetically.",
        "Complete the Python function `{fn}(matrix: list[list[int]]) -> list[int]` that returns the elements of the matrix in {order} order.",
        "Write `{fn}(n: int) -> list[int]` in Python that returns all {what2} up to n, with unit tests for edge cases.",
    ),
    "qa": (
        "Which of the following best explains why {phenomenon}?\nA. {o1}\nB. {o2}\nC. {o3}\nD. {o4}",
        "A student observes that {phenomenon}. Which statement is most likely correct?\nA. {o1}\nB. {o2}\nC. {o3}\nD. {o4}",
        "According to {field} principles, which option describes {concept}?\nA. {o1}\nB. {o2}\nC. {o3}\nD. {o4}",
        "In {field}, which of these is an example of {concept}?\nA. {o1}\nB. {o2}\nC. {o3}\nD. {o4}",
    ),
}
_FILLS: dict[str, tuple[str, ...]] = {
    "name": ("Maria", "Tom", "Aisha", "Kenji", "Lena", "Omar"),
    "item": ("apples", "pencils", "marbles", "cupcakes", "stickers"),
    "fn": ("solve", "process", "compute_value", "check_input", "transform"),
    "what": (
        "sum of even numbers",
        "largest gap between neighbours",
        "length of the longest increasing run",
        "second largest value",
    ),
    "what2": ("prime numbers", "perfect squares", "Fibonacci numbers"),
    "prop": ("is a palindrome ignoring case", "has balanced brackets", "contains every vowel"),
    "order": ("spiral", "zigzag", "column-major"),
    "phenomenon": (
        "ice floats on water",
        "the days are longer in summer",
        "prices rise when money supply grows",
        "a metal spoon feels colder than a wooden one",
        "plants grow toward light",
    ),
    "field": ("biology", "economics", "physics", "law", "chemistry", "history"),
    "concept": (
        "a chemical change",
        "an inherited trait",
        "opportunity cost",
        "a renewable resource",
        "a legal precedent",
    ),
    "o1": ("density differences", "the tilt of the Earth's axis", "thermal conductivity", "a change in demand"),
    "o2": ("gravity acting on mass", "the distance to the Sun", "the colour of the object", "government regulation"),
    "o3": ("magnetic attraction", "ocean currents", "the shape of the object", "consumer preferences"),
    "o4": ("air pressure", "the phases of the Moon", "static electricity", "population growth"),
}


@dataclasses.dataclass(frozen=True)
class SyntheticTask:
    task_id: str
    family: str
    hard: bool
    text: str
    budget: int


@dataclasses.dataclass(frozen=True)
class Outcome:
    success: bool
    probability: float  # the exact success probability of this agent sequence on this task
    prompt_tokens: tuple[int, ...]  # per step
    completion_tokens: tuple[int, ...]  # per step

    @property
    def step_tokens(self) -> tuple[int, ...]:
        return tuple(p + c for p, c in zip(self.prompt_tokens, self.completion_tokens, strict=False))

    @property
    def cost(self) -> int:
        return sum(self.step_tokens)


def make_tasks(
    n: int, *, families: Sequence[str] = TASK_FAMILIES, hard_fraction: float = 0.5, budget: int = 2000, seed: int = 0
) -> list[SyntheticTask]:
    """`n` tasks, families in turn, text from the family's templates with random fillers."""
    rng = random.Random(seed)
    tasks = []
    for k in range(n):
        family = families[k % len(families)]
        template = rng.choice(_TEMPLATES[family])
        fills = {key: rng.choice(values) for key, values in _FILLS.items()}
        fills.update({key: rng.randint(2, 99) for key in ("a", "b", "c", "d", "p", "q", "k")})
        tasks.append(
            SyntheticTask(
                f"synthetic-{seed}-{k}", family, rng.random() < hard_fraction, template.format(**fills), budget
            )
        )
    return tasks


class SyntheticPool:
    """Agents of `pool` with the known competences above; simulates an agent sequence on a task."""

    def __init__(self, pool: AgentPool | None = None):
        self.pool = pool if pool is not None else load_pool()

    def competence(self, agent: int, family: str) -> Competence:
        name = self.pool.agents[agent].name
        return COMPETENCES[family].get(name) or AUXILIARY.get(name) or BYSTANDER

    def success_probability(self, task: SyntheticTask, path: Sequence[int]) -> float:
        p, solved, prev = 0.0, False, None
        for agent in path:
            c = self.competence(agent, task.family)
            if c.role == "solve":
                bonus = prev.skill * (1.5 if task.hard else 1.0) if prev is not None and prev.role == "prep" else 0.0
                p, solved = c.skill - (HARD_PENALTY if task.hard else 0.0) + bonus, True
            elif c.role == "check" and solved:
                p += (1 - p) * c.skill * (1.0 if prev is not None and prev.role == "solve" else 0.5)
            elif c.role == "fix" and solved and prev is not None and prev.role == "check":
                p += (1 - p) * c.skill
            p = min(max(p, 0.0), MAX_SUCCESS)
            prev = c
        return p

    def run(self, task: SyntheticTask, path: Sequence[int], rng: np.random.Generator) -> Outcome:
        p = self.success_probability(task, path)
        history = int(1.3 * len(task.text.split()))  # the task prompt, in rough tokens
        prompts, completions = [], []
        for agent in path:
            tokens = self.competence(agent, task.family).tokens
            completion = int(tokens * (HARD_TOKEN_FACTOR if task.hard else 1.0))
            prompts.append(history)
            completions.append(completion)
            history += completion
        return Outcome(bool(rng.random() < p), p, tuple(prompts), tuple(completions))


def walk(graph: np.ndarray, allowed: np.ndarray, rng: np.random.Generator, *, max_steps: int = 5) -> list[int]:
    """Executes a sampled structure G: start at a random allowed agent, then follow a random out-edge
    of G to an agent not yet visited, until there is none or `max_steps` agents have acted. A G over
    N + 1 nodes has a START node last: the walk then opens at one of START's allowed out-neighbours (at a
    random allowed agent if it has none)."""
    n = len(allowed)
    candidates = np.flatnonzero(allowed)
    if candidates.size == 0:
        return []
    if graph.shape[0] == n + 1:
        opening = np.flatnonzero(graph[n, :n] & allowed)
        candidates = opening if opening.size else candidates
        graph = graph[:n, :n]
    path = [int(rng.choice(candidates))]
    while len(path) < max_steps:
        nxt = [j for j in np.flatnonzero(graph[path[-1]] & allowed) if j not in path]
        if not nxt:
            break
        path.append(int(rng.choice(nxt)))
    return path
