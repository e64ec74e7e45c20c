"""OPOD = RWR + λ·OPD for the orchestrator policy, its special cases (SFT, RWR = OPOD at λ = 0) and
DA-GRPO, as one resumable training loop over packed decision rows.

OPD (the paper's appendix): the student starts from the SFT weights and is the only model
updated; the teacher is fixed at the SFT weights. At each step the current student samples an
action at each chosen FLAG=true decision context (its own view of the stored context s); the
student scores that action under s and the teacher under s ⊕ H, and the loss is the full-vocabulary
reverse KL(student || sg[teacher]) per token through the chunked fused kernel, averaged within each
decision, then across decisions. RWR is cross-entropy on the decisions of successful trajectories,
averaged the same way. Stored contexts and hints stay fixed; only the sampled actions change.
DA-GRPO samples a group of actions at expert decision contexts, scores each against the expert's
(train.dagrpo), and takes a GRPO step with group-normalized advantages.

Reused from the trainer: train state and shardings (step.init_train_state), optimizer and schedule
(optim), Orbax checkpoints with the data position (checkpoint.Checkpointer), the finite-metrics
guard and progress lines (metrics), HF export (checkpoint.export_hf), and the losses' fused
kernels. The step itself is ours: packed rows carry several decisions each, so per-decision
averaging needs per-token weights and host-side decision counts, which train.step's one-decision-
per-row layout does not express.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax
from ml_collections import ConfigDict

from porch_jax.models import from_pretrained
from porch_jax.models.sampler import Sampler, SamplingParams
from porch_jax.train import checkpoint as ckpt_lib
from porch_jax.train import losses, optim
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import metrics as metrics_lib
from porch_jax.train import step as step_lib
from porch_jax.train.dagrpo import decision_reward
from porch_jax.train.opod_data import (
    ExpertContext,
    OpdRow,
    SeqRow,
    bucket,
    scored_batch,
    seq_batch,
)

log = logging.getLogger(__name__)
Batch = dict[str, Any]
POLICY_FILE = "policy.json"  # written next to an export: the view the policy was trained with


# ---- losses of one batch (pure) ------------------------------------------------------------------


def _gathered(model: nnx.Module, v: Mapping[str, jax.Array]) -> jax.Array:
    hidden = model.hidden_states(v["tokens"], attention_mask=v["mask"])
    return jnp.take_along_axis(hidden, v["index"][..., None], axis=1)


def _head(model: nnx.Module) -> jax.Array:
    return model.lm_head_kernel().astype(model.dtype)


def batch_parts(
    model: nnx.Module, teacher: nnx.Module | None, batch: Batch, *, clip_eps: float = 0.2
) -> tuple[dict[str, tuple[jax.Array, jax.Array]], dict[str, jax.Array]]:
    """(sum, count) of each loss part present in ``batch`` and extra metrics.

    "ce": packed rows (SFT; RWR when the rows hold successful episodes' decisions), per-token
    weights (decision weight / its length), count = decisions.
    "student"/"teacher": one sampled action per row under s and s ⊕ H; reverse KL per decision.
    "group": one sampled action per row with its group-normalized "advantage"; GRPO per decision.
    """
    head, parts, extra = _head(model), {}, {}
    if "ce" in batch:
        v = batch["ce"]
        total, _ = losses.token_cross_entropy_from_hidden(
            _gathered(model, v), head, v["targets"], v["target_mask"], v["weight"], aggregation="token"
        )
        parts["ce"] = (total, v["count"])
    if "student" in batch:
        s, t = batch["student"], batch["teacher"]
        hs = _gathered(model, s)
        ht = lax.stop_gradient(_gathered(teacher, t))
        parts["opd"] = losses.opd_loss_from_hidden(
            hs, head, ht, lax.stop_gradient(_head(teacher)), s["target_mask"], aggregation="decision"
        )
        logp = losses.token_logprobs_from_hidden(lax.stop_gradient(hs), lax.stop_gradient(head), s["targets"])
        gap = jnp.where(s["target_mask"], jnp.abs(logp - s["logprobs"]), 0.0)
        extra["logprob_gap"] = losses.safe_mean(jnp.sum(gap), jnp.sum(s["target_mask"], dtype=jnp.float32))
    if "group" in batch:
        g = batch["group"]
        logp = losses.token_logprobs_from_hidden(_gathered(model, g), head, g["targets"])
        total, count, m = losses.grpo_loss(
            logp, g["logprobs"], None, g["advantage"], g["target_mask"], clip_eps=clip_eps, aggregation="sequence"
        )
        parts["pg"] = (total, count)
        extra["clip_fraction"] = m["clip_fraction"]
    return parts, extra


def combine(parts: Mapping[str, tuple[jax.Array, jax.Array]], opd_weight: float) -> jax.Array:
    """L = l_RWR + λ·l_OPD (+ l_PG): each part is its own mean; an empty part adds 0."""
    coef = {"ce": 1.0, "opd": opd_weight, "pg": 1.0}
    return sum((coef[k] * losses.safe_mean(*v) for k, v in parts.items()), jnp.zeros((), jnp.float32))


# ---- the loop ----------------------------------------------------------------------------------------

BatchFn = Callable[[int, nnx.Module], tuple[Batch, dict[str, float]]]


class PolicyTrainer:
    """Trains the policy in ``init_dir`` (an HF folder with its tokenizer) into ``workdir``.

    ``cfg``: steps, learning_rate, warmup_steps, final_lr_ratio, weight_decay, b1, b2, eps,
    max_grad_norm, opd_weight (λ), clip_eps, checkpoint_every, log_every, export_every. A rerun resumes
    from the newest checkpoint; ``run`` ends with an HF export in ``workdir/export`` (+ policy.json) and,
    with ``export_every`` > 0, also exports every that many steps before the last to
    ``workdir/exports/step_N``: with the final export (its ``policy.json`` records its step) these are the
    candidates of checkpoint selection on validation tasks (`selection_candidates`).
    ``teacher=True`` keeps a frozen copy of the initial weights (OPD's self-teacher).
    """

    def __init__(
        self,
        init_dir: str | Path,
        workdir: str | Path,
        cfg: ConfigDict,
        *,
        teacher: bool = False,
        stream: TextIO = sys.stdout,
    ):
        from transformers import AutoTokenizer

        self.cfg, self.workdir, self.stream = cfg, Path(workdir), stream
        self.tokenizer = AutoTokenizer.from_pretrained(str(init_dir))
        self.view = (
            json.loads((Path(init_dir) / POLICY_FILE).read_text())["view"]
            if (Path(init_dir) / POLICY_FILE).is_file()
            else cfg.get("view", "full")
        )
        model = from_pretrained(init_dir)
        self.mesh = mesh_lib.make_mesh(tuple(cfg.get("mesh", (1, 1, 1))))
        opt_cfg = ConfigDict({**cfg.to_dict(), "total_steps": cfg.steps})
        self.schedule, tx = optim.learning_rate_schedule(opt_cfg), optim.make_optimizer(opt_cfg)
        self.graphdef, self.state, _ = step_lib.init_train_state(model, tx, self.mesh)
        self.teacher = jax.tree.map(lambda x: x.copy(), self.state["params"]) if teacher else None
        self.checkpointer = ckpt_lib.Checkpointer(self.workdir / "checkpoints", keep=1, async_save=False)
        restored = self.checkpointer.restore_latest(step_lib.abstract_train_state(model, tx, self.mesh))
        self.start_step = 0
        if restored is not None:
            self.start_step, self.state, _ = restored
        self.student = nnx.merge(self.graphdef, self.state["params"])
        self._rows = jax.sharding.NamedSharding(
            self.mesh, jax.sharding.PartitionSpec(mesh_lib.batch_spec(mesh=self.mesh)[1])
        )
        self._step = jax.jit(self._step_impl, donate_argnums=(0,))
        self._tx = tx

    def _step_impl(self, state: step_lib.TrainState, batch: Batch, teacher: nnx.State | None):
        teacher_model = None if teacher is None else nnx.merge(self.graphdef, teacher)

        def loss_fn(params):
            parts, extra = batch_parts(
                nnx.merge(self.graphdef, params), teacher_model, batch, clip_eps=float(self.cfg.get("clip_eps", 0.2))
            )
            return combine(parts, float(self.cfg.get("opd_weight", 0.0))), (parts, extra)

        (loss, (parts, extra)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = self._tx.update(grads, state["opt_state"], state["params"])
        metrics = {
            "loss": loss,
            "grad_norm": optax.global_norm(grads),
            "update_norm": optax.global_norm(updates),
            "learning_rate": self.schedule(state["step"]),
            **extra,
        }
        for k, (total, count) in parts.items():
            metrics[k], metrics[f"{k}_count"] = losses.safe_mean(total, count), count
        params = optax.apply_updates(state["params"], updates)
        return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

    @property
    def export_dir(self) -> Path:
        return self.workdir / "export"

    def run(self, batch_fn: BatchFn, *, name: str = "train") -> list[dict[str, float]]:
        """Steps start_step+1..cfg.steps; ``batch_fn(step, student)`` builds each host batch (the
        student holds the current weights, for on-policy sampling). Returns this run's metrics."""
        total, every = int(self.cfg.steps), int(self.cfg.get("checkpoint_every", 50))
        export_every = int(self.cfg.get("export_every", 0))
        log = self.workdir / "metrics.jsonl"
        _truncate_log(log, self.start_step)
        logger = metrics_lib.MetricsLogger(None, total, every=int(self.cfg.get("log_every", 10)), stream=self.stream)
        if self.start_step:
            logger.text(f"[{name}] resumed from step {self.start_step}")
        history, last_good = [], self.start_step or None
        config = self.cfg.to_dict()
        try:
            for step in range(self.start_step + 1, total + 1):
                nnx.update(self.student, self.state["params"])
                host, host_metrics = batch_fn(step, self.student)
                batch = jax.tree.map(lambda x: jax.device_put(x, self._rows if np.ndim(x) else None), host)
                with jax.set_mesh(self.mesh):  # as TrainStep: `sharding.constrain` and the kernels see the mesh
                    self.state, metrics = self._step(self.state, batch, self.teacher)
                metrics = {k: float(v) for k, v in jax.device_get(metrics).items()} | host_metrics
                metrics_lib.check_finite(step, metrics, last_good)
                history.append(logger.log(step, metrics))
                with open(log, "a") as f:
                    f.write(json.dumps({"step": step, **history[-1]}) + "\n")
                if export_every and step % export_every == 0 and step < total:  # the last is the final export
                    self.export(self.candidate_dir(step), step=step)
                if step % every == 0 or step == total:
                    self.checkpointer.save(step, self.state, {"step": step}, config)
                    last_good = step
        finally:
            self.checkpointer.close()
            logger.close()
        self.export(step=total)
        return history

    def candidate_dir(self, step: int) -> Path:
        return self.workdir / "exports" / f"step_{step}"

    def export(self, path: str | Path | None = None, *, step: int | None = None) -> Path:
        """The current weights as an HF folder with the tokenizer and the policy's view (and the step)."""
        out = ckpt_lib.export_hf(self.graphdef, self.state["params"], path or self.export_dir, self.tokenizer)
        (out / POLICY_FILE).write_text(json.dumps({"view": self.view} | ({} if step is None else {"step": step})))
        return out


def selection_candidates(export: str | Path) -> dict[int, Path]:
    """A run's checkpoint-selection candidates by step: its ``exports/step_N`` folders (``export_every``) and,
    when there are any, the final ``export`` folder under the step its ``policy.json`` records."""
    export = Path(export)
    folder = export.parent / "exports"
    found = {int(p.name.split("_", 1)[1]): p for p in folder.glob("step_*") if (p / POLICY_FILE).is_file()}
    final = json.loads((export / POLICY_FILE).read_text()).get("step") if (export / POLICY_FILE).is_file() else None
    if found and final is not None:
        found[int(final)] = export
    return dict(sorted(found.items()))


def _truncate_log(path: Path, step: int) -> None:
    """Drop logged steps after the checkpoint a run resumes from (they will be run again)."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))


# ---- batch sources -----------------------------------------------------------------------------------


def _fitting(items: Sequence[Any], length: Callable[[Any], int], limit: int) -> list[Any]:
    """The items within the largest bucket; the rest are left out with a warning, never cut."""
    kept = [x for x in items if length(x) <= limit]
    if len(kept) < len(items):
        log.warning(
            "%d of %d rows exceed the largest bucket (%d tokens); left out", len(items) - len(kept), len(items), limit
        )
    return kept


def _targets_bucket(n: int, step: int = 64) -> int:
    return -(-n // step) * step


class PackedSource:
    """Batches of packed rows, grouped by length bucket so each step compiles once per bucket.

    The batch of step ``s`` is a pure function of (seed, s): a resumed run sees the same batches.
    """

    def __init__(self, rows: Sequence[SeqRow], batch_size: int, buckets: Sequence[int], seed: int):
        rows = _fitting(rows, lambda r: len(r.tokens), max(buckets))
        if not rows:
            raise ValueError("no rows to train on")
        groups: dict[int, list[SeqRow]] = {}
        for r in rows:
            groups.setdefault(bucket(len(r.tokens), buckets), []).append(r)
        self.groups = sorted(groups.items())
        self.targets = {t: _targets_bucket(max(sum(s.length for s in r.spans) for r in g)) for t, g in self.groups}
        self.batch_size, self.seed = batch_size, seed

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, step])
        sizes = np.asarray([len(g) for _, g in self.groups], np.float64)
        t, group = self.groups[rng.choice(len(self.groups), p=sizes / sizes.sum())]
        pick = rng.choice(len(group), min(self.batch_size, len(group)), replace=False)
        rows = [group[i] for i in pick]
        return seq_batch(rows + [SeqRow((0,), ())] * (self.batch_size - len(rows)), t, self.targets[t])


def sample_actions(sampler: Sampler, prompts: Sequence[Sequence[int]], cfg: ConfigDict, seed: int) -> list[Any]:
    params = SamplingParams(
        max_new_tokens=int(cfg.max_new_tokens),
        temperature=float(cfg.temperature),
        top_p=float(cfg.get("top_p", 1.0)),
        seed=seed,
    )
    return sampler.generate([list(p) for p in prompts], params)


class OpdSource:
    """OPD rows of step ``s``: chosen by (seed, s); the action is sampled by the current student."""

    def __init__(self, rows: Sequence[OpdRow], tokenizer: Any, cfg: ConfigDict, buckets: Sequence[int]):
        rows = _fitting(rows, lambda r: max(len(r.student), len(r.teacher)), max(buckets))
        if not rows:
            raise ValueError("no attributable decisions (FLAG=true) to distill")
        self.rows, self.cfg, self.buckets = rows, cfg, tuple(buckets)
        self.k = _targets_bucket(int(cfg.max_new_tokens) + 1, 32)
        longest = max(max(len(r.student), len(r.teacher)) for r in rows)
        self.sampler: Sampler | None = None
        self._sampler_args = dict(
            tokenizer=tokenizer,
            max_len=bucket(longest, buckets) + self.k,
            prompt_buckets=buckets,
            batch_buckets=(int(cfg.batch),),
        )

    def __call__(self, step: int, student: nnx.Module) -> tuple[dict[str, Any], dict[str, float]]:
        if self.sampler is None or self.sampler.model is not student:
            self.sampler = Sampler(student, **self._sampler_args)
        rng = np.random.default_rng([int(self.cfg.seed), step])
        rows = [
            self.rows[i] for i in rng.choice(len(self.rows), min(int(self.cfg.batch), len(self.rows)), replace=False)
        ]
        done = sample_actions(self.sampler, [r.student for r in rows], self.cfg, int(self.cfg.seed) * 1_000_003 + step)
        # A sample that is no action at all is dropped (OpdRow says why): an empty action scores nothing.
        keep = [r.is_action is None or r.is_action(c.text) for r, c in zip(rows, done)]
        actions = [c.token_ids if k else [] for c, k in zip(done, keep)]
        t_s = bucket(max(len(r.student) for r in rows), self.buckets) + self.k
        t_t = bucket(max(len(r.teacher) for r in rows), self.buckets) + self.k
        student = scored_batch(
            [r.student for r in rows], actions, t_s, self.k, [c.logprobs if k else [] for c, k in zip(done, keep)]
        )
        teacher = scored_batch([r.teacher for r in rows], actions, t_t, self.k)
        stats = {
            "sampled_tokens": float(np.mean([len(c.token_ids) for c in done])),
            "sampled_stopped": float(np.mean([c.finish_reason == "stop" for c in done])),
            "sampled_not_action": 1.0 - float(np.mean(keep)),
        }
        return {"student": student, "teacher": teacher}, stats


def opod_batches(ce: Callable[[int], dict[str, np.ndarray]] | None, opd: OpdSource | None) -> BatchFn:
    """OPOD's batch: a packed RWR (or SFT) batch and a freshly sampled OPD batch (either may be absent)."""

    def make(step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        batch, stats = {}, {}
        if ce is not None:
            batch["ce"] = ce(step)
        if opd is not None:
            part, stats = opd(step, student)
            batch.update(part)
        return batch, stats | {"tokens": _tokens(batch)}

    return make


def _tokens(batch: Batch) -> float:
    return float(sum(np.sum(v["mask"]) for v in batch.values() if isinstance(v, dict)))


class GroupSource:
    """DA-GRPO: ``contexts_per_step`` expert contexts, ``group_size`` samples each, scored against the expert."""

    def __init__(
        self,
        contexts: Sequence[ExpertContext],
        tokenizer: Any,
        cfg: ConfigDict,
        buckets: Sequence[int],
        available_tools: Collection[str],
    ):
        contexts = _fitting(contexts, lambda c: len(c.prompt), max(buckets))
        if not contexts:
            raise ValueError("no expert decision contexts")
        self.contexts, self.cfg, self.buckets, self.tools = contexts, cfg, tuple(buckets), tuple(available_tools)
        self.k = _targets_bucket(int(cfg.max_new_tokens) + 1, 32)
        rows = int(cfg.contexts_per_step) * int(cfg.group_size)
        longest = max(len(c.prompt) for c in contexts)
        self._sampler_args = dict(
            tokenizer=tokenizer,
            max_len=bucket(longest, buckets) + self.k,
            prompt_buckets=buckets,
            batch_buckets=(rows,),
        )
        self.sampler: Sampler | None = None

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        if self.sampler is None or self.sampler.model is not student:
            self.sampler = Sampler(student, **self._sampler_args)
        cfg, g = self.cfg, int(self.cfg.group_size)
        rng = np.random.default_rng([int(cfg.seed), step])
        chosen = [self.contexts[i] for i in rng.choice(len(self.contexts), int(cfg.contexts_per_step), replace=False)]
        prompts = [c.prompt for c in chosen for _ in range(g)]
        done = sample_actions(self.sampler, prompts, cfg, int(cfg.seed) * 1_000_003 + step)
        texts = [c.decode(d.text) if c.decode else d.text for c, d in zip([c for c in chosen for _ in range(g)], done)]
        rewards = np.asarray(
            [
                decision_reward(t, c.reference, self.tools)["reward"]
                for c, t in zip([c for c in chosen for _ in range(g)], texts)
            ],
            np.float32,
        )
        advantages = np.asarray(losses.group_advantages(rewards.reshape(-1, g))).reshape(-1)
        t = bucket(max(len(p) for p in prompts), self.buckets) + self.k
        group = scored_batch(prompts, [d.token_ids for d in done], t, self.k, [d.logprobs for d in done])
        group["advantage"] = advantages.astype(np.float32)
        return {"group": group}, {
            "reward": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "tokens": float(group["mask"].sum()),
        }
