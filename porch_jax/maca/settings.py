"""MACA's settings as data, with no JAX: the Table 3 variants, the GRPO and prior settings and the names a config
is checked against. maca/config.py's schema reads these while absl parses the flags, so a config error answers
before JAX loads; the modules that compute with them (graphspec, orchestrator, prior, train) import them here."""

from __future__ import annotations

import dataclasses

from porch_jax.train.config import OptimizerConfig

DEFAULT_GAMMA = 0.4  # GraphSpec's participation gate (Eq. 4)
TOKEN_COST_WEIGHT = 0.02  # beta in Eq. 12 (paper, Appendix D.3)
PRIOR_KL_WEIGHT = 0.7  # lambda in Eq. 12 (paper, Sec. 3.6)
PRIOR_KINDS = ("full", "no_relevance", "no_edges", "none")
STRUCTURES = ("greedy", "most_probable")  # what the structure-centric "w/o pi_theta" executes (prior.PriorPolicy)
NO_POLICY_READINGS = (*STRUCTURES, "reference", "pretrained_lm")  # what "w/o pi_theta" acts by (Study.structure)
SINGLE_MODEL = ("vanilla", "cot", "self_consistency", "self_refine", "router_none", "router_hint", "router_mask")
# multi_agent.py's systems: ComplexCoT, DyLAN, MacNet on three topologies, AgentVerse, AgentPrune
MULTI_AGENT = ("complex_cot", "dylan", "macnet_chain", "macnet_tree", "macnet_mesh", "agentverse", "agentprune")
# adaptive.py's systems, which learn on the training tasks before they answer: MaAS and Puppeteer
ADAPTIVE = ("maas", "puppeteer")
BASELINES = (*SINGLE_MODEL, *MULTI_AGENT, *ADAPTIVE)


def training_scope(name: str) -> str:
    """The response cache's scope (backends/cache.py `SCOPE`) of adaptive system `name`'s training calls."""
    return f"{name} training"


@dataclasses.dataclass(frozen=True)
class AdaptiveTraining:
    """REINFORCE for an adaptive baseline (adaptive.py) on the training tasks: `iterations` updates, each on
    `tasks_per_iteration` tasks (the training tasks in turn) x `samples` episodes of the current policy, with the
    episode reward correct - token_cost_weight * tokens / token_unit - step_cost * model calls (beta as MACA's
    Eq. 12) and each task's mean reward as the baseline; plain gradient ascent at `learning_rate`. The defaults run
    as many episodes as MACA's GRPO in the real-agent table (6 x 2 x 8)."""

    iterations: int = 6
    tasks_per_iteration: int = 2
    samples: int = 8
    learning_rate: float = 0.5
    token_cost_weight: float = TOKEN_COST_WEIGHT
    token_unit: float = 1000.0
    step_cost: float = 0.0


@dataclasses.dataclass(frozen=True)
class MaasConfig(AdaptiveTraining):
    """MaAS's supernet depth (operator layers) and its controller's training."""

    layers: int = 3


@dataclasses.dataclass(frozen=True)
class BudgetTemperature:
    """beta(b) = base * (budget / reference) ** exponent."""

    base: float = 0.25
    reference: float = 2000.0
    exponent: float = 0.5

    def __call__(self, budget: float) -> float:
        if budget <= 0:
            raise ValueError(f"budget must be positive, got {budget}")
        return self.base * (budget / self.reference) ** self.exponent


@dataclasses.dataclass(frozen=True)
class Constraint:
    """The action space a policy acts in: Eq. 11's H from each task's GraphSpec, or all of A."""

    use_mask: bool = True
    edge_threshold: float = 0.0
    conditional: bool = False  # threshold the row normalised over the retained agents (policy.structural_mask)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    max_steps: int = 6
    greedy: bool = False
    constraint: Constraint = Constraint()


@dataclasses.dataclass(frozen=True)
class PriorConfig:
    gamma: float = DEFAULT_GAMMA
    temperature: BudgetTemperature = dataclasses.field(default_factory=BudgetTemperature)
    rounds: int = 3  # passes over the training tasks
    samples: int = 8  # structures G^(k) per task
    walk_steps: int = 4
    sparsity: float = 0.3  # Eq. 5's lambda per agent (times N; see edges.py on why it is needed)
    edge_learning_rate: float = 0.1
    credit: str = "sampled"  # Eq. 5 on the sampled or the executed edges (edges.py)
    init_out_degree: float | None = (
        None  # pi_phi's initial expected out-degree among a task's agents (None: sigma = 0.5)
    )
    per_family: bool = False  # one pi_phi per task family (the paper learns its prior per dataset)
    buffer_rounds: int | None = None  # fill the success buffer from the last rounds only (None: all)
    with_start: bool = False  # learn where successful trajectories start (edges.py, START node)
    keep_cheapest: bool = False  # the buffer keeps each task's cheapest successful walk(s) per round (edges.py)
    phi_start: bool = False  # pi_phi samples START's edges too, and walks open at one of them (synthetic.walk)
    # a round's walks sampled from pi_phi as it stands at the round's start and run all at once (edges.py,
    # prior_learning_round's execute_batch): served agents then answer them concurrently
    batched: bool = False
    mlp_hidden: int = 128
    mlp_steps: int = 300
    mlp_batch: int = 32
    mlp_learning_rate: float = 1e-3


@dataclasses.dataclass(frozen=True)
class Variant:
    """prior: what GraphSpec keeps ("full"; "no_relevance": Z_prior removed, q = z = 1; "no_edges": P_prior's
    plausibility removed, p = 1; "none": no GraphSpec). mask: Eq. 11's hard constraint. learn: False acts by
    executing the structure GraphSpec commits to, with no policy (the structure-centric "w/o pi_theta",
    `PriorPolicy`)."""

    name: str
    prior: str = "full"
    mask: bool = True
    prior_kl_weight: float = PRIOR_KL_WEIGHT
    learn: bool = True

    def __post_init__(self) -> None:
        if self.prior not in PRIOR_KINDS:
            raise ValueError(f"prior must be one of {PRIOR_KINDS}, got {self.prior!r}")
        if self.prior == "none" and not self.learn:
            raise ValueError("a variant without GraphSpec and without a policy has nothing to act by")


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("maca"),
        Variant("no_z_prior", prior="no_relevance"),
        Variant("no_p_prior", prior="no_edges"),
        Variant("no_graphspec", prior="none", mask=False),
        Variant("no_policy", learn=False),
        Variant("grpo", prior="none", mask=False, prior_kl_weight=0.0),  # unconstrained GRPO: no mask, no prior KL
    )
}


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Token-aware GRPO (maca/train.py): iterations of `tasks_per_iteration` tasks, `group_size` episodes each,
    `epochs` updates per batch of rollouts, Eq. 12's costs and where its KL to pi_mix is charged."""

    iterations: int = 60
    tasks_per_iteration: int = 8
    group_size: int = 8  # G (paper, App. D.3)
    # AdamW as every trainer here builds it (train/optim.py); its schedule counts updates, `epochs` per iteration
    # (total_steps is set from iterations * epochs). The rate: the paper's 1e-5 is for an 8B model, these policies
    # start from scratch; constant unless final_lr_ratio < 1. b2 = 0.999 is the value MACA's results were produced
    # with (the library default, 0.95, is the language-model trainers').
    optimizer: OptimizerConfig = OptimizerConfig(
        learning_rate=3e-3, final_lr_ratio=1.0, weight_decay=0.0, b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0
    )
    clip_eps: float = 0.2
    epochs: int = 1  # updates per batch of rollouts (ratios stay 1 at the first)
    token_cost_weight: float = TOKEN_COST_WEIGHT
    token_unit: float = 1000.0
    kl_in_reward: bool = False  # True: also charge lambda * KL_t in the return (Eq. 12 literally)
    kl_in_loss: bool = True  # lambda * KL(pi_theta || pi_mix) as a loss term at every decision
    kl_sample: bool = False  # in the return: KL_t as log pi(a_t) - log pi_mix(a_t) at the taken action
    advantage_eps: float = 0.1  # Eq. 9's epsilon (see the module docstring)
    stop_floor: float = 0.05
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
