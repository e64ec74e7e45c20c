"""Export any Orbax step of a training run as a Hugging Face folder (what transformers and vLLM load).

    python -m launch.export --run_dir=runs/quickstart/opod --out=/tmp/opod_step50 --step=50
    python -m launch.export --checkpoint_dir=runs/sft_tiny/checkpoints --out=/tmp/sft   # the newest step

The checkpoint holds the train state and the run's config (its TrainConfig, model config.json and
the policy's view), so nothing else is needed; the tokenizer comes from --tokenizer, else the run's
final export, else none. The folder gets POLICY_FILE (view and step), as the trainer's exports do.
Its architecture is checked against those this machine's vLLM registers before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import app, flags

flags.DEFINE_string("run_dir", None, "A training run's directory (its checkpoints are RUN_DIR/checkpoints).")
flags.DEFINE_string("checkpoint_dir", None, "An Orbax checkpoint directory (instead of --run_dir).")
flags.DEFINE_integer("step", None, "The step to export (default: the newest).")
flags.DEFINE_string("out", None, "The Hugging Face folder to write.", required=True)
flags.DEFINE_string("tokenizer", None, "A folder whose tokenizer is saved with the export.")
flags.register_multi_flags_validator(
    ["run_dir", "checkpoint_dir"],
    lambda f: (f["run_dir"] is None) != (f["checkpoint_dir"] is None),
    "give exactly one of --run_dir and --checkpoint_dir",
)
FLAGS = flags.FLAGS


def export_step(checkpoint_dir: str | Path, out: str | Path, *, step: int | None = None, tokenizer=None) -> Path:
    """Writes step `step` (default: the newest) of the checkpoints in `checkpoint_dir` to `out`; returns `out`."""
    from flax import nnx

    from porch_jax.envs.views import POLICY_FILE
    from porch_jax.models import ModelConfig, init_model
    from porch_jax.models.io import export_config
    from porch_jax.serving.architectures import check_vllm_architecture
    from porch_jax.train import checkpoint as ckpt_lib
    from porch_jax.train import mesh as mesh_lib
    from porch_jax.train import optim
    from porch_jax.train import step as step_lib
    from porch_jax.train.config import TrainConfig
    from porch_jax.typed_config import from_dict

    with ckpt_lib.Checkpointer(checkpoint_dir, async_save=False) as checkpointer:
        steps = checkpointer.steps()
        if not steps:
            raise app.UsageError(f"no checkpoints in {checkpoint_dir}")
        step = steps[-1] if step is None else step
        if step not in steps:
            raise app.UsageError(f"--step={step}: not in {checkpoint_dir} (steps: {steps})")
        saved = checkpointer.config(step)
        if "model" not in saved or "train" not in saved:
            raise app.UsageError(
                f"checkpoint step {step} in {checkpoint_dir} does not record its model and TrainConfig"
            )
        cfg = from_dict(TrainConfig, saved["train"], path="checkpoint config.train")
        config = ModelConfig.from_hf(saved["model"])
        check_vllm_architecture(export_config(config))
        model = nnx.eval_shape(lambda: init_model(config, seed=0))
        tx = optim.make_optimizer(cfg.optimizer, cfg.optimizer.total_steps or cfg.steps)
        mesh = mesh_lib.make_mesh((1,) * len(cfg.mesh))
        state, _ = checkpointer.restore(step, step_lib.abstract_train_state(model, tx, mesh))
    graphdef, _ = nnx.split(model, nnx.Param)
    path = ckpt_lib.export_hf(graphdef, state["params"], out, tokenizer)
    (path / POLICY_FILE).write_text(json.dumps({"view": saved.get("view", "full"), "step": step}))
    return path


def run_tokenizer(run_dir: Path | None, folder: str | None = None):
    """The tokenizer an export carries: ``folder``'s, else the run's own export's (RUN/export), else None."""
    tok_dir = folder or (str(run_dir / "export") if run_dir and (run_dir / "export").is_dir() else None)
    if not tok_dir:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir)


def main(argv: list[str]) -> None:
    del argv
    run_dir = Path(FLAGS.run_dir) if FLAGS.run_dir else None
    checkpoints = run_dir / "checkpoints" if run_dir else Path(FLAGS.checkpoint_dir)
    tokenizer = run_tokenizer(run_dir, FLAGS.tokenizer)
    path = export_step(checkpoints, FLAGS.out, step=FLAGS.step, tokenizer=tokenizer)
    print(f"exported {checkpoints} step {FLAGS.step or 'latest'} to {path}")


if __name__ == "__main__":
    app.run(main)
