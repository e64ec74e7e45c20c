"""Train-step throughput: our JAX model against transformers' PyTorch model on CPU.

``--model qwen3-small`` (default): a random Qwen3 (hidden 256, 4 layers). ``--model smollm2``: the real
SmolLM2-135M-Instruct weights (porch_jax.models.smollm2, a Llama: 30 layers, hidden 576, vocabulary 49,152),
loaded by both frameworks from the same folder.

Same config, same batch, next-token cross-entropy, AdamW, forward + backward + update. The two
run in one process, in alternating rounds, so that load from other processes on a shared
machine hits both alike; the ratio is the figure to watch. On a loaded machine PyTorch's
OpenMP threads spin and stall, which flatters the 2-thread wall ratio: there, `--threads 1` and
the CPU-time ratio compare the computations honestly. glibc malloc is tuned for XLA
(porch_jax.runtime.tune_malloc, ~1.3x less CPU time for this step) unless --no-malloc-tuning.

Each round also times a jitted 2048^3 matmul in the run's dtype (this machine's practical peak) and, as one jitted
program, just the step's dense matmuls at their own shapes (projections and LM head, forward and
backward; benchmarks/flops.py). The first gives each framework's fraction of peak for the step's
analytic FLOPs; the second is a floor no implementation of the step can beat on this machine's GEMMs,
so PyTorch's step time / that floor bounds the speed-up any implementation could show over PyTorch.

    python benchmarks/bench_train_step.py [--steps 10] [--rounds 3] [--threads 2] [--json OUT]
    python benchmarks/bench_train_step.py --model smollm2 --dtype bf16 --loss fused --steps 3 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.flops import (
    DTYPES,
    matmul_floor_runner,
    matmul_runner,
    qwen3_matmul_shapes,
    qwen3_step_flops,
)
from porch_jax.models import ModelConfig, from_pretrained, init_model
from porch_jax.runtime import tune_malloc
from porch_jax.train.losses import token_cross_entropy, token_cross_entropy_from_hidden

CONFIG = ModelConfig(
    model_type="qwen3",
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    tie_word_embeddings=False,
)
LR, WEIGHT_DECAY = 1e-4, 0.01


def model_setup(name: str) -> tuple[ModelConfig, Path | None]:
    """The benchmark's model config, and the folder its weights come from (None: random initialisation)."""
    if name == "qwen3-small":
        return CONFIG, None
    from porch_jax.models.smollm2 import smollm2_folder

    folder = smollm2_folder()
    return ModelConfig.from_hf(json.loads((folder / "config.json").read_text())), folder


def jax_stepper(
    ids: np.ndarray, remat: bool, dtype: str = "f32", loss: str = "logits", config=CONFIG, folder: Path | None = None
):
    """A closure running one jitted train step (buffers donated); returns a blocking callable.
    dtype bf16: mixed precision, bf16 matmul operands with f32 parameters, accumulation, norms and softmax.
    loss "logits": log_softmax over the full [B, T, V] logits, as transformers computes it; "fused": our
    trainers' chunked LM-head cross-entropy (losses.token_cross_entropy_from_hidden), which never holds them."""
    compute = jnp.dtype(DTYPES[dtype])
    if folder is None:
        model = init_model(config, seed=0, remat=remat, dtype=compute)
    else:
        model = from_pretrained(folder, dtype=compute, param_dtype=jnp.float32, remat=remat)
    graphdef, params = nnx.split(model)
    tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
    state = [params, tx.init(params)]
    tokens = jnp.asarray(ids, jnp.int32)

    def loss_fn(p, tokens):
        model = nnx.merge(graphdef, p)
        if loss == "fused":
            hidden = model.hidden_states(tokens[:, :-1])
            head = model.lm_head_kernel().astype(model.dtype)
            total, count = token_cross_entropy_from_hidden(
                hidden, head, tokens[:, 1:], jnp.ones_like(tokens[:, 1:], bool)
            )
            return total / count
        # As transformers' ForCausalLMLoss: labels shifted left, the last position ignored (no slice of the logits).
        labels = jnp.roll(tokens, -1, axis=1)
        scored = jnp.broadcast_to(jnp.arange(tokens.shape[1]) < tokens.shape[1] - 1, tokens.shape)
        total, count = token_cross_entropy(model(tokens), labels, scored)
        return total / count

    @jax.jit(donate_argnums=(0, 1))
    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def run() -> float:
        params, opt_state, loss = step(*state, tokens)
        state[:] = [params, opt_state]
        return float(loss)

    return run


def torch_stepper(ids: np.ndarray, threads: int, dtype: str = "f32", config=CONFIG, folder: Path | None = None):
    """dtype bf16: torch.autocast(cpu, bfloat16) over forward and loss, f32 parameters (PyTorch's mixed precision)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if folder is None:
        hf = {k: v for k, v in config.to_hf().items() if k != "architectures"}
        model = Qwen3ForCausalLM(Qwen3Config(**hf)).train()
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    tokens = torch.tensor(ids, dtype=torch.long)

    def run() -> float:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        return float(loss.detach())

    return run


def timed(run, steps: int) -> list[tuple[float, float]]:
    """(wall, process CPU) seconds per step. CPU time is the steadier figure on a shared machine."""
    times = []
    for _ in range(steps):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("qwen3-small", "smollm2"), default="qwen3-small")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round and framework")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--remat", action="store_true")
    parser.add_argument(
        "--dtype",
        choices=("f32", "bf16"),
        default="f32",
        help="bf16: mixed precision in both frameworks (f32 parameters and optimizer state)",
    )
    parser.add_argument(
        "--loss",
        choices=("logits", "fused"),
        default="logits",
        help="ours: full logits + log_softmax (as transformers), or our trainers' chunked LM-head loss",
    )
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--threads", type=int, choices=(1, 2), default=2, help="CPU threads for each framework")
    parser.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="keep glibc's default allocator settings (porch_jax.runtime.tune_malloc)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if not args.no_malloc_tuning:
        tune_malloc()
    if args.threads == 1:  # read when the backend starts, i.e. at the first computation
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + (
            " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )

    config, folder = model_setup(args.model)
    ids = np.random.RandomState(0).randint(0, config.vocab_size, (args.batch, args.seq))
    runners = {"jax": jax_stepper(ids, args.remat, args.dtype, args.loss, config, folder)}
    if not args.skip_torch:
        runners["torch"] = torch_stepper(ids, args.threads, args.dtype, config, folder)
        if args.dtype == "bf16":  # the goal compares our mixed precision with torch's f32 step too
            runners["torch_f32"] = torch_stepper(ids, args.threads, "f32", config, folder)
    for run in runners.values():
        timed(run, args.warmup)
    matmul, matmul_flops = matmul_runner(dtype=args.dtype)
    floor, floor_flops = matmul_floor_runner(qwen3_matmul_shapes(config.to_hf(), args.batch, args.seq), args.dtype)
    matmul_s: list[float] = []
    floor_s: list[float] = []
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        matmul_s += [wall for wall, _ in timed(matmul, 3)]
        floor_s += [wall for wall, _ in timed(floor, 3)]
        for name, run in runners.items():
            times[name] += timed(run, args.steps)

    tokens = args.batch * args.seq
    _, flops = qwen3_step_flops(config.to_hf(), args.batch, args.seq)
    peak = matmul_flops / statistics.median(matmul_s)
    floor_time = statistics.median(floor_s)
    results = {
        "config": vars(args) | {"json": str(args.json)},
        "devices": str(jax.devices()[0].platform),
        "load_average_1min": os.getloadavg()[0],
        "step_flops": flops,
        "matmul_peak_flops": peak,
        "matmul_floor_s": floor_time,
        "matmul_floor_flops": floor_flops,
    }
    print(
        f"step {flops / 1e9:.1f} GFLOP; matmul peak {peak / 1e9:.1f} GFLOP/s ({args.dtype} 2048^3 dot); "
        f"the step's dense matmuls alone ({floor_flops / 1e9:.1f} GFLOP): {floor_time * 1e3:.1f} ms, "
        f"{floor_flops / floor_time / 1e9:.1f} GFLOP/s; load average {os.getloadavg()[0]:.1f}"
    )
    for name, t in times.items():
        median = statistics.median(wall for wall, _ in t)
        cpu = statistics.median(c for _, c in t)
        of_peak = flops / median / peak
        results[name] = {
            "median_step_s": median,
            "tokens_per_s": tokens / median,
            "median_cpu_s": cpu,
            "steps": len(t),
            "fraction_of_matmul_peak": of_peak,
        }
        print(
            f"{name:>5}: median step {median * 1e3:7.1f} ms   {tokens / median:8.0f} tokens/s   "
            f"CPU {cpu * 1e3:7.1f} ms/step   {of_peak:.2f} of peak   ({len(t)} steps)"
        )
    if "torch" in results:
        results["ratio"] = results["jax"]["tokens_per_s"] / results["torch"]["tokens_per_s"]
        results["cpu_ratio"] = results["torch"]["median_cpu_s"] / results["jax"]["median_cpu_s"]
        results["ceiling_at_peak"] = 1 / results["torch"]["fraction_of_matmul_peak"]
        results["ceiling_at_floor"] = results["torch"]["median_step_s"] / floor_time
        if "torch_f32" in results:
            results["ratio_vs_torch_f32"] = results["jax"]["tokens_per_s"] / results["torch_f32"]["tokens_per_s"]
            print(f"ratio jax ({args.dtype}) / torch f32: {results['ratio_vs_torch_f32']:.2f}x wall")
        print(
            f"ratio jax/torch: {results['ratio']:.2f}x wall, {results['cpu_ratio']:.2f}x CPU time; "
            f"upper bounds on any ratio: {results['ceiling_at_peak']:.2f}x (all FLOPs at the 2048^3 peak), "
            f"{results['ceiling_at_floor']:.2f}x (PyTorch step / the step's matmuls alone)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
