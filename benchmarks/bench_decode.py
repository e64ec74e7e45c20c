"""Decode throughput of the embedded JAX sampler (porch_jax/models/sampler.py) at a named model shape, random
weights, on whatever backend JAX has: `batch` prompts of `prompt` random tokens, exactly `new` tokens each (eos
ignored), greedy, weights and KV cache in the compute dtype.

    python benchmarks/bench_decode.py --shape qwen3_1p7b --batch 32 --new 128 --dtype bf16   # a GPU or TPU host
    python benchmarks/bench_decode.py --shape tiny --batch 8 --new 16                        # CI

Reports the median of `--repeats` timed calls after one that compiles: new tokens per second over the batch, and
seconds per decode step (prefill included, so short runs understate the steady decode rate).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.train_steps import SHAPES, shape_config  # noqa: E402

DTYPES = {"f32": "float32", "bf16": "bfloat16"}


def measure(shape: str, *, batch: int, prompt: int, new: int, dtype: str, repeats: int, layers: int | None = None):
    import jax.numpy as jnp
    import numpy as np

    from porch_jax.models import ModelConfig, init_model
    from porch_jax.models.sampler import Sampler, SamplingParams

    hf = shape_config(shape, layers)
    compute = jnp.dtype(DTYPES[dtype])
    model = init_model(ModelConfig.from_hf(hf), 0, dtype=compute, param_dtype=compute)
    sampler = Sampler(model, None, max_len=prompt + new, prompt_buckets=(prompt,), batch_buckets=(batch,))
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, hf["vocab_size"], (batch, prompt)).tolist()
    params = SamplingParams(max_new_tokens=new, ignore_eos=True)
    t0 = time.perf_counter()
    first = sampler.generate(prompts, params)
    compile_s = time.perf_counter() - t0
    assert all(len(c.token_ids) == new for c in first), "a request ended before its new tokens"
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sampler.generate(prompts, params)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return {
        "shape": shape,
        "layers": hf["num_hidden_layers"],
        "dtype": DTYPES[dtype],
        "batch": batch,
        "prompt_tokens": prompt,
        "new_tokens": new,
        "first_call_s": compile_s,
        "call_s": seconds,
        "call_s_all": times,
        "tokens_per_s": batch * new / seconds,
        "s_per_decode_step": seconds / new,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="tiny")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    r = measure(
        args.shape,
        batch=args.batch,
        prompt=args.prompt,
        new=args.new,
        dtype=args.dtype,
        repeats=args.repeats,
        layers=args.layers,
    )
    print(
        f"{r['shape']} decode, batch {r['batch']} x {r['new_tokens']} new tokens ({r['dtype']}): "
        f"{r['tokens_per_s']:,.0f} tok/s, {r['s_per_decode_step'] * 1e3:.2f} ms/step (first call {r['first_call_s']:.0f} s)"
    )
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    return r


if __name__ == "__main__":
    main()
