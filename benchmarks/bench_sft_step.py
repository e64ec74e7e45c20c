"""SFT train-step throughput on CPU: our jitted step vs the machine's matmul peak vs PyTorch.

    python benchmarks/bench_sft_step.py [--rounds 5] [--batch 4] [--seq 512] [--json OUT]

Model: Qwen3-style, hidden 512, 8 layers, 8 query / 4 kv heads of 64, MLP 1536, vocab 2048,
tied embeddings; batch 4 x 512 tokens, loss on every next-token position, AdamW, float32.
glibc malloc is tuned for XLA (porch_jax.runtime.tune_malloc) unless --no-malloc-tuning.

FLOPs are counted analytically (benchmarks/flops.py). Achieved FLOP/s = that / step time, compared
with this machine's f32 matmul rate measured in the same run (a jitted 2048^3 jnp.dot). The PyTorch baseline is transformers' Qwen3ForCausalLM
(sdpa attention) with torch.optim.AdamW, the same config, batch and loss, all CPU threads
(--single-thread: one thread each, steadier when other work shares the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.flops import DTYPES, matmul_runner, qwen3_step_flops  # noqa: E402

HF = {
    "model_type": "qwen3",
    "vocab_size": 2048,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
}


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _times(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call: CPU time is the steadier figure on a shared machine."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def jax_runner(batch: int, seq: int, dtype: str = "f32"):
    """A callable running one step of our SFT trainer step, and the first (compiling) step's seconds.
    dtype bf16: bf16 compute, f32 parameters and optimizer state (launch/train.py's compute_dtype)."""
    import jax
    import numpy as np

    from porch_jax.models import ModelConfig, init_model
    from porch_jax.train import mesh as mesh_lib
    from porch_jax.train import optim
    from porch_jax.train import step as S
    from porch_jax.train.config import OptimizerConfig
    from porch_jax.train.methods import MethodConfig, make_method
    from porch_jax.train.packing import SeqRow, Span, seq_batch

    cfg = OptimizerConfig(learning_rate=1e-4, warmup_steps=10, total_steps=1000)
    mesh = mesh_lib.make_mesh((1, 1, 1))
    tx = optim.make_optimizer(cfg)
    graphdef, state, shardings = S.init_train_state(
        init_model(ModelConfig.from_hf(HF), seed=0, dtype=jax.numpy.dtype(DTYPES[dtype])), tx, mesh
    )
    method = make_method(MethodConfig(name="sft"))
    step = S.TrainStep(method, graphdef, tx, optim.learning_rate_schedule(cfg), mesh=mesh, state_shardings=shardings)
    rng = np.random.default_rng(0)
    # Prompt = 1 token, target = the other seq - 1 (one span): every next-token position carries loss, as in
    # the PyTorch loop (all rows of one length, so the per-decision mean is its token mean).
    rows = [
        SeqRow(tuple(int(t) for t in rng.integers(0, HF["vocab_size"], seq)), (Span(1, seq - 1),)) for _ in range(batch)
    ]
    batch_arrays = jax.tree.map(lambda x: jax.numpy.asarray(x[None]), {"policy": seq_batch(rows, seq, seq)})

    def run():
        nonlocal state
        state, metrics = step(state, batch_arrays)
        jax.block_until_ready(metrics)

    return run, _time(run)


def torch_runner(batch: int, seq: int, threads: int, dtype: str = "f32"):
    """A callable running one step of a plain PyTorch loop over transformers' Qwen3ForCausalLM (dtype bf16:
    under torch.autocast(cpu, bfloat16), f32 parameters)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    fields = {k: v for k, v in HF.items() if k != "model_type"}
    model = Qwen3ForCausalLM(Qwen3Config(**fields, attn_implementation="sdpa"))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)
    ids = torch.randint(0, HF["vocab_size"], (batch, seq))

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    run()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (medians reported)")
    parser.add_argument(
        "--dtype",
        choices=("f32", "bf16"),
        default="f32",
        help="bf16: mixed precision in both (bf16 matmuls, f32 parameters and optimizer state)",
    )
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument(
        "--single-thread",
        action="store_true",
        help="one thread for XLA and PyTorch: steadier numbers on a shared machine",
    )
    parser.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="keep glibc's default allocator settings (porch_jax.runtime.tune_malloc)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if not args.no_malloc_tuning:  # both frameworks in this process; before the first computation
        from porch_jax.runtime import tune_malloc

        tune_malloc()
    if args.single_thread:  # before JAX starts its backend
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    threads = 1 if args.single_thread else os.cpu_count() or 1

    tokens = args.batch * args.seq
    n, flops = qwen3_step_flops(HF, args.batch, args.seq)
    matmul, matmul_flops = matmul_runner(dtype=args.dtype)
    jax_step, first = jax_runner(args.batch, args.seq, args.dtype)
    torch_step = None if args.skip_torch else torch_runner(args.batch, args.seq, threads, args.dtype)
    # Each round times all three back to back, so a busy (shared) machine slows them alike; the
    # ratios are medians of per-round ratios.
    rounds = []
    for _ in range(args.rounds):
        r = {"matmul_s": statistics.median(_time(matmul) for _ in range(3))}
        r["jax_s"], r["jax_cpu_s"] = _times(jax_step)
        if torch_step is not None:
            r["torch_s"], r["torch_cpu_s"] = _times(torch_step)
        rounds.append(r)
    peak = matmul_flops / statistics.median(r["matmul_s"] for r in rounds)
    jax_time = statistics.median(r["jax_s"] for r in rounds)
    of_peak = statistics.median(flops / r["jax_s"] / (matmul_flops / r["matmul_s"]) for r in rounds)

    result = {
        "config": {**HF, "batch": args.batch, "seq": args.seq, "threads": threads, "dtype": args.dtype},
        "load_average_1min": os.getloadavg()[0],
        "matmul_params": n,
        "step_flops": flops,
        "matmul_peak_flops": peak,
        "rounds": rounds,
        "jax": {
            "step_s": jax_time,
            "first_step_s": first,
            "tokens_per_s": tokens / jax_time,
            "flops_per_s": flops / jax_time,
            "fraction_of_matmul_peak": of_peak,
        },
    }
    rows = [
        (f"matmul peak ({args.dtype}, jitted 2048^3 dot)", f"{peak / 1e9:,.1f} GFLOP/s", ""),
        ("JAX SFT step", f"{jax_time * 1e3:,.0f} ms", f"{tokens / jax_time:,.0f} tok/s"),
        ("JAX achieved", f"{flops / jax_time / 1e9:,.1f} GFLOP/s", f"{of_peak:.2f} of peak (target > 0.3)"),
        ("JAX first step (compile)", f"{first:,.1f} s", ""),
    ]
    if torch_step is not None:
        torch_time = statistics.median(r["torch_s"] for r in rounds)
        speedup = statistics.median(r["torch_s"] / r["jax_s"] for r in rounds)
        result["torch"] = {"step_s": torch_time, "tokens_per_s": tokens / torch_time, "flops_per_s": flops / torch_time}
        cpu_speedup = statistics.median(r["torch_cpu_s"] / r["jax_cpu_s"] for r in rounds)
        result["speedup_vs_torch"] = speedup
        result["cpu_speedup_vs_torch"] = cpu_speedup
        rows += [
            ("PyTorch SFT step", f"{torch_time * 1e3:,.0f} ms", f"{tokens / torch_time:,.0f} tok/s"),
            ("JAX / PyTorch throughput", f"{speedup:.2f}x", "target > 1.5x"),
            ("PyTorch / JAX CPU time per step", f"{cpu_speedup:.2f}x", ""),
        ]
    print(
        f"SFT step, batch {args.batch} x seq {args.seq}, {n / 1e6:.1f} M matmul params, "
        f"{flops / 1e9:,.1f} GFLOP per step, {threads} thread(s), medians of {args.rounds} rounds, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>18}  {note}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
