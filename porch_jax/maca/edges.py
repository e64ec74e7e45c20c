"""Interaction plausibility (MACA Sec. 2.2): the Bernoulli edge policy (Eq. 5) and the edge MLP (Eq. 6).

Paper ambiguities and how they are resolved here:
- Eq. 5 sums log sigmoid(l_ij) over "(v_i, v_j) in O". Summed over every pair the term would not depend
  on the sampled structure, so it is read as a sum over the edges of the sampled graph G^(k) (a
  REINFORCE-style likelihood of the present edges, weighted by the utility U in {0, 1}), averaged over
  the K samples. R_s = (1 / |O|) * sum over all allowed pairs of sigmoid(l_ij), with |O| the number of
  agents, as written. Self-loops are excluded by default (`off_diagonal`).
  The paper gives no value for this lambda, and it matters: the expected gradient for l_ij is
  sigmoid(l_ij) (1 - sigmoid(l_ij)) (lambda / N - s_ij), s_ij = P(U = 1 | e_ij in G), so an edge rises iff
  the graphs containing it succeed more often than lambda / N. With lambda << N * (base success rate)
  every edge saturates towards 1, so it is a required argument here; lambda ~ N * base success rate
  makes the edges of better-than-average graphs rise and the rest fall.
- Eq. 6 is trained on "successful trajectories as pseudo-labels" without a stated target. Here a
  trajectory (an agent sequence) labels the rows of the agents it visits: y_ij = 1 if the agent after
  v_i was v_j, else 0, so sigmoid(MLP) estimates P(next = v_j | v_i visited, x, success); rows of agents
  the trajectory never visited carry no label. A row with no 1 says "the successful trajectory ended
  here", so 1 - sum_j p_ij estimates P(stop | v_i, x, success): pi_prior reads STOP from it.
- The first call is a transition too: from the empty history (the orchestrator's state prev = -1) to
  the first agent. `with_start` adds a START source node (index N, embedding e_START = 0, no in-edges)
  whose row is labelled with the trajectory's first agent, so GraphSpec also says where successful
  coordination starts; without it a prior-only system would open with an agent drawn from Z_prior alone.
- The buffer holds "high quality interaction trajectories ... filtering for instances that achieve correct
  reasoning". `keep_cheapest` reads "high quality" as the filter the paper states plus the token cost it
  optimises: of a task's K walks in a round, only the successful ones of least token cost enter the buffer.
  A random walk that succeeds usually also visits agents that did nothing (a bystander before the solver,
  a second solver after it); the cheapest success of K mostly does not, so the MLP learns from the
  interactions that mattered (synthetic pool, with pi_phi's START edges: the prior executed alone,
  "w/o pi_theta", 0.63 -> 0.79 expected accuracy; off in the shipped config because MACA itself did
  worse on fresh seeds; docs/results/maca_synthetic.md).
- Credit (`prior_learning_round(credit=...)`): "sampled" applies Eq. 5 to every edge of G^(k), as
  written; "executed" to the edges the trajectory executed on G^(k), the interactions that actually
  took place. On the synthetic pool a walk uses 1-5 of ~100 sampled edges, so the sampled reading
  credits ~95 edges that did nothing and pi_phi barely learns (walk success 0.28 -> 0.30 in 3 rounds);
  the executed reading credits only the interactions that could have changed the outcome (no longer the
  exact likelihood gradient of G, a lower-variance surrogate). With sparse initial structures (prior.py,
  `init_out_degree`) walks end at varying points, so where successful ones end is informative.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


def off_diagonal(n: int) -> jax.Array:
    """bool [n, n]: every directed pair except self-loops."""
    return ~jnp.eye(n, dtype=bool)


@functools.partial(jax.jit, static_argnames="num_samples")
def sample_edges(key: jax.Array, logits: jax.Array, num_samples: int, edge_mask: jax.Array | None = None) -> jax.Array:
    """G^(k) ~ pi_phi: bool [K, N, N], each allowed edge independently Bernoulli(sigmoid(l_ij))."""
    mask = off_diagonal(logits.shape[-1]) if edge_mask is None else edge_mask
    draws = jax.random.bernoulli(key, jax.nn.sigmoid(logits), (num_samples, *logits.shape))
    return draws & mask


def edge_policy_loss(
    logits: jax.Array,
    edges: jax.Array,
    utility: jax.Array,
    *,
    sparsity_weight: float,
    edge_mask: jax.Array | None = None,
) -> jax.Array:
    """Eq. 5: mean_k[-U_k * sum_{(i,j) in G_k} log sigmoid(l_ij)] + lambda * R_s.

    logits [N, N]; edges bool [K, N, N] (the sampled graphs); utility [K] in {0, 1}.
    """
    n = logits.shape[-1]
    mask = off_diagonal(n) if edge_mask is None else edge_mask
    log_p = jax.nn.log_sigmoid(logits)
    likelihood = jnp.sum(jnp.where(edges & mask, log_p, 0.0), axis=(-2, -1))
    r_s = jnp.sum(jnp.where(mask, jax.nn.sigmoid(logits), 0.0)) / n
    return -jnp.mean(utility * likelihood) + sparsity_weight * r_s


@dataclasses.dataclass
class EdgePolicy:
    """pi_phi with its optimizer state; `update` takes one Eq. 5 gradient step."""

    logits: jax.Array
    tx: optax.GradientTransformation
    opt_state: optax.OptState
    sparsity_weight: float

    @classmethod
    def create(
        cls, n_agents: int, *, sparsity_weight: float, init_logit: float = 0.0, learning_rate: float = 0.1
    ) -> EdgePolicy:
        logits = jnp.full((n_agents, n_agents), init_logit, jnp.float32)
        tx = optax.adam(learning_rate)
        return cls(logits, tx, tx.init(logits), sparsity_weight)

    @property
    def probs(self) -> np.ndarray:
        return np.asarray(jax.nn.sigmoid(self.logits))

    def update(self, edges: jax.Array, utility: jax.Array, edge_mask: jax.Array | None = None) -> float:
        self.logits, self.opt_state, loss = _edge_policy_step(
            self.logits,
            self.opt_state,
            jnp.asarray(edges),
            jnp.asarray(utility, jnp.float32),
            off_diagonal(self.logits.shape[-1]) if edge_mask is None else jnp.asarray(edge_mask),
            self.tx,
            self.sparsity_weight,
        )
        return float(loss)


@functools.partial(jax.jit, static_argnames=("tx", "sparsity_weight"))
def _edge_policy_step(logits, opt_state, edges, utility, edge_mask, tx, sparsity_weight):
    loss, grads = jax.value_and_grad(edge_policy_loss)(
        logits, edges, utility, sparsity_weight=sparsity_weight, edge_mask=edge_mask
    )
    updates, opt_state = tx.update(grads, opt_state, logits)
    return optax.apply_updates(logits, updates), opt_state, loss


class EdgeMLP(nnx.Module):
    """Eq. 6: P(v_i -> v_j | x) = sigmoid(MLP_psi([e_i, e_j, e(x)])).

    The first layer on the concatenation is kept as three blocks (src, dst, task) of one kernel, which
    is the same map, so all N x N pairs are scored without materialising [N, N, 3d] inputs.
    """

    def __init__(self, embed_dim: int, hidden: int = 128, *, rngs: nnx.Rngs):
        self.src = nnx.Linear(embed_dim, hidden, use_bias=True, rngs=rngs)
        self.dst = nnx.Linear(embed_dim, hidden, use_bias=False, rngs=rngs)
        self.task = nnx.Linear(embed_dim, hidden, use_bias=False, rngs=rngs)
        self.hidden = nnx.Linear(hidden, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, 1, rngs=rngs)

    def __call__(self, e_src: jax.Array, e_dst: jax.Array, e_task: jax.Array) -> jax.Array:
        """Logits for broadcastable [..., d] inputs."""
        h = jax.nn.relu(self.src(e_src) + self.dst(e_dst) + self.task(e_task))
        return self.out(jax.nn.relu(self.hidden(h)))[..., 0]

    def pair_logits(self, agent_embs: jax.Array, task_emb: jax.Array) -> jax.Array:
        """[..., N, N] logits of every directed pair for task embeddings [..., d]."""
        e_task = task_emb[..., None, None, :]
        return self(agent_embs[:, None, :], agent_embs[None, :, :], e_task)


def edge_probabilities(mlp: EdgeMLP, agent_embs: np.ndarray, task_emb: np.ndarray) -> np.ndarray:
    """p [N, N] for one task (diagonal included; mask it where self-loops are not allowed)."""
    return np.array(jax.nn.sigmoid(mlp.pair_logits(jnp.asarray(agent_embs), jnp.asarray(task_emb))))


def path_labels(path: Sequence[int], n: int, *, with_start: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(targets, label mask), float [N, N] each ([N + 1, N + 1] `with_start`: node N is START, labelled
    with the first agent; nothing enters START), for one trajectory (see the module docstring)."""
    size = n + 1 if with_start else n
    seq = [n, *path] if with_start and len(path) > 0 else list(path)
    targets = np.zeros((size, size), np.float32)
    rows = np.zeros((size, size), np.float32)
    for i, j in itertools.pairwise(seq):
        targets[i, j] = 1.0
    for i in set(seq):
        rows[i, :n] = 1.0
    np.fill_diagonal(rows, 0.0)
    return targets, rows


def with_start_node(agent_embs: np.ndarray) -> np.ndarray:
    """Agent embeddings [N, d] with the START node's e_START = 0 appended: [N + 1, d]."""
    agent_embs = np.asarray(agent_embs, np.float32)
    return np.concatenate([agent_embs, np.zeros((1, agent_embs.shape[1]), np.float32)])


class SuccessBuffer:
    """The buffer of successful trajectories: (e(x), agent sequence) pairs, oldest dropped first."""

    def __init__(self, capacity: int = 10_000):
        self._items: collections.deque[tuple[np.ndarray, tuple[int, ...]]] = collections.deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, task_emb: np.ndarray, path: Sequence[int], success: bool) -> None:
        """Keeps only successful, non-empty trajectories (the paper's filter for correct reasoning)."""
        if success and len(path) > 0:
            self._items.append((np.asarray(task_emb, np.float32), tuple(int(a) for a in path)))

    def arrays(self, n_agents: int, *, with_start: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(task embeddings [M, d], targets [M, N, N], label masks [M, N, N]; N + 1 nodes `with_start`)."""
        if not self._items:
            raise ValueError("the success buffer is empty: no successful trajectory to learn edges from")
        labels = [path_labels(path, n_agents, with_start=with_start) for _, path in self._items]
        return (
            np.stack([e for e, _ in self._items]),
            np.stack([t for t, _ in labels]),
            np.stack([m for _, m in labels]),
        )


def edge_mlp_loss(
    mlp: EdgeMLP, agent_embs: jax.Array, task_embs: jax.Array, targets: jax.Array, mask: jax.Array
) -> jax.Array:
    """Masked mean binary cross-entropy of the pair logits against trajectory labels."""
    logits = mlp.pair_logits(agent_embs, task_embs)
    bce = optax.sigmoid_binary_cross_entropy(logits, targets)
    return jnp.sum(bce * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def train_edge_mlp(
    mlp: EdgeMLP,
    buffer: SuccessBuffer,
    agent_embs: np.ndarray,
    *,
    steps: int = 300,
    batch_size: int = 64,
    learning_rate: float = 1e-3,
    seed: int = 0,
    with_start: bool = False,
) -> list[float]:
    """Fits psi on the buffer (Algorithm 1, line 6) with Adam, in place; returns every step's loss.
    `with_start`: `agent_embs` [N, d] get the START node appended (see `with_start_node`).

    All steps run in one compiled scan: a Python loop of small steps costs more in dispatch than in maths.
    """
    task_embs, targets, masks = buffer.arrays(len(agent_embs), with_start=with_start)
    if with_start:
        agent_embs = with_start_node(agent_embs)
    rng = np.random.default_rng(seed)
    batch = min(batch_size, len(task_embs))
    batches = np.stack([rng.choice(len(task_embs), size=batch, replace=False) for _ in range(steps)])
    graphdef, params = nnx.split(mlp)
    tx = optax.adam(learning_rate)
    params, losses = _fit_edge_mlp(
        graphdef,
        tx,
        params,
        tx.init(params),
        jnp.asarray(agent_embs, jnp.float32),
        jnp.asarray(task_embs),
        jnp.asarray(targets),
        jnp.asarray(masks),
        jnp.asarray(batches),
    )
    nnx.update(mlp, params)
    return [float(x) for x in np.asarray(losses)]


@functools.partial(jax.jit, static_argnames=("graphdef", "tx"))
def _fit_edge_mlp(graphdef, tx, params, opt_state, agent_embs, task_embs, targets, masks, batches):
    def step(carry, idx):
        params, opt_state = carry

        def loss_fn(p):
            return edge_mlp_loss(nnx.merge(graphdef, p), agent_embs, task_embs[idx], targets[idx], masks[idx])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, _), losses = jax.lax.scan(step, (params, opt_state), batches)
    return params, losses


def prior_learning_round(
    policy: EdgePolicy,
    key: jax.Array,
    task_embs: np.ndarray,
    allowed: np.ndarray,
    execute: Callable[[int, np.ndarray], tuple[Sequence[int], bool]],
    buffer: SuccessBuffer,
    *,
    samples: int = 8,
    credit: str = "sampled",
    keep: bool = True,
    keep_cheapest: bool = False,
    execute_batch: Callable[[Sequence[tuple[int, np.ndarray]]], Sequence[tuple[Sequence[int], bool, int]]]
    | None = None,
) -> float:
    """Algorithm 1, lines 3-5, once over the tasks: for task m sample K structures among its allowed
    (gate-passing) agents, execute each (`execute(m, graph) -> (agent sequence, success, token cost)`), take an
    Eq. 5 step with U = success on the sampled or the executed edges (`credit`, see the module
    docstring), and (if `keep`) keep the successful sequences for the Eq. 6 MLP: all of them, or with
    `keep_cheapest` only the task's cheapest successful ones among its K (the module docstring's "high
    quality" reading). Returns the success rate.

    With `execute_batch` (every (m, graph) of the round -> their results, in order) the round samples every task's
    structures from the policy as it stands at the round's start, executes them all at once, then takes the tasks'
    Eq. 5 steps in order: a mini-batch of the same estimator, for served agents, whose walks then run concurrently
    instead of one after another."""
    if credit not in ("sampled", "executed"):
        raise ValueError(f"credit must be 'sampled' or 'executed', got {credit!r}")

    def sample(m: int, sub: jax.Array) -> tuple[jax.Array, np.ndarray]:
        edge_mask = jnp.asarray(allowed[m][:, None] & allowed[m][None, :]) & off_diagonal(len(allowed[m]))
        return edge_mask, np.asarray(sample_edges(sub, policy.logits, samples, edge_mask))

    def step(m: int, edge_mask: jax.Array, graphs: np.ndarray, runs: Sequence[tuple[Sequence[int], bool, int]]) -> int:
        utility = np.asarray([float(ok) for _, ok, _ in runs], np.float32)
        executed = np.zeros_like(graphs)
        for k, (path, _, _) in enumerate(runs):
            executed[k][tuple(np.asarray(list(itertools.pairwise(path)), int).reshape(-1, 2).T)] = True
        if keep:
            cheapest = min((c for _, ok, c in runs if ok), default=None)
            for path, success, cost in runs:
                buffer.add(task_embs[m], path, bool(success) and (not keep_cheapest or cost == cheapest))
        policy.update(graphs if credit == "sampled" else executed, utility, edge_mask)
        return int(utility.sum())

    successes = 0
    if execute_batch is None:
        for m in range(len(task_embs)):
            key, sub = jax.random.split(key)
            edge_mask, graphs = sample(m, sub)
            runs = [tuple(execute(m, graph)) for graph in graphs]
            successes += step(m, edge_mask, graphs, [(p, bool(ok), c) for p, ok, c in runs])
    else:
        drawn = []
        for m in range(len(task_embs)):
            key, sub = jax.random.split(key)
            drawn.append(sample(m, sub))
        results = list(execute_batch([(m, g) for m, (_, graphs) in enumerate(drawn) for g in graphs]))
        for m, (edge_mask, graphs) in enumerate(drawn):
            runs = [(p, bool(ok), c) for p, ok, c in results[m * samples : (m + 1) * samples]]
            successes += step(m, edge_mask, graphs, runs)
    return successes / (len(task_embs) * samples)
