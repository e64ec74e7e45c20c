"""Forward + backward throughput of a Gated DeltaNet layer stack: ours (JAX) against transformers'
PyTorch fallback (the chunked torch path, as used without flash-linear-attention), same weights.

Each layer is x + GatedDeltaNet(x) (projections, conv, delta rule, gated norm, out_proj), the delta
rule and conv in the form our models run (on a CPU the native kernels; PORCH_JAX_CPU_KERNELS=off times
the chunked rule and XLA conv that GPUs and TPUs run);
the loss is a fixed random projection of the output, differentiated with respect to every
parameter and the input. float32 on the CPU; compilation excluded. The two frameworks run in
alternating rounds in one process, so that load from other processes on a shared machine hits both
alike; medians over all timed steps, and the median of the per-round ratios. The
head layout keeps Qwen3.5-9B's ratios: key dim = hidden / 2, value dim = hidden, twice as many
value heads as key heads.

    python -m benchmarks.bench_deltanet --json runs/bench_deltanet.json
    python -m benchmarks.bench_deltanet --component rule   # the delta rule alone: both our forms and torch's
    python -m benchmarks.bench_deltanet --component floor  # what a free rule would give, and what 2x asks of ours
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path
from unittest import mock

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
flags.DEFINE_float("target", 2.0, "--component floor: the stack speed-up whose demands on the rule are reported.")
flags.DEFINE_enum(
    "component",
    "stack",
    ["stack", "rule", "floor"],
    "stack: the whole layer stack; rule: only the delta rule of one layer (its shapes, l2-normalised "
    "q/k), forward + backward w.r.t. q, k, v, g, beta: the form our models run here (on a CPU, the native "
    "kernel) and the chunked form, against transformers' torch one; floor: the stack, and again with "
    "both rules replaced by a free elementwise stand-in: what the rule costs in each framework, and "
    "what --target asks of ours.",
)


def _alternating(steps: dict, rounds: int, repeats: int) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Runs the steps (name -> callable) in turn, `repeats` timed calls each per round, after one
    warm-up call each. Returns the median seconds of every step over all its calls, and each round's
    medians (for per-round ratios: load from other processes hits the steps of a round alike)."""
    for fn in steps.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    per_round = []
    for _ in range(rounds):
        medians = {}
        for name, fn in steps.items():
            run = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                run.append(time.perf_counter() - start)
            times[name] += run
            medians[name] = statistics.median(run)
        per_round.append(medians)
    return {name: statistics.median(t) for name, t in times.items()}, per_round


def _speedup(per_round: list[dict[str, float]], ours: str = "jax", theirs: str = "torch") -> float:
    """Median over rounds of theirs / ours."""
    return statistics.median(r[theirs] / r[ours] for r in per_round)


def _key_heads() -> int:
    """Qwen3.5-9B's ratios: key dim = hidden / 2 (value heads: twice as many, value dim = hidden)."""
    return FLAGS.hidden // 2 // FLAGS.head_dim


def _rule_shapes() -> dict[str, tuple[int, ...]]:
    """The rule's operand shapes in one layer: q and k, v, and g and beta."""
    b, t, hk, d = FLAGS.batch, FLAGS.seq, _key_heads(), FLAGS.head_dim
    return {"qk": (b, t, hk, d), "v": (b, t, 2 * hk, d), "g": (b, t, 2 * hk)}


def _hf_config() -> dict:
    from porch_jax.models.presets import preset

    key_heads = _key_heads()
    return preset(
        "qwen3.5-tiny",
        hidden_size=FLAGS.hidden,
        num_hidden_layers=FLAGS.layers,
        layer_types=["linear_attention"] * FLAGS.layers,
        linear_num_key_heads=key_heads,
        linear_num_value_heads=2 * key_heads,
        linear_key_head_dim=FLAGS.head_dim,
        linear_value_head_dim=FLAGS.head_dim,
    )


def _rule_main() -> dict:
    """The chunked rule alone: what is left of a layer's time once projections, conv and norm are out."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from porch_jax.models.deltanet import chunk_gated_delta_rule, gated_delta_rule, l2norm

    torch.set_num_threads(FLAGS.threads)
    shapes = _rule_shapes()
    b, t, hk, d = shapes["qk"]
    h = shapes["v"][2]
    rng = np.random.RandomState(0)
    q = np.asarray(l2norm(jnp.asarray(rng.randn(*shapes["qk"]), jnp.float32))) * d**-0.5
    k = np.asarray(l2norm(jnp.asarray(rng.randn(*shapes["qk"]), jnp.float32)))
    v = rng.randn(*shapes["v"]).astype(np.float32)
    g = (-0.3 * np.abs(rng.randn(*shapes["g"]))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.randn(*shapes["g"])))).astype(np.float32)
    probe = rng.randn(*shapes["v"]).astype(np.float32)

    def jax_step(rule):
        step = jax.jit(jax.value_and_grad(lambda *a: jnp.sum(rule(*a)[0] * probe), argnums=tuple(range(5))))
        return lambda: jax.block_until_ready(step(*args))

    args = [jnp.asarray(x) for x in (q, k, v, g, beta)]
    ours = {"jax": jax_step(gated_delta_rule), "jax_chunked": jax_step(chunk_gated_delta_rule)}
    jax_value = float(ours["jax"]()[0])

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
    medians, per_round = _alternating(ours | {"torch": torch_step}, FLAGS.rounds, FLAGS.repeats)
    speedup, chunked_speedup = _speedup(per_round), _speedup(per_round, "jax_chunked")
    print(f"delta rule, batch {b} x {t} tokens, {hk} key / {h} value heads of {d}, fwd+bwd:")
    print(f"  jax (the form models run here) {medians['jax'] * 1e3:8.1f} ms  {speedup:.2f}x")
    print(f"  jax, chunked form              {medians['jax_chunked'] * 1e3:8.1f} ms  {chunked_speedup:.2f}x")
    print(f"  torch (chunked)                {medians['torch'] * 1e3:8.1f} ms")
    print(f"  speedups: median of {FLAGS.rounds} rounds (same loss to {abs(jax_value - torch_value):.1e})")
    return {
        "component": "rule",
        "batch": b,
        "seq": t,
        "key_heads": hk,
        "value_heads": h,
        "head_dim": d,
        "jax_median_s": medians["jax"],
        "jax_chunked_median_s": medians["jax_chunked"],
        "torch_median_s": medians["torch"],
        "speedup": speedup,
        "chunked_speedup": chunked_speedup,
        "loss_abs_diff": abs(jax_value - torch_value),
    }


def main(_) -> None:
    results = _rule_main() if FLAGS.component == "rule" else _stack_main()  # stack and floor
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
        GatedDeltaNet(config, rngs=nnx.Rngs(i), dtype=jnp.float32, param_dtype=jnp.float32) for i in range(FLAGS.layers)
    )
    h = FLAGS.hidden
    for ours, theirs in zip(layers, torch_layers, strict=True):  # same weights on both sides
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

    x_jax = jnp.asarray(x)
    x_torch, probe_torch = torch.tensor(x, requires_grad=True), torch.tensor(probe)

    def jax_stepper(free_rule: bool):
        step = jax.jit(nnx.value_and_grad(jax_loss, argnums=(0, 1)))
        with _rules_replaced(free_rule):  # traced (and compiled) here, once
            step(layers, x_jax)
        return lambda: float(jax.block_until_ready(step(layers, x_jax))[0])

    def torch_stepper(free_rule: bool):
        def run() -> float:
            torch_layers.zero_grad()
            x_torch.grad = None
            y = x_torch
            with _rules_replaced(free_rule):
                for layer in torch_layers:
                    y = y + layer(y)
            loss = (y * probe_torch).sum()
            loss.backward()
            return loss.item()

        return run

    steps = {"jax": jax_stepper(False), "torch": torch_stepper(False)}
    if FLAGS.component == "floor":
        steps |= {"jax_free_rule": jax_stepper(True), "torch_free_rule": torch_stepper(True)}
    loss_diff = abs(steps["jax"]() - steps["torch"]())
    medians, per_round = _alternating(steps, FLAGS.rounds, FLAGS.repeats)
    jax_s, torch_s = medians["jax"], medians["torch"]

    tokens = FLAGS.batch * FLAGS.seq
    results = {
        "batch": FLAGS.batch,
        "seq": FLAGS.seq,
        "hidden": h,
        "layers": FLAGS.layers,
        "key_heads": hf["linear_num_key_heads"],
        "value_heads": hf["linear_num_value_heads"],
        "head_dim": FLAGS.head_dim,
        "jax_median_s": jax_s,
        "torch_median_s": torch_s,
        "jax_tokens_per_s": tokens / jax_s,
        "torch_tokens_per_s": tokens / torch_s,
        "speedup": _speedup(per_round),
        "rounds": FLAGS.rounds,
        "loss_abs_diff": loss_diff,
    }
    print(
        f"DeltaNet x{FLAGS.layers}, batch {FLAGS.batch} x {FLAGS.seq} tokens, hidden {h}, "
        f"{results['key_heads']} key / {results['value_heads']} value heads of {FLAGS.head_dim}, fwd+bwd:"
    )
    print(f"  jax   {jax_s * 1e3:8.1f} ms  {results['jax_tokens_per_s']:9.0f} tokens/s")
    print(f"  torch {torch_s * 1e3:8.1f} ms  {results['torch_tokens_per_s']:9.0f} tokens/s")
    print(f"  speedup {results['speedup']:.2f}x, median of {FLAGS.rounds} rounds  (same loss to {loss_diff:.1e})")
    if FLAGS.component == "floor":
        results |= _floor_report(medians, per_round)
    return results


def _free_rule_jax(q, k, v, g, beta, *, initial_state=None, segment_ids=None):
    """Stands in for the chunked rule at no cost: elementwise in every input, so the rest of the
    layer (and its backward) runs unchanged. Not the rule: for the floor measurement only."""
    import jax.numpy as jnp

    group = v.shape[2] // q.shape[2]
    return v * (beta + g)[..., None] + jnp.repeat(q + k, group, axis=2), initial_state


def _free_rule_torch(
    query, key, value, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False, **_
):
    """transformers' counterpart of `_free_rule_jax` (with the l2 norm its rule applies inside)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import l2norm

    if use_qk_l2norm_in_kernel:
        query, key = l2norm(query, dim=-1, eps=1e-6), l2norm(key, dim=-1, eps=1e-6)
    group = value.shape[2] // query.shape[2]
    return value * (beta + g)[..., None] + (query + key).repeat_interleave(group, dim=2), None


@contextlib.contextmanager
def _rules_replaced(free: bool):
    """Both frameworks' chunked delta rule replaced by the free stand-ins while inside (free=True)."""
    if not free:
        yield
        return
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from porch_jax.models import deltanet

    with (
        mock.patch.object(deltanet, "gated_delta_rule", _free_rule_jax),
        mock.patch.object(modeling_qwen3_5, "torch_chunk_gated_delta_rule", _free_rule_torch),
    ):
        yield


def _floor_report(medians: dict[str, float], per_round: list[dict[str, float]]) -> dict:
    """What the rule costs per layer in each framework (the stack's time less the free-rule stack's),
    and the time our rule may take, per layer, for the stack to be `--target` x PyTorch's."""
    n = FLAGS.layers
    rule = {name: (medians[name] - medians[f"{name}_free_rule"]) / n for name in ("jax", "torch")}
    budget = (medians["torch"] / FLAGS.target - medians["jax_free_rule"]) / n
    report = {
        "jax_free_rule_median_s": medians["jax_free_rule"],
        "torch_free_rule_median_s": medians["torch_free_rule"],
        "speedup_free_rule": _speedup(per_round, "jax_free_rule", "torch_free_rule"),
        "jax_rule_s_per_layer": rule["jax"],
        "torch_rule_s_per_layer": rule["torch"],
        "target": FLAGS.target,
        "rule_budget_s_per_layer": budget,
    }
    print(
        f"  with a free rule: jax {medians['jax_free_rule'] * 1e3:.1f} ms, torch {medians['torch_free_rule'] * 1e3:.1f} ms "
        f"({report['speedup_free_rule']:.2f}x); so the rule takes {rule['jax'] * 1e3:.1f} ms (jax) and "
        f"{rule['torch'] * 1e3:.1f} ms (torch) per layer"
    )
    if budget <= 0:
        print(f"  {FLAGS.target:g}x is out of reach even with a free rule")
    else:
        print(f"  {FLAGS.target:g}x leaves our rule {budget * 1e3:.1f} ms per layer")
    return report


if __name__ == "__main__":
    app.run(main)
