"""LM-head losses fused with the output projection, chunked over tokens.

Why: at vocab 151,936 one fp32 logits row costs 0.6 MB, so 4,096 tokens of student *and* teacher
logits (plus their softmaxes and gradients) need ~10 GB. These kernels take hidden states and the
head matrix instead of logits, scan over chunks of tokens, and never hold more than one chunk's
[chunk, vocab] logits (the idea of MaxText's vocabulary tiling and Liger-Kernel's fused linear
JSD; written here from the maths, not copied).

Contract: ``logits = hidden @ head`` with ``hidden [N, H]`` and ``head [H, V]`` (what
``Qwen3.lm_head_kernel()`` returns). The matmul runs in the head's dtype with fp32 accumulation;
softmax, KL and cross-entropy run in fp32. Gradients come back in the inputs' dtypes.

Every scalar loss returns ``(sum, count) = (sum_i mask_i * loss_i, sum_i mask_i)`` as float32.
``mask`` may hold non-negative per-token weights instead of 0/1; e.g. ``1 / tokens_in_decision``
turns the sum into a sum of per-decision means and the count into the number of decisions
(see ``losses.aggregation_weights``). A weight or mask never receives a gradient.

Two backward strategies for the scalar losses (``grad_in_forward``):

- ``True`` (default, Liger style): under differentiation the forward already forms each chunk's
  logits gradient and folds it into d_hidden and d_head; the backward only scales them by the
  incoming (scalar) cotangent. Same four matmuls as the unfused loss (student and teacher logits,
  d_hidden, d_head).
- ``False`` (MaxText style): the forward keeps three floats per token (KL, two logsumexps); the
  backward recomputes each chunk's student and teacher logits: six matmuls instead of four.

Both keep the same peak memory (the head-sized gradient accumulator is needed either way);
without differentiation only the loss is computed. ``benchmarks/bench_reverse_kl_memory.py``
measures them against the unfused loss.

Chunks are strided (chunk c holds tokens c, c + C, c + 2C, ...), so a token axis sharded in
contiguous blocks keeps its sharding inside every chunk instead of being scanned over.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from porch_jax.models.layers import transposed

Array = jax.Array

# About 64 M logits (256 MiB in fp32) per [chunk, vocab] array when the chunk size is automatic:
# on CPU each chunk re-reads the whole head, so fewer, larger chunks are faster (benchmarks/).
_AUTO_CHUNK_ELEMENTS = 1 << 26


def auto_chunk_size(num_tokens: int, vocab_size: int) -> int:
    """A power-of-two chunk holding at most ~64 M logits, never larger than needed."""
    cap = max(8, _AUTO_CHUNK_ELEMENTS // max(vocab_size, 1))
    chunk = 1 << (cap.bit_length() - 1)
    return max(1, min(chunk, num_tokens))


def _resolve_chunk(num_tokens: int, vocab_size: int, chunk_size: int | None) -> int:
    if chunk_size is None:
        return auto_chunk_size(num_tokens, vocab_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return min(chunk_size, max(num_tokens, 1))


def _to_chunks(x: Array, chunk: int) -> Array:
    """[N, ...] -> [C, chunk, ...], zero-padded, strided: row a of chunk c is token a * C + c."""
    n = x.shape[0]
    num_chunks = -(-n // chunk)
    pad = num_chunks * chunk - n
    if pad:
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return jnp.swapaxes(x.reshape((chunk, num_chunks) + x.shape[1:]), 0, 1)


def _from_chunks(xc: Array, n: int) -> Array:
    """Inverse of ``_to_chunks`` (drops the padding)."""
    x = jnp.swapaxes(xc, 0, 1)
    return x.reshape((-1,) + x.shape[2:])[:n]


def _logits(h: Array, w: Array) -> Array:
    """[c, H] @ [H, V] in the head's dtype, accumulated and returned in fp32."""
    return lax.dot_general(h.astype(w.dtype), w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _d_hidden(gz: Array, w: Array) -> Array:
    """gz [c, V] @ w.T -> [c, H] in fp32."""
    return lax.dot_general(gz.astype(w.dtype), w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _d_head(h: Array, gz: Array, w: Array) -> Array:
    """h.T @ gz -> [H, V] in fp32, with h.T written out: XLA:CPU runs a dot contracting both operands'
    major axis slowly, and in bf16 upcasts it to f32 (layers.row_major)."""
    return lax.dot_general(
        transposed(h.astype(w.dtype)),
        gz.astype(w.dtype),
        (((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32,
    )


def _dtype_tag(x: Array) -> Array:
    """An empty array that carries x's dtype through custom_vjp residuals (dtypes can't)."""
    return jnp.zeros((0,), x.dtype)


def _check_pair(hidden: Array, head: Array, name: str) -> None:
    if hidden.ndim != 2 or head.ndim != 2 or hidden.shape[1] != head.shape[0]:
        raise ValueError(f"{name}: expected hidden [N, H] and head [H, V], got {hidden.shape} and {head.shape}")


def _check_mask(mask: Array, n: int, name: str) -> None:
    if mask.shape != (n,):
        raise ValueError(f"{name}: expected mask of shape ({n},), got {mask.shape}")


# --------------------------------------------------------------------------------------------
# Reverse KL(student || teacher), full vocabulary.
# --------------------------------------------------------------------------------------------


def _kl_rows(zs: Array, zt: Array) -> tuple[Array, Array, Array, Array, Array]:
    """Per-row KL(p_s || p_t) from fp32 logits, with the pieces its gradient needs."""
    lse_s = jax.nn.logsumexp(zs, axis=-1)
    lse_t = jax.nn.logsumexp(zt, axis=-1)
    lps = zs - lse_s[:, None]
    diff = lps - (zt - lse_t[:, None])
    ps = jnp.exp(lps)
    kl = jnp.sum(ps * diff, axis=-1)
    return kl, ps, diff, lse_s, lse_t


def _kl_grad_logits(ps: Array, diff: Array, kl: Array, row_scale: Array) -> Array:
    """d KL_row / d z_s = p_s * (log p_s - log p_t - KL_row), scaled per row."""
    return row_scale[:, None] * ps * (diff - kl[:, None])


def _kl_value(sh, sw, th, tw, mask, chunk):
    def body(acc, xs):
        hs, ht, m = xs
        kl = _kl_rows(_logits(hs, sw), _logits(ht, tw))[0]
        return acc + jnp.sum(m * kl), None

    xs = (_to_chunks(sh, chunk), _to_chunks(th, chunk), _to_chunks(mask, chunk))
    total, _ = lax.scan(body, jnp.zeros((), jnp.float32), xs)
    return total


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _fused_kl(sh, sw, th, tw, mask, chunk, grad_in_forward):
    return _kl_value(sh, sw, th, tw, mask, chunk)


def _fused_kl_fwd(sh, sw, th, tw, mask, chunk, grad_in_forward):
    xs = (_to_chunks(sh, chunk), _to_chunks(th, chunk), _to_chunks(mask, chunk))
    if grad_in_forward:

        def body(carry, xs_c):
            acc, dw = carry
            hs, ht, m = xs_c
            kl, ps, diff, _, _ = _kl_rows(_logits(hs, sw), _logits(ht, tw))
            gz = _kl_grad_logits(ps, diff, kl, m)
            return (acc + jnp.sum(m * kl), dw + _d_head(hs, gz, sw)), _d_hidden(gz, sw)

        init = (jnp.zeros((), jnp.float32), jnp.zeros(sw.shape, jnp.float32))
        (total, dw), dh = lax.scan(body, init, xs)
        return total, (_from_chunks(dh, sh.shape[0]), dw, _dtype_tag(sh), _dtype_tag(sw))

    def body(acc, xs_c):
        hs, ht, m = xs_c
        kl, _, _, lse_s, lse_t = _kl_rows(_logits(hs, sw), _logits(ht, tw))
        return acc + jnp.sum(m * kl), (kl, lse_s, lse_t)

    total, rows = lax.scan(body, jnp.zeros((), jnp.float32), xs)
    return total, (sh, sw, th, tw, mask, rows)


def _fused_kl_bwd(chunk, grad_in_forward, res, g):
    if grad_in_forward:
        dh, dw, h_tag, w_tag = res
        return ((g * dh).astype(h_tag.dtype), (g * dw).astype(w_tag.dtype), None, None, None)

    sh, sw, th, tw, mask, (kl, lse_s, lse_t) = res

    def body(dw, xs_c):
        hs, ht, m, kl_c, ls_c, lt_c = xs_c
        lps = _logits(hs, sw) - ls_c[:, None]
        diff = lps - (_logits(ht, tw) - lt_c[:, None])
        gz = _kl_grad_logits(jnp.exp(lps), diff, kl_c, g * m)
        return dw + _d_head(hs, gz, sw), _d_hidden(gz, sw)

    xs = (_to_chunks(sh, chunk), _to_chunks(th, chunk), _to_chunks(mask, chunk), kl, lse_s, lse_t)
    dw, dh = lax.scan(body, jnp.zeros(sw.shape, jnp.float32), xs)
    dh = _from_chunks(dh, sh.shape[0])
    return (dh.astype(sh.dtype), dw.astype(sw.dtype), None, None, None)


_fused_kl.defvjp(_fused_kl_fwd, _fused_kl_bwd)


def chunked_reverse_kl(
    student_hidden: Array,
    student_head: Array,
    teacher_hidden: Array,
    teacher_head: Array,
    mask: Array,
    *,
    chunk_size: int | None = None,
    grad_in_forward: bool = True,
) -> tuple[Array, Array]:
    """Masked sum over tokens of full-vocabulary KL(p_student || sg[p_teacher]), and the mask sum.

    Args:
      student_hidden, teacher_hidden: [N, H] final hidden states of the same N scored tokens
        (each under its own context).
      student_head, teacher_head: [H, V] output projections.
      mask: [N] 0/1 mask or non-negative per-token weights.
      chunk_size: tokens per chunk; ``None`` picks ~64 M logits per chunk.
      grad_in_forward: backward strategy (see the module docstring).

    Returns:
      ``(sum_i mask_i * KL_i, sum_i mask_i)``, float32 scalars. Gradients flow to the student
      hidden states and head only; the teacher is behind a stop-gradient.
    """
    _check_pair(student_hidden, student_head, "student")
    _check_pair(teacher_hidden, teacher_head, "teacher")
    n = student_hidden.shape[0]
    if teacher_hidden.shape[0] != n or teacher_head.shape[1] != student_head.shape[1]:
        raise ValueError(
            "student and teacher must score the same tokens over the same vocabulary: "
            f"hidden {student_hidden.shape} vs {teacher_hidden.shape}, "
            f"head {student_head.shape} vs {teacher_head.shape}"
        )
    _check_mask(mask, n, "chunked_reverse_kl")
    mask = lax.stop_gradient(mask.astype(jnp.float32))
    chunk = _resolve_chunk(n, student_head.shape[1], chunk_size)
    total = _fused_kl(
        student_hidden,
        student_head,
        lax.stop_gradient(teacher_hidden),
        lax.stop_gradient(teacher_head),
        mask,
        chunk,
        bool(grad_in_forward),
    )
    return total, jnp.sum(mask)


# --------------------------------------------------------------------------------------------
# Token cross-entropy (SFT / RWR).
# --------------------------------------------------------------------------------------------


def _target_logit(z: Array, targets: Array) -> Array:
    """z[i, targets[i]]; NaN for an id outside [0, V), so a bad target is never silent."""
    vocab = z.shape[-1]
    valid = (targets >= 0) & (targets < vocab)
    picked = jnp.take_along_axis(z, jnp.clip(targets, 0, vocab - 1)[:, None], axis=-1)[:, 0]
    return jnp.where(valid, picked, jnp.nan)


def _one_hot_grad(z: Array, lse: Array, targets: Array, row_scale: Array) -> Array:
    """row_scale * (softmax(z) - onehot(target)): d CE_row / d z, scaled per row."""
    hit = lax.broadcasted_iota(jnp.int32, z.shape, 1) == targets[:, None]
    return row_scale[:, None] * (jnp.exp(z - lse[:, None]) - hit.astype(jnp.float32))


def _safe_targets(targets: Array, mask: Array) -> Array:
    """Masked-out positions may hold any id (e.g. -100): point them at id 0."""
    return jnp.where(mask != 0, targets, 0).astype(jnp.int32)


def _ce_value(h, w, targets, mask, chunk):
    def body(acc, xs):
        hc, tc, m = xs
        z = _logits(hc, w)
        ce = jax.nn.logsumexp(z, axis=-1) - _target_logit(z, tc)
        return acc + jnp.sum(jnp.where(m != 0, m * ce, 0.0)), None

    xs = (_to_chunks(h, chunk), _to_chunks(targets, chunk), _to_chunks(mask, chunk))
    total, _ = lax.scan(body, jnp.zeros((), jnp.float32), xs)
    return total


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fused_ce(h, w, targets, mask, chunk, grad_in_forward):
    return _ce_value(h, w, targets, mask, chunk)


def _fused_ce_fwd(h, w, targets, mask, chunk, grad_in_forward):
    xs = (_to_chunks(h, chunk), _to_chunks(targets, chunk), _to_chunks(mask, chunk))
    if grad_in_forward:

        def body(carry, xs_c):
            acc, dw = carry
            hc, tc, m = xs_c
            z = _logits(hc, w)
            lse = jax.nn.logsumexp(z, axis=-1)
            ce = lse - _target_logit(z, tc)
            gz = _one_hot_grad(z, lse, tc, m)
            acc = acc + jnp.sum(jnp.where(m != 0, m * ce, 0.0))
            return (acc, dw + _d_head(hc, gz, w)), _d_hidden(gz, w)

        init = (jnp.zeros((), jnp.float32), jnp.zeros(w.shape, jnp.float32))
        (total, dw), dh = lax.scan(body, init, xs)
        return total, (_from_chunks(dh, h.shape[0]), dw, _dtype_tag(h), _dtype_tag(w))

    def body(acc, xs_c):
        hc, tc, m = xs_c
        z = _logits(hc, w)
        lse = jax.nn.logsumexp(z, axis=-1)
        ce = lse - _target_logit(z, tc)
        return acc + jnp.sum(jnp.where(m != 0, m * ce, 0.0)), lse

    total, lse = lax.scan(body, jnp.zeros((), jnp.float32), xs)
    return total, (h, w, targets, mask, lse)


def _fused_ce_bwd(chunk, grad_in_forward, res, g):
    if grad_in_forward:
        dh, dw, h_tag, w_tag = res
        return ((g * dh).astype(h_tag.dtype), (g * dw).astype(w_tag.dtype), None, None)

    h, w, targets, mask, lse = res

    def body(dw, xs_c):
        hc, tc, m, lse_c = xs_c
        gz = _one_hot_grad(_logits(hc, w), lse_c, tc, g * m)
        return dw + _d_head(hc, gz, w), _d_hidden(gz, w)

    xs = (_to_chunks(h, chunk), _to_chunks(targets, chunk), _to_chunks(mask, chunk), lse)
    dw, dh = lax.scan(body, jnp.zeros(w.shape, jnp.float32), xs)
    return (_from_chunks(dh, h.shape[0]).astype(h.dtype), dw.astype(w.dtype), None, None)


_fused_ce.defvjp(_fused_ce_fwd, _fused_ce_bwd)


def chunked_token_cross_entropy(
    hidden: Array,
    head: Array,
    targets: Array,
    mask: Array,
    *,
    chunk_size: int | None = None,
    grad_in_forward: bool = True,
) -> tuple[Array, Array]:
    """Masked sum over tokens of -log softmax(hidden @ head)[target], and the mask sum.

    Args:
      hidden: [N, H]; head: [H, V]; targets: [N] int ids (any value where mask is 0).
      mask: [N] 0/1 mask or non-negative per-token weights (e.g. RWR weights).

    Returns ``(sum_i mask_i * CE_i, sum_i mask_i)`` as float32 scalars.
    """
    _check_pair(hidden, head, "chunked_token_cross_entropy")
    n = hidden.shape[0]
    _check_mask(mask, n, "chunked_token_cross_entropy")
    if targets.shape != (n,):
        raise ValueError(f"chunked_token_cross_entropy: targets {targets.shape} != ({n},)")
    mask = lax.stop_gradient(mask.astype(jnp.float32))
    chunk = _resolve_chunk(n, head.shape[1], chunk_size)
    targets = _safe_targets(targets, mask)
    total = _fused_ce(hidden, head, targets, mask, chunk, bool(grad_in_forward))
    return total, jnp.sum(mask)


# --------------------------------------------------------------------------------------------
# Per-token log-probabilities (GRPO, sampler/trainer log-prob gap).
# --------------------------------------------------------------------------------------------


def _logprob_rows(h, w, targets, chunk):
    def body(_, xs):
        hc, tc = xs
        z = _logits(hc, w)
        lse = jax.nn.logsumexp(z, axis=-1)
        return None, (_target_logit(z, tc) - lse, lse)

    _, (lp, lse) = lax.scan(body, None, (_to_chunks(h, chunk), _to_chunks(targets, chunk)))
    return lp, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused_logprobs(h, w, targets, chunk):
    return _from_chunks(_logprob_rows(h, w, targets, chunk)[0], h.shape[0])


def _fused_logprobs_fwd(h, w, targets, chunk):
    lp, lse = _logprob_rows(h, w, targets, chunk)
    return _from_chunks(lp, h.shape[0]), (h, w, targets, lse)


def _fused_logprobs_bwd(chunk, res, g):
    h, w, targets, lse = res

    def body(dw, xs_c):
        hc, tc, lse_c, g_c = xs_c
        gz = -_one_hot_grad(_logits(hc, w), lse_c, tc, g_c)  # d logp / d z = onehot - softmax
        return dw + _d_head(hc, gz, w), _d_hidden(gz, w)

    xs = (_to_chunks(h, chunk), _to_chunks(targets, chunk), lse, _to_chunks(g, chunk))
    dw, dh = lax.scan(body, jnp.zeros(w.shape, jnp.float32), xs)
    return (_from_chunks(dh, h.shape[0]).astype(h.dtype), dw.astype(w.dtype), None)


_fused_logprobs.defvjp(_fused_logprobs_fwd, _fused_logprobs_bwd)


def chunked_token_logprobs(
    hidden: Array,
    head: Array,
    targets: Array,
    *,
    chunk_size: int | None = None,
) -> Array:
    """log softmax(hidden @ head)[target] per token, [N] float32, never holding all logits.

    The cotangent is per token, so the backward recomputes each chunk's logits (one extra matmul
    over the unfused version); the forward keeps one logsumexp per token. Targets must be valid
    ids (an out-of-range id gives NaN).
    """
    _check_pair(hidden, head, "chunked_token_logprobs")
    n = hidden.shape[0]
    if targets.shape != (n,):
        raise ValueError(f"chunked_token_logprobs: targets {targets.shape} != ({n},)")
    chunk = _resolve_chunk(n, head.shape[1], chunk_size)
    return _fused_logprobs(hidden, head, targets.astype(jnp.int32), chunk)
