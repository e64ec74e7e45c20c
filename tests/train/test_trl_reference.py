"""Our reverse KL against TRL's ``GKDTrainer.generalized_jsd_loss`` at beta=1: KL(student||teacher).

TRL reductions: ``"sum"`` is our sum; ``"batchmean"`` with ``labels`` (-100 = ignored) divides by
the number of kept tokens, i.e. our sum / count at token level; ``"batchmean"`` without labels
divides by the batch size B (not by tokens).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
torch = pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0)")
gkd = pytest.importorskip(
    "trl.experimental.gkd.gkd_trainer",
    reason="TRL is not installed (add trl to the test extra to run this reference check)",
)
jsd = gkd.GKDTrainer.generalized_jsd_loss

from porch_jax.train import fused_kl, losses

B, T, H, V = 3, 5, 8, 33


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(0)
    return {
        "sh": rng.normal(size=(B, T, H)).astype(np.float32),
        "th": rng.normal(size=(B, T, H)).astype(np.float32),
        "sw": (rng.normal(size=(H, V)) * 0.8).astype(np.float32),
        "tw": (rng.normal(size=(H, V)) * 0.8).astype(np.float32),
        "mask": np.asarray(rng.random((B, T)) < 0.7),
    }


def trl_loss(case, reduction, with_labels=True):
    """TRL's loss and its gradients w.r.t. the student hidden states and head (torch autograd)."""
    sh = torch.tensor(case["sh"], requires_grad=True)
    sw = torch.tensor(case["sw"], requires_grad=True)
    with torch.no_grad():
        teacher = torch.tensor(case["th"]) @ torch.tensor(case["tw"])
    labels = torch.where(torch.tensor(case["mask"]), 1, -100) if with_labels else None
    loss = jsd(sh @ sw, teacher, labels=labels, beta=1.0, reduction=reduction)
    loss.backward()
    return float(loss.detach()), sh.grad.numpy(), sw.grad.numpy()


def test_reverse_kl_equals_trl_batchmean_with_labels(case):
    want, gh, gw = trl_loss(case, "batchmean")

    def ours(sh, sw):
        s, c = losses.reverse_kl(sh @ sw, case["th"] @ case["tw"], case["mask"])
        return s / c

    got, (dh, dw) = jax.value_and_grad(ours, (0, 1))(case["sh"], case["sw"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dh, gh, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dw, gw, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("grad_in_forward", [True, False])
def test_chunked_reverse_kl_equals_trl_sum(case, grad_in_forward):
    want, gh, gw = trl_loss(case, "sum")
    th, mask = case["th"].reshape(-1, H), case["mask"].reshape(-1)

    def ours(sh, sw):
        s, _ = fused_kl.chunked_reverse_kl(
            sh.reshape(-1, H),
            sw,
            th,
            case["tw"],
            mask,
            chunk_size=4,
            grad_in_forward=grad_in_forward,
        )
        return s

    got, (dh, dw) = jax.jit(jax.value_and_grad(ours, (0, 1)))(case["sh"], case["sw"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dh, gh, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, gw, rtol=1e-5, atol=1e-5)


def test_trl_batchmean_without_labels_divides_by_batch_size(case):
    want, _, _ = trl_loss(case, "batchmean", with_labels=False)
    s, c = losses.reverse_kl(
        jnp.asarray(case["sh"] @ case["sw"]),
        jnp.asarray(case["th"] @ case["tw"]),
        jnp.ones((B, T)),
    )
    assert float(c) == B * T
    np.testing.assert_allclose(float(s) / B, want, rtol=1e-5)
