"""Decode throughput of the JAX sampler against transformers' PyTorch `generate`, same weights.

Both decode greedily with a KV cache: batch 8, 64-token prompts, exactly 128 new tokens (eos
ignored), float32, on the CPU. Reports the median over repeats (compilation / warm-up excluded).
The two alternate repeat by repeat, so load from other processes hits both alike; besides wall
time, each repeat's process CPU time is recorded: on a shared machine PyTorch's OpenMP threads
spin and stall, and `--single_thread` (one thread each) with the CPU-time ratio compares the
computations honestly.

    python -m benchmarks.bench_sampler [--single_thread] --json runs/bench_sampler.json
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
flags.DEFINE_bool("single_thread", False, "One thread for XLA and for PyTorch (overrides --threads).")
flags.DEFINE_bool("malloc_tuning", True, "Tune glibc malloc for XLA (porch_jax.runtime.tune_malloc).")
flags.DEFINE_string("json", None, "Also write the results to this JSON file.")

MODEL = {
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
}


def _timed(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _jax_runner(folder: Path, prompts: list[list[int]]):
    """A callable generating one batch with our sampler, and the list its outputs go to."""
    from transformers import AutoTokenizer

    from porch_jax.models import from_pretrained
    from porch_jax.models.sampler import Sampler, SamplingParams

    sampler = Sampler(
        from_pretrained(folder),
        AutoTokenizer.from_pretrained(folder),
        max_len=FLAGS.prompt_len + FLAGS.new_tokens,
        prompt_buckets=(FLAGS.prompt_len,),
    )
    params = SamplingParams(max_new_tokens=FLAGS.new_tokens, ignore_eos=True)
    outputs = []
    return (lambda: outputs.append([c.token_ids for c in sampler.generate(prompts, params)])), outputs


def _torch_runner(folder: Path, prompts: list[list[int]], threads: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    input_ids = torch.tensor(prompts)
    outputs = []

    def run():
        with torch.inference_mode():
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=FLAGS.new_tokens,
                min_new_tokens=FLAGS.new_tokens,
            )
        outputs.append(out[:, FLAGS.prompt_len :].tolist())

    return run, outputs


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.single_thread:  # read when JAX's backend starts, i.e. at the first computation
        os.environ["XLA_FLAGS"] = (
            f"{os.environ.get('XLA_FLAGS', '')} "
            "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1".strip()
        )
    threads = 1 if FLAGS.single_thread else FLAGS.threads
    if FLAGS.malloc_tuning:  # both frameworks in this process; before the first computation
        from porch_jax.runtime import tune_malloc

        tune_malloc()
    import numpy as np

    from porch_jax.models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_model(Path(tmp) / "model", seed=0, **MODEL)
        rng = np.random.default_rng(0)
        prompts = rng.integers(0, 2000, size=(FLAGS.batch, FLAGS.prompt_len)).tolist()
        runners = {"jax": _jax_runner(folder, prompts), "torch": _torch_runner(folder, prompts, threads)}
        for run, _ in runners.values():
            run()  # compile / warm up
        times = {name: [] for name in runners}
        for _ in range(FLAGS.repeats):
            for name, (run, _) in runners.items():
                times[name].append(_timed(run))
    jax_tokens, torch_tokens = runners["jax"][1][-1], runners["torch"][1][-1]
    jax_s, torch_s = (statistics.median(w for w, _ in times[n]) for n in ("jax", "torch"))
    jax_cpu, torch_cpu = (statistics.median(c for _, c in times[n]) for n in ("jax", "torch"))

    generated = FLAGS.batch * FLAGS.new_tokens
    same = sum(a == b for ja, tb in zip(jax_tokens, torch_tokens, strict=True) for a, b in zip(ja, tb, strict=False))
    result = {
        "batch": FLAGS.batch,
        "prompt_len": FLAGS.prompt_len,
        "new_tokens": FLAGS.new_tokens,
        "model": MODEL,
        "threads": threads,
        "jax_seconds": jax_s,
        "torch_seconds": torch_s,
        "jax_tokens_per_s": generated / jax_s,
        "torch_tokens_per_s": generated / torch_s,
        "speedup": torch_s / jax_s,
        "jax_cpu_seconds": jax_cpu,
        "torch_cpu_seconds": torch_cpu,
        "cpu_speedup": torch_cpu / jax_cpu,
        # Random weights give near-flat logits, so a few greedy ties may break differently.
        "greedy_agreement": same / generated,
        # Shared machines: PyTorch's 2 OpenMP threads degrade badly when the cores are busy.
        "load_average_1min": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }
    print(
        f"JAX sampler : {result['jax_tokens_per_s']:8.0f} tokens/s ({jax_s * 1e3:.0f} ms per batch, "
        f"CPU {jax_cpu * 1e3:.0f} ms)"
    )
    print(
        f"torch HF    : {result['torch_tokens_per_s']:8.0f} tokens/s ({torch_s * 1e3:.0f} ms per batch, "
        f"CPU {torch_cpu * 1e3:.0f} ms)"
    )
    print(
        f"speedup     : {result['speedup']:.2f}x wall, {result['cpu_speedup']:.2f}x CPU time   "
        f"greedy agreement {result['greedy_agreement']:.3f}   {threads} thread(s), "
        f"load average {result['load_average_1min']:.1f} on {result['cpu_count']} cores"
    )
    if FLAGS.json:
        Path(FLAGS.json).parent.mkdir(parents=True, exist_ok=True)
        Path(FLAGS.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    app.run(main)
