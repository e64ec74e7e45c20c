"""OPD on the real SmolLM2-135M-Instruct against transformers + torch (f32), on three short decisions in the
natural-language protocol (chat template; rows as porch_jax/opod/rows.py builds them):

- our OPD loss (full-vocabulary reverse KL(student under s || teacher under s ⊕ H), averaged over each decision's
  tokens, then over decisions) and its gradient equal a torch reference through transformers' LlamaForCausalLM;
- a teacher with the student's weights reading the student's own context gives a KL of 0 (H = ∅: no hint turn at
  all; an empty hint still adds a user turn, porch_jax/attribution/grm.py's `teacher_context`, so the OPD-empty
  control's teacher is not the student and its KL is printed, not asserted to vanish).

That OPOD with opd_weight 0 trains exactly like RWR is an identity of the loss, not of the model: tests/train/
test_opod.py checks it on the tiny model.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")

from porch_jax.models import from_pretrained, save_pretrained  # noqa: E402
from porch_jax.opod import rows as episode_rows  # noqa: E402
from porch_jax.protocol import render_call  # noqa: E402
from porch_jax.train import packing  # noqa: E402
from porch_jax.train.methods import MethodConfig, make_method  # noqa: E402
from porch_jax.trajectories import DecisionRecord, EpisodeRecord, Outcome  # noqa: E402

# Mostly one XLA compilation (30 unrolled layers): under a minute on 2 quiet cores; shared cores stretch it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SYSTEM = "You orchestrate sub-agents. Reply with exactly one tool call."
TASKS = (
    ("Find ACME's last invoice and email it to Bob.", "search_email", "Search the mail for ACME invoices first."),
    ("Book a cab to the airport for 9am tomorrow.", "cab", "Ask the cab agent for the 9am slot."),
)
# Gradients compared with torch's (HF names); the embedding is tied, so its gradient sums the lookup and the head.
GRADS = (
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.14.mlp.up_proj.weight",
    "model.layers.29.mlp.down_proj.weight",
    "model.norm.weight",
)


def _episodes() -> list[EpisodeRecord]:
    """Two successful episodes, three decisions: a delegation, its feedback, then a second delegation or a stop."""
    out = []
    for e, (task, tool, _) in enumerate(TASKS):
        context = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Task: {task}"}]
        calls = [{"name": "delegate", "arguments": {"subgoal": task, "tools": [tool], "budget": 4}}]
        if e == 0:
            calls.append({"name": "stop", "arguments": {"answer": "Sent the ACME invoice to Bob."}})
        decisions = []
        for i, call in enumerate(calls):
            text = render_call(call)
            decisions.append(DecisionRecord(i, [dict(m) for m in context], text, [], [], call, "done: invoice sent"))
            context += [{"role": "assistant", "content": text}, {"role": "user", "content": "done: invoice sent"}]
        out.append(
            EpisodeRecord(
                episode_id=f"ep{e}",
                task_id=f"t{e}",
                env="synthetic",
                system="proactive",
                config_hash="x",
                seed=e,
                outcome=Outcome(success=True, score=1.0, reason=""),
                decisions=decisions,
            )
        )
    return out


def _hints(episodes, hint=None) -> dict:
    return {
        (ep.episode_id, d.index): TASKS[e][2] if hint is None else hint
        for e, ep in enumerate(episodes)
        for d in ep.decisions
    }


@pytest.fixture(scope="module")
def setup(smollm2_dir):
    from transformers import AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    eps = _episodes()
    rows = episode_rows.opd_rows(eps, _hints(eps), tok, "full")
    actions = [episode_rows.action_tokens(tok, d.action, d.context, "full") for ep in eps for d in ep.decisions]
    assert len(rows) == 3 and all(len(r.teacher) + len(a) <= 200 for r, a in zip(rows, actions, strict=True))
    return tok, eps, rows, actions, from_pretrained(smollm2_dir)


def _batch(prompts_s, prompts_t, actions, t: int = 200) -> dict:
    """Student and teacher views of the same actions, every view [3, t] (one shape: one compilation)."""
    k = max(map(len, actions))

    def view(prompts):
        return packing.scored_batch(prompts, actions, t, k)

    return jax.tree.map(jnp.asarray, {"student": view(prompts_s), "teacher": view(prompts_t)})


@functools.cache
def _opd_value_and_grad(graphdef):
    """Our OPD part (methods.py's "opd", packed layout) and its gradient, jitted once per model structure: every
    batch of this file has one shape, so the three evaluations share one compilation (30 unrolled layers)."""
    method = make_method(MethodConfig(name="opd"))

    @jax.jit
    def run(params, frozen, batch):
        def loss(p):
            parts, _ = method.micro_parts(nnx.merge(graphdef, p), nnx.merge(graphdef, frozen), batch)
            return method.loss(parts, method.global_counts(batch))

        return jax.value_and_grad(loss)(params)

    return run


def _opd_loss_and_grads(model, batch):
    """Our OPD loss and its gradient on `batch`, the teacher a frozen copy of `model`."""
    graphdef, params = nnx.split(model, nnx.Param)
    value, grads = _opd_value_and_grad(graphdef)(params, params, batch)
    return float(value), nnx.merge(graphdef, grads)


def test_opd_loss_and_gradient_equal_torch_and_a_self_teacher_gives_zero(setup, smollm2_dir, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    tok, _, rows, actions, model = setup
    ours, grad_model = _opd_loss_and_grads(model, _batch([r.student for r in rows], [r.teacher for r in rows], actions))
    save_pretrained(grad_model, tmp_path / "grads")  # our gradient in HF names and layouts (the export's rules)
    with safe_open(str(tmp_path / "grads" / "model.safetensors"), "np") as f:
        our_grads = {name: f.get_tensor(name) for name in GRADS}

    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    # torch's nn.Embedding drops the lookup gradient of its padding_idx row (SmolLM2's pad is its eos, <|im_end|>,
    # which every chat turn holds); the loss's true gradient keeps it, as ours does.
    hf.model.embed_tokens.padding_idx = None
    kls = []
    for r, a in zip(rows, actions, strict=True):
        s, t = len(r.student), len(r.teacher)
        student = hf(torch.tensor([list(r.student) + a])).logits[0, s - 1 : s - 1 + len(a)].log_softmax(-1)
        with torch.no_grad():
            teacher = hf(torch.tensor([list(r.teacher) + a])).logits[0, t - 1 : t - 1 + len(a)].log_softmax(-1)
        kls.append((student.exp() * (student - teacher)).sum(-1).mean())  # reverse KL per token, mean in decision
    reference = torch.stack(kls).mean()  # then over decisions
    reference.backward()
    params = dict(hf.named_parameters())

    print(f"\nSmolLM2 OPD loss: ours {ours:.6f}, torch {float(reference.detach()):.6f}")
    assert ours > 1e-3  # the hint moves the teacher: a loss that is not trivially 0
    # Tolerances: f32 on both sides, different kernels (fused chunked KL, XLA vs torch attention): the loss to
    # 1e-4 relative (measured ~1e-5); each gradient to 3e-3 of its largest entry (measured 1e-4 to 7e-4) with a
    # cosine above 0.9999.
    assert ours == pytest.approx(float(reference), rel=1e-4)
    for name in GRADS:
        want, got = params[name].grad.numpy().astype(np.float64), our_grads[name].astype(np.float64)
        err = np.abs(got - want).max() / np.abs(want).max()
        cos = float(np.sum(got * want) / np.linalg.norm(got) / np.linalg.norm(want))
        print(f"  grad {name}: max |diff| / max |torch| {err:.1e}, cosine {cos:.7f}")
        assert err < 3e-3 and cos > 0.9999, name

    same, zero_grads = _opd_loss_and_grads(model, _batch([r.student for r in rows], [r.student for r in rows], actions))
    _, eps, _, _, _ = setup
    empty = episode_rows.opd_rows(eps, _hints(eps, ""), tok, "full")
    turn, _ = _opd_loss_and_grads(model, _batch([r.student for r in rows], [r.teacher for r in empty], actions))
    grad_norm = float(jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(nnx.state(zero_grads)))))
    print(f"  self-teacher KL {same:.2e} (gradient norm {grad_norm:.1e}); teacher with an empty hint turn {turn:.2e}")
    assert abs(same) <= 1e-6 and grad_norm <= 1e-5
    assert turn > 1e-4
