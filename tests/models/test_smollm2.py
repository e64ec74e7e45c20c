"""The real SmolLM2-135M-Instruct (converted from its GGUF file) against transformers: logits over chat
prompts up to 512 tokens, and 64 greedy tokens from our sampler against transformers' generate."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from porch_jax.models import LlamaForCausalLM, from_pretrained  # noqa: E402
from porch_jax.models.sampler import Sampler, SamplingParams  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

QUESTION = "What is the capital of France? Answer in one word."
LONG = " ".join(
    f"Step {i}: the orchestrator asks agent {i % 5} to check file {i}.txt and report back." for i in range(40)
)


@pytest.fixture(scope="module")
def models(smollm2_dir):
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    return tokenizer, hf, from_pretrained(smollm2_dir)


def chat_ids(tokenizer, text: str, limit: int = 512) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return list(ids)[-limit:]


def test_config_is_smollm2(models):
    _, _, model = models
    c = model.config
    assert type(model) is LlamaForCausalLM
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (30, 576, 9, 3)
    assert c.tie_word_embeddings and c.vocab_size == 49152


def test_logits_match_transformers_on_chat_prompts(models):
    tokenizer, hf, model = models
    for text in (QUESTION, LONG + " " + LONG):
        ids = chat_ids(tokenizer, text)
        ours = np.asarray(jax.jit(lambda m, x: m(x))(model, jnp.asarray([ids])))
        with torch.no_grad():
            theirs = hf(torch.tensor([ids])).logits.numpy()
        diff = float(np.abs(ours - theirs).max())
        print(f"SmolLM2 logits, {len(ids)} tokens: max abs diff {diff:.2e}")
        assert diff < 2e-3, (len(ids), diff)
    assert len(ids) == 512


def test_greedy_sampler_matches_transformers_generate(models):
    tokenizer, hf, model = models
    ids = chat_ids(tokenizer, QUESTION)
    sampler = Sampler(model, tokenizer, max_len=256)
    ours = sampler.generate([ids], SamplingParams(max_new_tokens=64, ignore_eos=True))[0]
    # No end-of-sequence for either side, so all 64 tokens are compared (min_new_tokens would instead
    # mask eos out of transformers' argmax while ours still picks it).
    eos, hf.generation_config.eos_token_id = hf.generation_config.eos_token_id, None
    try:
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False)
    finally:
        hf.generation_config.eos_token_id = eos
    theirs = out[0, len(ids) :].tolist()
    assert len(theirs) == 64
    print("SmolLM2 greedy:", repr(tokenizer.decode(theirs)))
    assert ours.token_ids == theirs
    assert "Paris" in tokenizer.decode(theirs)


def test_prefix_reuse_gives_the_uncached_greedy_turns(models):
    """A two-turn chat: the second turn's prompt extends the first prompt and its reply, so the reusing sampler
    prefills only the new tokens; its greedy tokens equal the uncached sampler's and logprobs agree within 5e-5.
    (The uncached path prefills the whole prompt blockwise, the reusing one attends densely from the new tokens over
    the reused keys: one computation in two summation orders, 30 layers deep; on the tiny model they agree within
    1e-5, tests/models/test_sampler.py.)"""
    tokenizer, _, model = models
    kwargs = {"max_len": 384, "prompt_buckets": (64, 128, 256), "batch_buckets": (1, 2)}
    plain, reusing = Sampler(model, tokenizer, **kwargs), Sampler(model, tokenizer, **kwargs, prefix_cache_bytes=2**28)
    params = SamplingParams(max_new_tokens=16)
    chats = [[{"role": "user", "content": QUESTION}], [{"role": "user", "content": "Name three colours."}]]
    for turn in range(2):
        prompts = [_ids(tokenizer, c) for c in chats]
        want, got = plain.generate(prompts, params), reusing.generate(prompts, params)
        for w, g, chat in zip(want, got, chats, strict=True):
            assert g.token_ids == w.token_ids, turn
            np.testing.assert_allclose(g.logprobs, w.logprobs, atol=5e-5)
            chat += [{"role": "assistant", "content": w.text}, {"role": "user", "content": f"And then? ({turn})"}]
    stats = reusing.prefixes.stats()
    print(f"SmolLM2 prefix reuse over two turns: {stats}")
    assert stats["hits"] >= 2 and stats["reused_fraction"] > 0.3


def _ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
