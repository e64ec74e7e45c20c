"""The served sampler's rules without a vLLM server: its config checks, the logprob-gap rule, per-row seeds, the
factory's refusals, and the weight-sync faults that need no server to show: a push to a port where nothing listens,
a push to a server that accepts connections and never answers (a listening socket nobody serves), a folder missing a
tensor (refused before anything is sent) and a sampling request that stalls. Each raises, naming the step, within
its configured timeout."""

from __future__ import annotations

import socket
import time

import pytest
from safetensors.numpy import load_file, save_file

from porch_jax.models import from_pretrained
from porch_jax.models.tiny import make_tiny_model
from porch_jax.serving import ServerConfig, VLLMServer, free_port
from porch_jax.serving.weights import WeightSyncError
from porch_jax.train.config import OpdSourceConfig, SamplerConfig, SamplingConfig
from porch_jax.train.served_sampler import (
    LogprobGapError,
    SamplerError,
    ServedActionSampler,
    check_logprob_gap,
    row_seeds,
    served_action_sampler,
)
from porch_jax.typed_config import ConfigError, from_dict


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def student(tiny_dir):
    return from_pretrained(tiny_dir)


@pytest.fixture
def stalled_url():
    """A port that accepts TCP connections (the kernel's backlog) and never answers: a server that stalls."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def _sampler(url, export_dir, **serving):
    cfg = SamplingConfig(max_new_tokens=4, sampler=SamplerConfig(kind="vllm", **serving))
    return ServedActionSampler(None, cfg, base_url=url, api_key="k", model="tiny", export_dir=export_dir)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("push_every", 0),
        ("max_logprob_gap", 0.0),
        ("push_timeout_s", -1.0),
        ("request_timeout_s", 0.0),
        ("push_parity_tol", 0.0),
        ("concurrency", 0),
        ("kind", "sglang"),
    ],
)
def test_a_bad_sampler_setting_is_an_error_naming_its_key(key, value):
    with pytest.raises(ConfigError, match=rf"opd\.sampling\.sampler\.{key}"):
        from_dict(OpdSourceConfig, {"batch": 2, "sampling": {"sampler": {key: value}}}, path="opd")


def test_the_sampler_section_defaults_to_the_embedded_sampler():
    section = from_dict(OpdSourceConfig, {"batch": 2, "sampling": {"max_new_tokens": 8}})
    assert section.sampling.sampler == SamplerConfig() and section.sampling.sampler.kind == "embedded"
    assert served_action_sampler(SamplingConfig(), None) is None


def test_the_gap_is_bounded_right_after_a_push_and_not_between_pushes():
    check_logprob_gap(3, {"logprob_gap": 0.009}, staleness=0, bound=0.01)
    check_logprob_gap(4, {"logprob_gap": 5.0}, staleness=1, bound=0.01)  # stale weights by design: logged only
    with pytest.raises(LogprobGapError, match=r"step 7: sampler/trainer logprob gap 0\.25 > max_logprob_gap 0\.01"):
        check_logprob_gap(7, {"logprob_gap": 0.25}, staleness=0, bound=0.01)
    with pytest.raises(LogprobGapError, match="step 2: .* nan"):
        check_logprob_gap(2, {"logprob_gap": float("nan")}, staleness=0, bound=0.01)
    with pytest.raises(LogprobGapError, match="step 1: the method logs no logprob_gap"):
        check_logprob_gap(1, {"loss": 1.0}, staleness=0, bound=0.01)


def test_row_seeds_are_reproducible_and_distinct_over_rows_and_steps():
    assert row_seeds(5, 3, 4) == row_seeds(5, 3, 4)
    seen = {s for step in range(1, 50) for s in row_seeds(5, step, 8)}
    assert len(seen) == 49 * 8 and all(0 <= s < 2**31 for s in seen)


def test_the_factory_refuses_a_served_sampler_without_a_server_or_on_chunked_prefill(tiny_dir, tmp_path):
    served = SamplingConfig(sampler=SamplerConfig(kind="vllm"))
    with pytest.raises(ValueError, match="needs a started vLLM server"):
        served_action_sampler(served, None, export_dir=tmp_path)
    chunked = VLLMServer(tiny_dir, tmp_path, api_key="k", config=ServerConfig(device="cpu"))  # not started
    with pytest.raises(ValueError, match="chunked_prefill=False"):
        served_action_sampler(served, None, server=chunked, export_dir=tmp_path)
    whole = VLLMServer(tiny_dir, tmp_path, api_key="k", config=ServerConfig(device="cpu", chunked_prefill=False))
    sampler = served_action_sampler(served, None, server=whole, export_dir=tmp_path)
    assert sampler.base_url == whole.base_url and "--no-enable-chunked-prefill" in whole.command()
    sampler.close()


def test_a_push_to_a_dead_server_stops_the_run_naming_the_step_and_server(student, tmp_path):
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    sampler = _sampler(url, tmp_path / "pushes", push_timeout_s=10.0)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=rf"step 1: pushing .*step_0 into {url}: .*/pause: ConnectError"):
        sampler(student, [[1, 2, 3]], 1)
    assert time.monotonic() - t0 < 10.0
    assert sampler.weights_step is None  # nothing believed pushed


def test_a_push_to_a_stalled_server_ends_within_its_timeout(student, tmp_path, stalled_url):
    sampler = _sampler(stalled_url, tmp_path / "pushes", push_timeout_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"step 1: .*/pause: .*Timeout"):
        sampler(student, [[1, 2, 3]], 1)
    assert 1.0 < time.monotonic() - t0 < 6.0


def test_a_folder_missing_a_tensor_is_refused_before_the_push(student, tmp_path, stalled_url):
    class DropsATensor(ServedActionSampler):
        def export(self, student, updates):
            path = super().export(student, updates)
            tensors = load_file(path / "model.safetensors")
            tensors.pop("model.layers.0.mlp.down_proj.weight")
            save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
            return path

    cfg = SamplingConfig(max_new_tokens=4, sampler=SamplerConfig(kind="vllm", push_timeout_s=30.0))
    sampler = DropsATensor(None, cfg, base_url=stalled_url, api_key="k", model="tiny", export_dir=tmp_path)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"step 1: .*model\.layers\.0\.mlp\.down_proj"):
        sampler(student, [[1, 2, 3]], 1)
    assert time.monotonic() - t0 < 5.0  # refused at the check, never sent to the (stalled) server


def test_a_stalled_sampling_request_ends_within_its_timeout(student, tmp_path, stalled_url):
    sampler = _sampler(stalled_url, tmp_path, request_timeout_s=1.0)
    sampler.weights_step = 0  # the server holds step 1's weights: no push, straight to sampling
    t0 = time.monotonic()
    with pytest.raises(SamplerError, match=rf"step 1: {stalled_url}/v1/completions: .*Timeout"):
        sampler(student, [[1, 2, 3]], 1)
    assert time.monotonic() - t0 < 5.0


def test_one_seed_per_prompt(student, tmp_path):
    sampler = _sampler("http://127.0.0.1:9", tmp_path)
    with pytest.raises(ValueError, match="step 1: 1 seeds for 2 prompts"):
        sampler(student, [[1, 2], [3, 4]], 1, seeds=[7])
