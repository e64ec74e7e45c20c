"""A small fixed orchestration dataset, tokenizer, model and run config shared by the train tests.

Episodes are synthetic but shaped like the rollout engine's: a system + user context (plus a
feedback turn for later decisions) and a Hermes tool-call action; some decisions carry sampled
token ids (which the data pipeline must use verbatim), some only text.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from porch_jax.trajectories import (
    DecisionRecord,
    EpisodeRecord,
    Outcome,
    TrajectoryStore,
)

REPO = Path(__file__).resolve().parents[2]
# XLA:CPU spends seconds compiling each step, and many tests build the same step (same config,
# mesh and bucket) in a fresh jit. A persistent compilation cache, keyed by the compiled program,
# lets them (and the launch subprocesses) compile it once per session.
XLA_CACHE = Path(tempfile.mkdtemp(prefix="porch_train_xla_cache_"))
atexit.register(shutil.rmtree, XLA_CACHE, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", str(XLA_CACHE))
TINY_HF = {  # hidden 32, 2 layers: compiles fast, still every part of Qwen3
    "model_type": "qwen3",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
    "initializer_range": 0.05,
}
TOOLS = ("search_email", "read_file", "calendar", "contacts")


@functools.lru_cache(maxsize=1)
def tokenizer():
    from porch_jax.models.tiny import build_tokenizer

    return build_tokenizer(1024)


def _action(rng: np.random.Generator) -> str:
    args = {"tool": TOOLS[rng.integers(len(TOOLS))], "budget": int(rng.integers(2, 9))}
    return '<tool_call>{"name": "delegate", "arguments": ' + json.dumps(args) + "}</tool_call>"


def episodes(n: int = 12, seed: int = 0, tok=None) -> list[EpisodeRecord]:
    """n episodes of 1-2 decisions; half succeed; every third decision stores sampled token ids."""
    rng = np.random.default_rng(seed)
    tok = tok or tokenizer()
    out = []
    for e in range(n):
        context = [
            {"role": "system", "content": "Delegate or finish."},
            {"role": "user", "content": f"Task {e}: client {rng.integers(50)}."},
        ]
        decisions = []
        for i in range(int(rng.integers(1, 3))):
            text = _action(rng)
            sampled = (e + i) % 3 == 0
            ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id] if sampled else []
            decisions.append(
                DecisionRecord(
                    index=i,
                    context=[dict(m) for m in context],
                    action_text=text,
                    action_token_ids=ids,
                    action_logprobs=[-0.5] * len(ids),
                    action={"name": "delegate", "arguments": {}},
                    feedback=f"partial {rng.integers(10)}",
                    agent_id=i,
                )
            )
            context += [{"role": "assistant", "content": text}, {"role": "user", "content": decisions[-1].feedback}]
        out.append(
            EpisodeRecord(
                episode_id=f"ep{e}",
                task_id=f"t{e}",
                env="synthetic",
                system="proactive",
                config_hash="x",
                seed=e,
                outcome=Outcome(success=e % 2 == 0, score=float(e % 2 == 0), reason=""),
                decisions=decisions,
            )
        )
    return out


def hints(eps: list[EpisodeRecord]) -> dict[tuple[str, int], str]:
    """A hint for every other decision (FLAG = true), as the attribution step would give."""
    return {
        (ep.episode_id, d.index): f"Use {TOOLS[d.index % 4]}."
        for ep in eps
        for d in ep.decisions
        if (d.index + int(ep.episode_id[2:])) % 2 == 0
    }


def groups(n: int = 6, size: int = 2, seed: int = 0, tok=None) -> list[dict]:
    """n recorded GRPO groups of `size` samples each, as launch/train.py reads them from data.groups: rows {key,
    context, samples: [{token_ids, logprobs, reward}]}; a sample is a tool call (then eos) with a logprob per
    token, and every other sample of a group succeeds (reward 1.0), so each group has advantages to learn from."""
    rng = np.random.default_rng(seed)
    tok = tok or tokenizer()
    out = []
    for g in range(n):
        context = [
            {"role": "system", "content": "Delegate or finish."},
            {"role": "user", "content": f"Task {g}: use {TOOLS[g % len(TOOLS)]}."},
        ]
        samples = []
        for j in range(size):
            text = _action(rng)
            ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
            samples.append({"token_ids": ids, "logprobs": [-0.5] * len(ids), "reward": float(j % 2)})
        out.append({"key": f"g{g}", "context": context, "samples": samples})
    return out


def write_run_inputs(root: Path, n: int = 12) -> tuple[Path, Path]:
    """A tokenizer + tiny-model folder and a trajectory store on disk, for launch/train.py runs."""
    from porch_jax.models import ModelConfig, init_model, save_pretrained

    model_dir, store_path = root / "model", root / "trajectories.jsonl"
    tok = tokenizer()
    save_pretrained(
        init_model(ModelConfig.from_hf(TINY_HF | {"vocab_size": len(tok)}), seed=0), model_dir, tokenizer=tok
    )
    with TrajectoryStore(store_path) as store:
        store.append_many(episodes(n))
    return model_dir, store_path


def write_jsonl(rows: list[dict], path: Path) -> Path:
    """`rows` as a JSONL file (hints, GRPO groups) for launch/train.py."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(workdir: Path, *, steps: int = 20, mesh=(1, 1, 1), method: str = "sft") -> ConfigDict:
    """experiments/sft_tiny.py scaled to the test dataset: 2 length buckets, batch 8."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sft_tiny", REPO / "experiments" / "sft_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.train.method.name, c.workdir = method, str(workdir)
    c.data.buckets = (80, 128)
    c.batch.update(micro_batch=8, accum_steps=1)
    # A fixed schedule length: runs that differ only in `steps` compile the same program.
    c.train.steps = steps
    c.train.optimizer.update(total_steps=20, learning_rate=3e-3, warmup_steps=3)
    c.train.mesh = tuple(mesh)
    c.train.checkpoint.update(every=5, keep=3)
    c.train.log.update(every=5, tensorboard=False)
    return c


def typed(config: ConfigDict):
    """The RecordsConfig launch/train.py builds from `config`."""
    from porch_jax.rows.records import RecordsConfig
    from porch_jax.typed_config import from_dict

    return from_dict(RecordsConfig, config)


def method_rows(config: ConfigDict, eps: list[EpisodeRecord] | None = None, tok=None):
    """The MethodRows launch/train.py builds for `config`'s method: from `eps` (default: the 12 tiny episodes) and
    their `hints`, or, for GRPO, from `groups()`."""
    from porch_jax.rows import records

    tok = tok or tokenizer()
    eps = episodes(12, tok=tok) if eps is None else eps
    return records.method_rows(typed(config), tok, episodes=eps, hints=hints(eps), groups=groups(tok=tok))


def trainer(config: ConfigDict, model, rows, **kw):
    """The Trainer launch/train.py runs for `config` on `rows` (MethodRows; typed here as there)."""
    import io

    from porch_jax.rows.records import records_trainer

    return records_trainer(typed(config), model, rows, stream=kw.pop("stream", io.StringIO()), **kw)


def write_config(config: ConfigDict, path: Path) -> Path:
    """A config file for `launch/train.py --config=PATH` holding exactly `config`."""
    path.write_text(
        "from ml_collections import ConfigDict\n\n\ndef get_config():\n"
        f"    return ConfigDict({json.loads(config.to_json())!r}, type_safe=False)\n"
    )
    return path


def launch_command(config_path: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "launch.train", f"--config={config_path}", *flags]


def launch_env() -> dict[str, str]:
    """A clean environment for launch subprocesses (no fake device count), sharing the session's
    compilation cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), JAX_COMPILATION_CACHE_DIR=str(XLA_CACHE))
    return env


def read_safetensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def model(seed: int = 0, **model_kwargs):
    from porch_jax.models import ModelConfig, init_model

    return init_model(ModelConfig.from_hf(TINY_HF | {"vocab_size": len(tokenizer())}), seed=seed, **model_kwargs)


def grads_via_sgd(method, model, batch, cfg, frozen_model=None, mesh_shape=(1, 1, 1)):
    """(metrics, grads) of one training step on a mesh of `mesh_shape`: with SGD(1) and no clipping, grads =
    params_before - params_after."""
    import optax
    from flax import nnx

    from porch_jax.train import mesh as mesh_lib
    from porch_jax.train import step as S

    mesh = mesh_lib.make_mesh(mesh_shape)
    tx = optax.sgd(1.0)
    graphdef, state, shardings = S.init_train_state(model, tx, mesh)
    before = jax.tree.map(np.asarray, state["params"])
    step = S.TrainStep(method_of(method, cfg), graphdef, tx, lambda s: 1.0, mesh=mesh, state_shardings=shardings)
    frozen = (
        None
        if frozen_model is None
        else jax.device_put(nnx.state(frozen_model, nnx.Param), shardings["params"], may_alias=False)
    )
    state, metrics = step(state, batch, *(() if frozen is None else (frozen,)))
    grads = jax.tree.map(lambda b, a: b - np.asarray(a), before, state["params"])
    return {k: float(v) for k, v in metrics.items()}, grads


def method_of(name: str, cfg):
    """The registered method `name` with the loss settings of MethodConfig `cfg`."""
    import dataclasses

    from porch_jax.train.methods import make_method

    return make_method(dataclasses.replace(cfg, name=name))


def qwen3_5_model(seed: int = 0):
    """A tiny Qwen3.5: a Gated DeltaNet then a gated attention layer, GQA in both, untied head."""
    from porch_jax.models import ModelConfig, init_model
    from porch_jax.models.presets import preset

    hf = preset(
        "qwen3.5-tiny",
        vocab_size=len(tokenizer()),
        hidden_size=32,
        intermediate_size=64,
        head_dim=16,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        tie_word_embeddings=False,
        initializer_range=0.05,
    )
    return init_model(ModelConfig.from_hf(hf), seed=seed)


@pytest.fixture(scope="module")
def tok():
    """The tiny tokenizer, as a fixture (conftests import it: `from tiny_data import eps, tok`)."""
    return tokenizer()


@pytest.fixture(scope="module")
def eps(tok):
    """A dozen synthetic episodes under the tiny tokenizer, as a fixture."""
    return episodes(12, tok=tok)
