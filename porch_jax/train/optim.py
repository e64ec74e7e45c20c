"""Optimizer: AdamW with linear warmup, cosine decay and global-norm clipping.

Weight decay skips vectors (norm weights, biases): decaying a norm's scale toward zero fights the
normalization it exists for.
"""

from __future__ import annotations

from typing import Any

import jax
import optax


def learning_rate_schedule(cfg: Any, total_steps: int | None = None) -> optax.Schedule:
    """0 -> learning_rate over warmup_steps, then cosine to learning_rate * final_lr_ratio at total_steps
    (the argument, else cfg.total_steps). cfg: an `OptimizerConfig` or any object with its attributes."""
    warmup = int(cfg.warmup_steps)
    total = max(int(cfg.total_steps if total_steps is None else total_steps), warmup + 1)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=float(cfg.learning_rate),
        warmup_steps=warmup,
        decay_steps=total,
        end_value=float(cfg.learning_rate) * float(cfg.final_lr_ratio),
    )


def _decay_mask(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: Any, total_steps: int | None = None) -> optax.GradientTransformation:
    """cfg: learning_rate, warmup_steps, final_lr_ratio, weight_decay, b1, b2, eps, max_grad_norm (and
    total_steps unless given)."""
    tx = optax.adamw(
        learning_rate_schedule(cfg, total_steps),
        b1=float(cfg.b1),
        b2=float(cfg.b2),
        eps=float(cfg.eps),
        weight_decay=float(cfg.weight_decay),
        mask=_decay_mask,
    )
    if cfg.max_grad_norm:
        tx = optax.chain(optax.clip_by_global_norm(float(cfg.max_grad_norm)), tx)
    return tx
