"""MACA's experiment settings as one typed tree (`MacaConfig`), built once by launch/maca.py from an
experiments/maca_*.py ConfigDict (porch_jax.typed_config); porch_jax/maca/experiment.py reads its attributes.

The paper is MACA (GraphSpec prior learning, token-aware GRPO, Table 3 ablations). Two configs fill this tree:

    python -m launch.maca --config=experiments/maca_synthetic.py             # simulated agents, on a CPU
    python -m launch.maca --config=experiments/maca_gsm_hard.py[:humaneval]  # agents served by vLLM

Each knob's trade-off is written where the experiments/ files set it; the sections here say what each one is.
An unknown key, a wrong type or a failed check below is a flags error naming the dotted key.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from porch_jax.backends import Sampling
from porch_jax.backends.spec import EndpointSpec
from porch_jax.maca.settings import (
    BASELINES,
    NO_POLICY_READINGS,
    VARIANTS,
    AdaptiveTraining,
    GRPOConfig,
    MaasConfig,
    PriorConfig,
)
from porch_jax.typed_config import check, resumable

__all__ = [
    "GATE_GAMMAS",
    "BackendConfig",
    "BaselinesConfig",
    "GRPOSection",
    "GraphSpecConfig",
    "LMCheckConfig",
    "LMConfig",
    "LambdaSelectionConfig",
    "MacaConfig",
    "PolicyConfig",
    "RolloutSection",
    "SweepsConfig",
    "TemperatureConfig",
    "WorldConfig",
]

# Fig. 8's grid (the gate's precision / recall on the held-out tasks; no training, so every point is cheap)
GATE_GAMMAS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """Where the tasks and agents come from. synthetic: simulated agents with known competences (exact best
    achievable accuracy, seconds per run); benchmark: one of the paper's six benchmarks with served agents
    (real accuracy and token costs, a model server needed). More tasks: tighter estimates, longer runs."""

    kind: Literal["synthetic", "benchmark"] = "synthetic"
    families: tuple[str, ...] = ("qa", "math", "code")  # synthetic only
    num_train: int = 96
    num_eval: int = 96
    train_seed: int = 0  # synthetic only
    eval_seed: int = 1000  # synthetic only
    budget: int = 2000  # each task's token budget b (GraphSpec's temperature and the reward's cost scale)
    hard_fraction: float = 0.5  # synthetic only
    benchmark: str = ""  # benchmark only: a porch_jax.envs.benchmarks name
    data_dir: str = ""  # benchmark only: a local data folder ("": the packaged split)
    # benchmark only: draw the tasks from the recorded CPU-sized subset of each split (16 train, 30 test ids;
    # envs/benchmarks/splits/maca_cpu_subsets.json) instead of the whole split; num_train / num_eval take its first
    subset: bool = False

    def __post_init__(self):
        check(self.num_train > 0, "num_train", f"must be > 0, got {self.num_train}")
        check(self.num_eval > 0, "num_eval", f"must be > 0, got {self.num_eval}")
        check(self.budget > 0, "budget", f"must be > 0, got {self.budget}")
        check(0.0 <= self.hard_fraction <= 1.0, "hard_fraction", f"must be in [0, 1], got {self.hard_fraction}")
        check(self.kind != "benchmark" or bool(self.benchmark), "benchmark", "a benchmark world needs its name")


@dataclasses.dataclass(frozen=True)
class TemperatureConfig:
    """GraphSpec's budget temperature beta(b) = base * (b / reference) ** exponent: a larger budget flattens the
    relevance gate, so more agents stay in reach."""

    base: float = 0.25
    reference: float = 2000.0
    exponent: float = 0.5


@dataclasses.dataclass(frozen=True)
class GraphSpecConfig:
    """GraphSpec (Sec. 3): gamma gates agents by relevance (higher: fewer agents, cheaper, less recall); H keeps an
    edge whose prior exceeds edge_threshold (higher: a narrower action space); stop_floor keeps STOP reachable."""

    gamma: float = 0.4
    edge_threshold: float = 0.05
    conditional_edges: bool = False  # threshold the prior row normalised over the retained agents
    stop_floor: float = 0.05
    temperature: TemperatureConfig = TemperatureConfig()

    def __post_init__(self):
        check(0.0 <= self.gamma <= 1.0, "gamma", f"must be in [0, 1], got {self.gamma}")
        check(self.edge_threshold >= 0.0, "edge_threshold", f"must be >= 0, got {self.edge_threshold}")


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """Agent calls per episode at most (more: longer chains reachable, more tokens per episode)."""

    max_steps: int = 6

    def __post_init__(self):
        check(self.max_steps > 0, "max_steps", f"must be > 0, got {self.max_steps}")


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """An LM policy scoring agent names: a Hugging Face folder (model_path), else a tiny Qwen3 built with
    `overrides`; `mesh` (data, fsdp, tensor) splits it over devices; max_task_words truncates the task text
    (0: whole)."""

    model_path: str = ""
    max_task_words: int = 0
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    mesh: tuple[int, ...] = (1, 1, 1)

    def __post_init__(self):
        check(len(self.mesh) == 3 and all(n > 0 for n in self.mesh), "mesh", f"must be 3 sizes > 0, got {self.mesh}")
        check(self.max_task_words >= 0, "max_task_words", f"must be >= 0, got {self.max_task_words}")


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """pi_theta: "head" (an MLP over the task embedding and the call history; fast, the synthetic sweep) or "lm"."""

    kind: Literal["head", "lm"] = "head"
    hidden: int = 128
    lm: LMConfig = LMConfig()


@dataclasses.dataclass(frozen=True)
class GRPOSection(GRPOConfig):
    """Token-aware GRPO (maca/settings.py `GRPOConfig`, its optimizer a train/config.py `OptimizerConfig`) plus
    lambda, Eq. 12's prior-KL weight (kept by every ablation but unconstrained GRPO). `stop_floor` and `rollout`
    come from graphspec / rollout, not from here (experiment.grpo_config joins them into the trainer's GRPOConfig;
    lambda goes per variant)."""

    prior_kl_weight: float = 0.7

    def __post_init__(self):
        check(self.iterations >= 0, "iterations", f"must be >= 0, got {self.iterations}")
        check(self.tasks_per_iteration > 0, "tasks_per_iteration", f"must be > 0, got {self.tasks_per_iteration}")
        check(self.group_size > 1, "group_size", f"must be > 1 (group advantages), got {self.group_size}")
        check(self.prior_kl_weight >= 0, "prior_kl_weight", f"must be >= 0, got {self.prior_kl_weight}")
        check(self.optimizer.total_steps is None, "optimizer.total_steps", "is set from iterations * epochs")
        check(self.stop_floor == GRPOConfig.stop_floor, "stop_floor", "set graphspec.stop_floor instead")
        check(self.rollout == GRPOConfig().rollout, "rollout", "set rollout.max_steps and graphspec.* instead")


@dataclasses.dataclass(frozen=True)
class LambdaSelectionConfig:
    """lambda chosen for MACA on a validation split of the training distribution (synthetic worlds): each grid
    value x seed is a MACA training run, so a finer grid or more seeds buy a surer choice with more time."""

    enabled: bool = False
    grid: tuple[float, ...] = ()
    num_tasks: int = 96
    task_seed: int = 2000
    seeds: tuple[int, ...] = (0,)


@dataclasses.dataclass(frozen=True)
class SweepsConfig:
    """Held-out sensitivity of MACA to gamma and lambda (each value x sweep seed is a training run; () skips)."""

    gamma: tuple[float, ...] = ()
    prior_kl_weight: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class LMCheckConfig:
    """MACA with the LM policy on a reduced setting (a check that the LM path learns; slow on CPU)."""

    enabled: bool = False
    families: tuple[str, ...] = ("math",)
    num_train: int = 32
    num_eval: int = 32
    iterations: int = 20
    tasks_per_iteration: int = 4
    learning_rate: float = 3e-3
    epochs: int = 2
    lm: LMConfig = LMConfig()


@dataclasses.dataclass(frozen=True)
class BaselinesConfig:
    """The comparison systems (baselines.BASELINES) on the held-out tasks; they need a benchmark world. MaAS and
    Puppeteer (adaptive.py) first learn on the training tasks by REINFORCE, as `maas` and `puppeteer` set (more
    iterations or samples: more agent calls before the evaluation; MaAS's layers: deeper architectures)."""

    systems: tuple[str, ...] = ()
    concurrency: int = resumable(8)  # episodes in flight against the served agents
    maas: MaasConfig = MaasConfig()
    puppeteer: AdaptiveTraining = AdaptiveTraining()

    def __post_init__(self):
        unknown = [s for s in self.systems if s not in BASELINES]
        check(not unknown, "systems", f"unknown {unknown}; choose from {', '.join(BASELINES)}")
        check(self.concurrency > 0, "concurrency", f"must be > 0, got {self.concurrency}")
        check(self.maas.layers > 0, "maas.layers", f"must be > 0, got {self.maas.layers}")
        for name, t in (("maas", self.maas), ("puppeteer", self.puppeteer)):
            check(t.iterations >= 0, f"{name}.iterations", f"must be >= 0, got {t.iterations}")
            check(t.tasks_per_iteration > 0, f"{name}.tasks_per_iteration", f"must be > 0, got {t.tasks_per_iteration}")
            check(t.samples > 1, f"{name}.samples", f"must be > 1 (each task's mean is the baseline), got {t.samples}")
            check(t.learning_rate > 0, f"{name}.learning_rate", f"must be > 0, got {t.learning_rate}")


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    """The agent pool's backend: "synthetic" (the synthetic world's own) or "served": ``endpoint``, any
    OpenAI-compatible provider (backends/spec.py ``EndpointSpec``: vLLM, SGLang or a hosted API, the key read from
    the variable it names), sampled with ``sampling`` (max tokens, temperature, thinking) by every agent call."""

    kind: Literal["synthetic", "served"] = "synthetic"
    endpoint: EndpointSpec = EndpointSpec()
    sampling: Sampling = Sampling(max_tokens=512)

    def __post_init__(self):
        check(self.kind == "synthetic" or self.endpoint.configured, "endpoint.model", "a served pool names its model")


@dataclasses.dataclass(frozen=True)
class MacaConfig:
    """One MACA run: RUN_DIR's results, figures and checkpoints (a rerun resumes; another config is refused).

    Attributes:
    seeds: every system is trained and evaluated once per seed (more: tighter means, linear time).
    sweep_seeds: the seeds of each sweep point.
    curve_every: > 0: held-out evaluation every that many GRPO iterations (learning curves).
    checkpoint_every: > 0: also checkpoint every training run every that many iterations (0: at its end).
    encoder: "minilm", "hashing" (a test stand-in) or a sentence-transformers folder / hub id.
    systems: the Table 3 variants trained (maca/train.py VARIANTS).
    no_policy_structure: what w/o pi_theta executes (analysis.NO_POLICY_READINGS).
    policy_from: "" trains every learned system here; else a MACA run directory whose trained policies
        (checkpoints/<system>/seed_<s>) this run evaluates instead of training its own: the same pool size, encoder,
        rollout length and GRPO settings (a policy trained on one benchmark, run on another of its family).
    no_policy_lm: the "pretrained_lm" reading's router: a pretrained instruction LM's Hugging Face folder
        (model_path; "" with every other reading), untrained, scoring the agents GraphSpec's mask allows in its chat
        template (lm_policy.router_policy); max_task_words bounds the task text it reads; overrides stay empty.
    prior: structural prior learning (Algorithm 1, lines 3-7); its gamma / temperature come from graphspec.
    gate_gammas: Fig. 8's grid.
    """

    run_dir: str = resumable()
    seed: int = 0
    seeds: tuple[int, ...] = (0,)
    sweep_seeds: tuple[int, ...] = (0,)
    curve_every: int = 0
    checkpoint_every: int = 0
    world: WorldConfig = WorldConfig()
    pool_families: tuple[str, ...] = ("qa", "math", "code", "auxiliary")
    encoder: str = "minilm"
    graphspec: GraphSpecConfig = GraphSpecConfig()
    prior: PriorConfig = PriorConfig()
    rollout: RolloutSection = RolloutSection()
    policy: PolicyConfig = PolicyConfig()
    grpo: GRPOSection = GRPOSection()
    lambda_selection: LambdaSelectionConfig = LambdaSelectionConfig()
    systems: tuple[str, ...] = ("maca",)
    policy_from: str = ""
    no_policy_structure: str = "greedy"
    no_policy_lm: LMConfig = LMConfig(max_task_words=64)
    sweeps: SweepsConfig = SweepsConfig()
    lm_check: LMCheckConfig = LMCheckConfig()
    baselines: BaselinesConfig = BaselinesConfig()
    backend: BackendConfig = BackendConfig()
    gate_gammas: tuple[float, ...] = GATE_GAMMAS

    def __post_init__(self):
        check(bool(self.run_dir), "run_dir", "must be a directory path")
        check(self.curve_every >= 0, "curve_every", f"must be >= 0, got {self.curve_every}")
        check(self.checkpoint_every >= 0, "checkpoint_every", f"must be >= 0, got {self.checkpoint_every}")
        unknown = [s for s in self.systems if s not in VARIANTS]
        check(not unknown, "systems", f"unknown {unknown}; choose from {', '.join(VARIANTS)}")
        check(
            self.no_policy_structure in NO_POLICY_READINGS,
            "no_policy_structure",
            f"must be one of {NO_POLICY_READINGS}, got {self.no_policy_structure!r}",
        )
        router = self.no_policy_lm
        if self.no_policy_structure == "pretrained_lm":
            check(
                bool(router.model_path),
                "no_policy_lm.model_path",
                "the pretrained_lm reading needs a pretrained instruction LM's Hugging Face folder (e.g. "
                "porch_jax.models.smollm2.smollm2_folder())",
            )
        else:
            check(
                not router.model_path,
                "no_policy_lm.model_path",
                f"is read only by no_policy_structure='pretrained_lm' (it is {self.no_policy_structure!r}): set that "
                "reading, or leave model_path empty",
            )
        check(not router.overrides, "no_policy_lm.overrides", "must be empty: the router is the folder's model")
        check(self.prior.gamma == PriorConfig.gamma, "prior.gamma", "set graphspec.gamma instead")
        check(self.prior.temperature == PriorConfig().temperature, "prior.temperature", "set graphspec.temperature")
        check(
            not self.baselines.systems or self.world.kind == "benchmark",
            "baselines.systems",
            f"{self.baselines.systems} need a benchmark world, where a served LLM answers and routes; world.kind is "
            f"{self.world.kind!r} (its agents are simulated): set baselines.systems=()",
        )
        sel, w = self.lambda_selection, self.world
        check(
            not (sel.enabled and w.kind == "synthetic" and sel.task_seed in (w.train_seed, w.eval_seed)),
            "lambda_selection.task_seed",
            f"{sel.task_seed} must differ from the train and eval seeds",
        )
