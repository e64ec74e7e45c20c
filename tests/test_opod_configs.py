"""The real-model OPOD experiment files parse into the typed schema, and the Qwen3.5-9B one describes a run that fits
(its model, mesh and export), checked without weights or a GPU."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from porch_jax.models import ModelConfig
from porch_jax.models.io import export_config
from porch_jax.models.presets import preset
from porch_jax.models.qwen3_5 import Qwen3_5ForCausalLM
from porch_jax.models.sharding import make_mesh, state_shardings
from porch_jax.opod.config import ExperimentConfig
from porch_jax.serving.architectures import check_vllm_architecture
from porch_jax.typed_config import ConfigError, from_dict

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load(name: str, arg: str | None = None) -> ExperimentConfig:
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw = module.get_config(arg) if arg else module.get_config()
    return from_dict(ExperimentConfig, raw.to_dict())


@pytest.mark.parametrize("arg", [None, "smoke"])
def test_the_smollm2_experiment_is_the_papers_loop(arg):
    cfg = load("opod_smollm2", arg)
    assert cfg.model.init_from and cfg.policy.view == "full" and cfg.attribution.grm == "base_model"
    assert cfg.sft.hint_rows == 0 and not cfg.sft.empty_hint_rows  # SFT on expert decisions only
    # f32 on any CPU (bf16 is slower without bf16 matrix instructions); the smoke's push parity check needs it too
    assert cfg.model.compute_dtype == "float32"
    assert cfg.attribution.reading == "held" and cfg.attribution.free_reading == (arg is None)  # both read in full
    assert cfg.attribution.secondary  # the scripted judge's reading beside the base model's
    # The full run trains every method; the smoke stops at SFT's row (the methods' stages run in the miniature)
    assert ("opod_secondary" in cfg.methods) == (arg is None) and (arg is None or cfg.methods == ("sft",))
    # One learning rate per method after SFT; SFT's chosen among three on its validation loss in the full run.
    assert all(cfg.method(m).lr_grid is None for m in cfg.methods if m != "sft")
    assert (cfg.sft.lr_grid is None) == (arg == "smoke") and (cfg.sft.validation_share > 0) == (arg is None)
    if arg is None:
        assert cfg.eval.tasks.num_tasks >= 100


def test_a_pretrained_model_reads_the_full_view_only():
    cfg = load("opod_smollm2", "smoke")
    raw = json.loads(json.dumps(dataclasses.asdict(cfg)))
    raw["policy"]["view"] = "dsl"
    with pytest.raises(ConfigError, match="policy.view"):
        from_dict(ExperimentConfig, raw)
    raw["policy"]["view"], raw["model"]["init_from"] = "full", ""
    with pytest.raises(ConfigError, match="model.hf"):  # a model from scratch needs its config
        from_dict(ExperimentConfig, raw)


def test_the_qwen3_5_9b_experiment_fits_its_mesh_and_exports_what_vllm_registers():
    cfg = load("opod_qwen3_5_9b")
    assert cfg.model.compute_dtype == "bfloat16" and cfg.model.remat and cfg.serving.kind == "vllm"
    assert cfg.attribution.endpoint.configured  # the frozen base model served as the GRM
    devices = int(np.prod(cfg.mesh))
    assert devices == len(jax.devices()) == 8  # tests run on 8 fake CPU devices (tests/conftest.py)

    config = ModelConfig.from_hf(preset("qwen3.5-9b"))
    abstract = nnx.eval_shape(lambda: Qwen3_5ForCausalLM(config, rngs=nnx.Rngs(0)))
    mesh = make_mesh(cfg.mesh)
    shardings = state_shardings(abstract, mesh)
    arrays = jax.tree.leaves(nnx.state(abstract))
    specs = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    total = sum(int(np.prod(p.shape)) for p in arrays)
    assert 8.5e9 < total < 1e10, total
    per_device = 0
    for p, s in zip(arrays, specs, strict=True):
        shard = s.shard_shape(p.shape)
        per_device += int(np.prod(shard))
        if int(np.prod(p.shape)) >= 2**24:  # every large tensor is split over the mesh
            assert shard != tuple(p.shape), (p.shape, s.spec)
    # f32 master weights and AdamW's two moments: 12 bytes a parameter, per device under 20 GB (an 80 GB GPU).
    assert per_device * 12 < 20e9, per_device * 12 / 1e9

    exported = export_config(config, jnp.bfloat16)
    assert exported["architectures"] == ["Qwen3_5ForCausalLM"]
    assert check_vllm_architecture(exported) == "Qwen3_5ForCausalLM"


def test_the_held_reading_needs_an_endpoint_that_scores_prompts():
    raw = json.loads(json.dumps(dataclasses.asdict(load("opod_smollm2", "smoke"))))
    raw["attribution"]["endpoint"] |= {"model": "base", "urls": ["http://127.0.0.1:9"], "provider": "openai"}
    with pytest.raises(ConfigError, match=r"attribution\.endpoint\.provider.*prompt_logprobs"):
        from_dict(ExperimentConfig, raw)
    raw["attribution"]["reading"] = "free"  # a free reply needs chat completions only
    assert from_dict(ExperimentConfig, raw).attribution.endpoint.provider == "openai"
    raw["attribution"] |= {"reading": "held", "free_reading": True}
    raw["attribution"]["endpoint"]["provider"] = "vllm"
    assert from_dict(ExperimentConfig, raw).attribution.free_reading


def test_hint_following_names_readings_and_the_full_run_checks_both():
    assert load("opod_smollm2").attribution.hint_following == ("primary", "secondary")
    assert load("opod_smollm2", "smoke").attribution.hint_following == ()  # CI's minutes
    assert load("opod_smollm2").zero_shot and not load("opod_smollm2", "smoke").zero_shot  # the full run's row
    raw = json.loads(json.dumps(dataclasses.asdict(load("opod_smollm2", "smoke"))))
    raw["attribution"]["hint_following"] = ["primary", "secundary"]
    with pytest.raises(ConfigError, match=r"attribution\.hint_following.*secundary"):
        from_dict(ExperimentConfig, raw)


def test_frameworks_name_the_other_frameworks_once_each_and_start_from_sft():
    """`frameworks` trains Orchestra-o1 and the lifecycle orchestrator beside POrchestra (the quickstart both): each
    gets the configured methods that apply to it, named <method>@<framework>, and OPOD / OPD are not applicable."""
    from experiments.quickstart import get_config
    from porch_jax.opod.config import NOT_APPLICABLE, framework_system, split_method

    cfg = from_dict(ExperimentConfig, get_config())
    assert cfg.frameworks == ("orchestra_o1", "lifecycle")
    assert cfg.framework_methods("lifecycle") == ("sft@lifecycle", "rwr@lifecycle", "dagrpo@lifecycle")
    assert cfg.not_applicable() == {f"{m}@{f}": NOT_APPLICABLE for f in cfg.frameworks for m in ("opod", "opd_empty")}
    assert cfg.method("rwr@orchestra_o1") is cfg.rwr and split_method("dagrpo@lifecycle") == ("dagrpo", "lifecycle")
    assert framework_system("rwr@orchestra_o1") == "orchestra_o1" and framework_system("opod") == "proactive"
    for frameworks, methods, error in (
        (("lifecycle", "lifecycle"), None, "config.frameworks: repeats one"),
        (("aorchestra",), None, "config.frameworks\\[0\\]: 'aorchestra' is not one of"),
        (("lifecycle",), ("rwr",), "config.frameworks: each framework's methods start from its own SFT"),
    ):
        raw = get_config()
        raw.frameworks = frameworks
        if methods:
            raw.methods = methods
        with pytest.raises(ConfigError, match=error):
            from_dict(ExperimentConfig, raw)
