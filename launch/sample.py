"""Quickstart: build the tiny local model (once) and sample chat completions with the JAX sampler.

    python -m launch.sample --out_dir=runs/quickstart

The weights are random, so the text is gibberish; what this shows is the whole path (tokenizer,
chat template with tools, HF folder, JAX model, batched KV-cache sampling) running offline.
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "runs/quickstart", "Run folder; the model goes to OUT_DIR/model.")
flags.DEFINE_integer("max_new_tokens", 48, "Tokens to generate per conversation.", lower_bound=1)
flags.DEFINE_float("temperature", 0.8, "Sampling temperature (0 = greedy).", lower_bound=0.0)
flags.DEFINE_float("top_p", 0.95, "Nucleus sampling threshold.", lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_integer("seed", 0, "Sampling seed (request i uses seed + i).")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_emails",
            "description": "Search the user's mailbox.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
]
CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Find the invoice that Northwind says they never received."},
    ],
    [{"role": "user", "content": "Can you check my calendar for tomorrow?"}],
    [{"role": "user", "content": "Write a short haiku about autumn."}],
    [{"role": "user", "content": "Delegate the search to a worker with a budget of six steps."}],
]


def main(argv: list[str]) -> None:
    del argv
    from transformers import AutoTokenizer

    from porch_jax import runtime

    runtime.tune_malloc()  # before the first computation (porch_jax/runtime.py says why)

    from porch_jax.models import from_pretrained
    from porch_jax.models.sampler import Sampler, SamplingParams
    from porch_jax.models.tiny import make_tiny_model

    folder = Path(FLAGS.out_dir) / "model"
    if not (folder / "config.json").is_file():
        start = time.perf_counter()
        make_tiny_model(folder)
        print(f"built the tiny model in {folder} ({time.perf_counter() - start:.1f} s)")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sampler = Sampler(from_pretrained(folder), tokenizer, max_len=512)
    params = SamplingParams(
        max_new_tokens=FLAGS.max_new_tokens, temperature=FLAGS.temperature, top_p=FLAGS.top_p, seed=FLAGS.seed
    )

    start = time.perf_counter()
    sampler.chat(CONVERSATIONS, params, tools=TOOLS)
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    completions = sampler.chat(CONVERSATIONS, params, tools=TOOLS)
    seconds = time.perf_counter() - start

    for conversation, completion in zip(CONVERSATIONS, completions, strict=False):
        print(f"\nuser: {conversation[-1]['content']}")
        print(f"assistant ({len(completion.token_ids)} tokens, {completion.finish_reason}): {completion.text!r}")
    generated = sum(len(c.token_ids) for c in completions)
    print(
        f"\n{generated} tokens in {seconds:.3f} s: {generated / seconds:.0f} tokens/s "
        f"(first call, with compilation: {compiled:.1f} s)"
    )


if __name__ == "__main__":
    app.run(main)
