"""GraphSpec (MACA Sec. 2.2): agent relevance (Eq. 4) and the edge prior P_prior (Eq. 7).

Paper ambiguities and how they are resolved here:
- Eq. 4, q_i = sigmoid(s_i / beta(b)) with s_i = cos(e(x, b), e_i). A sentence encoder's cosines lie
  in a narrow, encoder-specific band (all-MiniLM-L6-v2 on our pool and tasks: about -0.05..0.45), so
  the literal formula gives q_i >= 0.4 whenever s_i > -0.405 * beta: the paper's gamma = 0.4 would
  filter nothing. By default s_i is therefore standardised over the pool, (s_i - mean) / std, before the
  temperature; `standardize=False` gives the literal formula.
- beta(b) is "a budget-dependent temperature" with no given form. Here beta(b) = base * (b / reference)
  ** exponent: a larger budget gives a softer sigmoid, so with gamma < 0.5 more agents pass the gate.
- e(x, b) embeds the task text with the budget written after it (`context_text`).
- Eq. 7 multiplies p_ij by q_j (the ungated score), as written; the gate acts through the action mask.
- Where the edge MLP was fitted with a START node (edges.py), p carries an extra source row, p_START,j
  (where successful coordination starts); Eq. 7 modulates it the same way: start_prior_j = p_START,j q_j.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from porch_jax.maca.settings import DEFAULT_GAMMA, BudgetTemperature


def context_text(task: str, budget: int) -> str:
    """The text whose embedding is e(x, b)."""
    return f"{task}\nToken budget: {budget}"


def relevance(task_emb: jax.Array, agent_embs: jax.Array, temperature: float, *, standardize: bool = True) -> jax.Array:
    """Eq. 4, q_i = sigmoid(s_i / beta(b)): float [N] from e(x, b) [d] and agent embeddings [N, d]."""
    task = task_emb / jnp.linalg.norm(task_emb)
    agents = agent_embs / jnp.linalg.norm(agent_embs, axis=-1, keepdims=True)
    s = agents @ task
    if standardize:
        s = (s - s.mean()) / (s.std() + 1e-8)
    return jax.nn.sigmoid(s / temperature)


def gate(q: jax.Array, gamma: float = DEFAULT_GAMMA) -> jax.Array:
    """Eq. 4, z_i = q_i if q_i >= gamma else 0: Z_prior."""
    return jnp.where(q >= gamma, q, 0.0)


def edge_prior(p: jax.Array, q: jax.Array) -> jax.Array:
    """Eq. 7, P_prior[i, j] = p_ij * q_j: edges into low-relevance agents are suppressed."""
    return p * q[..., None, :]


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """GS(x, b) = (Z_prior, P_prior), with the ungated relevance q kept for Eq. 7 and analysis."""

    relevance: np.ndarray  # q [N]
    participation: np.ndarray  # z [N] (Z_prior)
    edge_prior: np.ndarray  # P_prior [N, N]
    start_prior: np.ndarray | None = None  # p_START,j q_j [N], None without a START node

    @property
    def retained(self) -> np.ndarray:
        """bool [N]: agents that passed the gate."""
        return self.participation > 0


def build_graphspec(
    context_emb: np.ndarray,
    agent_embs: np.ndarray,
    budget: float,
    edge_probs: np.ndarray,
    *,
    gamma: float = DEFAULT_GAMMA,
    temperature: BudgetTemperature = BudgetTemperature(),  # noqa: B008 (frozen: one shared default is safe)
    standardize: bool = True,
) -> GraphSpec:
    """GraphSpec of one task from e(x, b) [d], the agents' e_i [N, d] and p [N, N] (Eq. 6 on e(x)), or
    [N + 1, N + 1] with the START node last."""
    q = relevance(jnp.asarray(context_emb), jnp.asarray(agent_embs), temperature(budget), standardize=standardize)
    n = len(agent_embs)
    p = np.asarray(edge_probs)
    start = p[n, :n] if p.shape[-1] == n + 1 else None
    return GraphSpec(
        relevance=np.asarray(q),
        participation=np.asarray(gate(q, gamma)),
        edge_prior=np.asarray(edge_prior(jnp.asarray(p[:n, :n]), q)),
        start_prior=None if start is None else np.asarray(start * np.asarray(q)),
    )
