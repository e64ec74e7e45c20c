"""MACA (structure-guided orchestration): agent pools, sentence encoders, the GraphSpec prior
(relevance Eq. 4, edge policy Eq. 5, edge MLP Eq. 6, P_prior Eq. 7), the masked token-aware policy
maths (Eq. 11, 12), and a synthetic agent world for CPU-scale learning."""
from porch_jax.maca.edges import (
    EdgeMLP,
    EdgePolicy,
    SuccessBuffer,
    edge_policy_loss,
    edge_probabilities,
    prior_learning_round,
    sample_edges,
    train_edge_mlp,
)
from porch_jax.maca.encoder import EncoderUnavailable, HashingEncoder, MiniLMEncoder, SentenceEncoder
from porch_jax.maca.graphspec import (
    DEFAULT_GAMMA,
    BudgetTemperature,
    GraphSpec,
    build_graphspec,
    context_text,
    edge_prior,
    gate,
    relevance,
)
from porch_jax.maca.policy import (
    PRIOR_KL_WEIGHT,
    TOKEN_COST_WEIGHT,
    kl_to_mix,
    masked_log_probs,
    mix_log_probs,
    prior_action_probs,
    step_rewards,
    structural_mask,
    trajectory_return,
)
from porch_jax.maca.pools import FAMILIES, TASK_FAMILIES, Agent, AgentPool, load_family, load_pool

__all__ = [
    "DEFAULT_GAMMA",
    "FAMILIES",
    "PRIOR_KL_WEIGHT",
    "TASK_FAMILIES",
    "TOKEN_COST_WEIGHT",
    "Agent",
    "AgentPool",
    "BudgetTemperature",
    "EdgeMLP",
    "EdgePolicy",
    "EncoderUnavailable",
    "GraphSpec",
    "HashingEncoder",
    "MiniLMEncoder",
    "SentenceEncoder",
    "SuccessBuffer",
    "build_graphspec",
    "context_text",
    "edge_policy_loss",
    "edge_prior",
    "edge_probabilities",
    "gate",
    "kl_to_mix",
    "load_family",
    "load_pool",
    "masked_log_probs",
    "mix_log_probs",
    "prior_action_probs",
    "prior_learning_round",
    "relevance",
    "sample_edges",
    "step_rewards",
    "structural_mask",
    "train_edge_mlp",
    "trajectory_return",
]
