"""Forward + backward throughput of a Gated DeltaNet layer stack: ours (JAX) against transformers'
PyTorch fallback (the chunked torch path, as used without flash-linear-attention), same weights.

Each layer is x + GatedDeltaNet(x) (projections, conv, chunked delta rule, gated norm, out_proj);
the loss is a fixed random projection of the output, differentiated with respect to every
parameter and the input. float32 on the CPU; compilation excluded. The two frameworks run in
alternating rounds in one process, so that load from other processes on a shared machine hits both
alike; medians over all timed steps, and the median of the per-round ratios. The
head layout keeps Qwen3.5-9B's ratios: key dim = hidden / 2, value dim = hidden, twice as many
value heads as key heads.

    python -m benchmarks.bench_deltanet --json runs/bench_deltanet.json
    python -m benchmarks.bench_deltanet --component rule   # the chunked delta rule alone
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 2, "Sequences per step.")
flags.DEFINE_integer("seq", 1024, "Tokens per sequence.")
flags.DEFINE_integer("hidden", 256, "Hidden size.")
flags.DEFINE_integer("layers", 4, "DeltaNet layers in the stack.")
flags.DEFINE_integer("head_dim", 64, "Key and value head dim.")
flags.DEFINE_integer("repeats", 5, "Timed steps per framework and round.")
flags.DEFINE_integer("rounds", 3, "Alternating rounds (JAX, then PyTorch).")
flags.DEFINE_integer("threads", 2, "torch.set_num_threads.")
flags.DEFINE_string("json", None, "Also write the results to this JSON file.")
flags.DEFINE_enum("component", "stack", ["stack", "rule"],
                  "stack: the whole layer stack; rule: only the chunked delta rule of one layer (its shapes, "
                  "l2-normalised q/k), forward + backward w.r.t. q, k, v, g, beta, against transformers' torch one.")


def _alternating(jax_step, torch_step, rounds: int, repeats: int) -> tuple[float, float, float]:
    """(JAX median s, PyTorch median s, median of the per-round ratios PyTorch / JAX), both warmed up."""
    jax_step(), torch_step()
    times: dict[str, list[float]] = {"jax": [], "torch": []}
    ratios = []
    for _ in range(rounds):
        medians = {}
        for name, fn in (("jax", jax_step), ("torch", torch_step)):
            run = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                run.append(time.perf_counter() - start)
            times[name] += run
            medians[name] = statistics.median(run)
        ratios.append(medians["torch"] / medians["jax"])
    return statistics.median(times["jax"]), statistics.median(times["torch"]), statistics.median(ratios)


def _hf_config() -> dict:
    from porch_jax.models.presets import preset

    key_heads = FLAGS.hidden // 2 // FLAGS.head_dim
    return preset(
        "qwen3.5-tiny", hidden_size=FLAGS.hidden, num_hidden_layers=FLAGS.layers,
        layer_types=["linear_attention"] * FLAGS.layers, linear_num_key_heads=key_heads,
        linear_num_value_heads=2 * key_heads, linear_key_head_dim=FLAGS.head_dim, linear_value_head_dim=FLAGS.head_dim,
    )


def _rule_main() -> dict:
    """The chunked rule alone: what is left of a layer's time once projections, conv and norm are out."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from porch_jax.models.deltanet import chunk_gated_delta_rule, l2norm

    torch.set_num_threads(FLAGS.threads)
    hk = FLAGS.hidden // 2 // FLAGS.head_dim
    b, t, h, d = FLAGS.batch, FLAGS.seq, 2 * hk, FLAGS.head_dim
    rng = np.random.RandomState(0)
    q = np.asarray(l2norm(jnp.asarray(rng.randn(b, t, hk, d), jnp.float32))) * d**-0.5
    k = np.asarray(l2norm(jnp.asarray(rng.randn(b, t, hk, d), jnp.float32)))
    v = rng.randn(b, t, h, d).astype(np.float32)
    g = (-0.3 * np.abs(rng.randn(b, t, h))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.randn(b, t, h)))).astype(np.float32)
    probe = rng.randn(b, t, h, d).astype(np.float32)

    def jax_loss(*args):
        return jnp.sum(chunk_gated_delta_rule(*args)[0] * probe)

    step = jax.jit(jax.value_and_grad(jax_loss, argnums=tuple(range(5))))
    args = [jnp.asarray(x) for x in (q, k, v, g, beta)]
    jax_value = float(step(*args)[0])

    # torch's rule takes q/k per value head and scales q itself: undo our scale, repeat the heads.
    repeated = (np.repeat(q * d**0.5, 2, axis=2), np.repeat(k, 2, axis=2))
    leaves = [torch.tensor(x, requires_grad=True) for x in (*repeated, v, g, beta)]
    probe_torch = torch.tensor(probe)

    def torch_step() -> float:
        for x in leaves:
            x.grad = None
        loss = (modeling_qwen3_5.torch_chunk_gated_delta_rule(*leaves)[0] * probe_torch).sum()
        loss.backward()
        return loss.item()

    torch_value = torch_step()
    jax_s, torch_s, speedup = _alternating(lambda: jax.block_until_ready(step(*args)), torch_step,
                                           FLAGS.rounds, FLAGS.repeats)
    print(f"chunked delta rule, batch {b} x {t} tokens, {hk} key / {h} value heads of {d}, fwd+bwd:")
    print(f"  jax   {jax_s * 1e3:8.1f} ms\n  torch {torch_s * 1e3:8.1f} ms")
    print(f"  speedup {speedup:.2f}x, median of {FLAGS.rounds} rounds (same loss to {abs(jax_value - torch_value):.1e})")
    return {"component": "rule", "batch": b, "seq": t, "key_heads": hk, "value_heads": h, "head_dim": d,
            "jax_median_s": jax_s, "torch_median_s": torch_s, "speedup": speedup,
            "loss_abs_diff": abs(jax_value - torch_value)}


def main(_) -> None:
    results = _rule_main() if FLAGS.component == "rule" else _stack_main()
    if FLAGS.json:
        Path(FLAGS.json).parent.mkdir(parents=True, exist_ok=True)
        Path(FLAGS.json).write_text(json.dumps(results, indent=2) + "\n")


def _stack_main() -> dict:
    """The layer stack: projections, conv, rule, gated norm and out_proj, as a model runs them."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from flax import nnx
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    from porch_jax.models.config import ModelConfig
    from porch_jax.models.qwen3_5 import GatedDeltaNet

    torch.set_num_threads(FLAGS.threads)
    torch.manual_seed(0)
    hf = _hf_config()
    torch_layers = torch.nn.ModuleList(
        Qwen3_5GatedDeltaNet(Qwen3_5TextConfig(**hf), i) for i in range(FLAGS.layers)
    ).float()
    config = ModelConfig.from_hf(hf)
    layers = nnx.List(
        GatedDeltaNet(config, rngs=nnx.Rngs(i), dtype=jnp.float32, param_dtype=jnp.float32)
        for i in range(FLAGS.layers)
    )
    h = FLAGS.hidden
    for ours, theirs in zip(layers, torch_layers):  # same weights on both sides
        w = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
        ours.in_proj_qkv[...] = jnp.asarray(w["in_proj_qkv.weight"].T)
        ours.in_proj_z[...] = jnp.asarray(w["in_proj_z.weight"].T.reshape(ours.in_proj_z.shape))
        ours.in_proj_b[...] = jnp.asarray(w["in_proj_b.weight"].T)
        ours.in_proj_a[...] = jnp.asarray(w["in_proj_a.weight"].T)
        ours.conv1d[...] = jnp.asarray(w["conv1d.weight"])
        ours.dt_bias[...], ours.A_log[...] = jnp.asarray(w["dt_bias"]), jnp.asarray(w["A_log"])
        ours.norm.weight[...] = jnp.asarray(w["norm.weight"])
        ours.out_proj[...] = jnp.asarray(w["out_proj.weight"].T.reshape(ours.out_proj.shape))

    rng = np.random.RandomState(0)
    x = rng.randn(FLAGS.batch, FLAGS.seq, h).astype(np.float32)
    probe = rng.randn(FLAGS.batch, FLAGS.seq, h).astype(np.float32) / np.sqrt(x.size)

    def jax_loss(layers, x):
        for layer in layers:
            x = x + layer(x, mask=None, segment_ids=None)[0]
        return jnp.sum(x * probe)

    step = jax.jit(nnx.value_and_grad(jax_loss, argnums=(0, 1)))
    x_jax = jnp.asarray(x)
    jax_value = float(step(layers, x_jax)[0])

    x_torch, probe_torch = torch.tensor(x, requires_grad=True), torch.tensor(probe)

    def torch_step() -> float:
        torch_layers.zero_grad()
        x_torch.grad = None
        y = x_torch
        for layer in torch_layers:
            y = y + layer(y)
        loss = (y * probe_torch).sum()
        loss.backward()
        return loss.item()

    torch_value = torch_step()
    jax_s, torch_s, speedup = _alternating(lambda: jax.block_until_ready(step(layers, x_jax)), torch_step,
                                           FLAGS.rounds, FLAGS.repeats)

    tokens = FLAGS.batch * FLAGS.seq
    results = {
        "batch": FLAGS.batch, "seq": FLAGS.seq, "hidden": h, "layers": FLAGS.layers,
        "key_heads": hf["linear_num_key_heads"], "value_heads": hf["linear_num_value_heads"], "head_dim": FLAGS.head_dim,
        "jax_median_s": jax_s, "torch_median_s": torch_s,
        "jax_tokens_per_s": tokens / jax_s, "torch_tokens_per_s": tokens / torch_s, "speedup": speedup, "rounds": FLAGS.rounds,
        "loss_abs_diff": abs(jax_value - torch_value),
    }
    print(f"DeltaNet x{FLAGS.layers}, batch {FLAGS.batch} x {FLAGS.seq} tokens, hidden {h}, "
          f"{results['key_heads']} key / {results['value_heads']} value heads of {FLAGS.head_dim}, fwd+bwd:")
    print(f"  jax   {jax_s * 1e3:8.1f} ms  {results['jax_tokens_per_s']:9.0f} tokens/s")
    print(f"  torch {torch_s * 1e3:8.1f} ms  {results['torch_tokens_per_s']:9.0f} tokens/s")
    print(f"  speedup {results['speedup']:.2f}x, median of {FLAGS.rounds} rounds  (same loss to {results['loss_abs_diff']:.1e})")
    return results


if __name__ == "__main__":
    app.run(main)
