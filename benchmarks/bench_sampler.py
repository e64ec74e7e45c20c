"""Decode throughput of the JAX sampler against transformers' PyTorch `generate`, same weights.

Both decode greedily with a KV cache: batch 8, 64-token prompts, exactly 128 new tokens (eos
ignored), float32, on the CPU. Reports the median over repeats (compilation / warm-up excluded).

    python -m benchmarks.bench_sampler --json runs/bench_sampler.json
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 8, "Prompts per batch.")
flags.DEFINE_integer("prompt_len", 64, "Tokens per prompt.")
flags.DEFINE_integer("new_tokens", 128, "Tokens generated per prompt.")
flags.DEFINE_integer("repeats", 5, "Timed repeats; the median is reported.")
flags.DEFINE_integer("threads", 2, "torch.set_num_threads.")
flags.DEFINE_string("json", None, "Also write the results to this JSON file.")

MODEL = {
    "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
}


def _median_seconds(fn, repeats: int) -> float:
    fn()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _bench_jax(folder: Path, prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
    from transformers import AutoTokenizer

    from porch_jax.models import from_pretrained
    from porch_jax.models.sampler import Sampler, SamplingParams

    sampler = Sampler(from_pretrained(folder), AutoTokenizer.from_pretrained(folder),
                      max_len=FLAGS.prompt_len + FLAGS.new_tokens, prompt_buckets=(FLAGS.prompt_len,))
    params = SamplingParams(max_new_tokens=FLAGS.new_tokens, ignore_eos=True)
    outputs = []
    seconds = _median_seconds(lambda: outputs.append(sampler.generate(prompts, params)), FLAGS.repeats)
    return seconds, [c.token_ids for c in outputs[-1]]


def _bench_torch(folder: Path, prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(FLAGS.threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    input_ids = torch.tensor(prompts)
    outputs = []

    def run():
        with torch.inference_mode():
            outputs.append(model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                max_new_tokens=FLAGS.new_tokens, min_new_tokens=FLAGS.new_tokens,
            ))

    seconds = _median_seconds(run, FLAGS.repeats)
    return seconds, outputs[-1][:, FLAGS.prompt_len:].tolist()


def main(argv: list[str]) -> None:
    del argv
    import numpy as np

    from porch_jax.models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_model(Path(tmp) / "model", seed=0, **MODEL)
        rng = np.random.default_rng(0)
        prompts = rng.integers(0, 2000, size=(FLAGS.batch, FLAGS.prompt_len)).tolist()
        jax_s, jax_tokens = _bench_jax(folder, prompts)
        torch_s, torch_tokens = _bench_torch(folder, prompts)

    generated = FLAGS.batch * FLAGS.new_tokens
    same = sum(a == b for ja, tb in zip(jax_tokens, torch_tokens) for a, b in zip(ja, tb))
    result = {
        "batch": FLAGS.batch, "prompt_len": FLAGS.prompt_len, "new_tokens": FLAGS.new_tokens, "model": MODEL,
        "jax_seconds": jax_s, "torch_seconds": torch_s,
        "jax_tokens_per_s": generated / jax_s, "torch_tokens_per_s": generated / torch_s,
        "speedup": torch_s / jax_s,
        # Random weights give near-flat logits, so a few greedy ties may break differently.
        "greedy_agreement": same / generated,
        # Shared machines: PyTorch's 2 OpenMP threads degrade badly when the cores are busy.
        "load_average_1min": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }
    print(f"JAX sampler : {result['jax_tokens_per_s']:8.0f} tokens/s ({jax_s * 1e3:.0f} ms per batch)")
    print(f"torch HF    : {result['torch_tokens_per_s']:8.0f} tokens/s ({torch_s * 1e3:.0f} ms per batch)")
    print(f"speedup     : {result['speedup']:.2f}x   greedy agreement {result['greedy_agreement']:.3f}   "
          f"load average {result['load_average_1min']:.1f} on {result['cpu_count']} cores")
    if FLAGS.json:
        Path(FLAGS.json).parent.mkdir(parents=True, exist_ok=True)
        Path(FLAGS.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    app.run(main)
