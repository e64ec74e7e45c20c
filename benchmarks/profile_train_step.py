"""Where a SmolLM2-shaped train step's time goes, ours against PyTorch's, part by part, on this CPU.

    python benchmarks/profile_train_step.py [--batch 4] [--seq 512] [--repeats 5] [--json OUT]

Parts, each forward and backward at SmolLM2-135M's shape (30 layers, hidden 576, 9 query / 3 KV heads of 64, MLP
1,536, vocabulary 49,152), float32, random weights, 2 threads:

- attention: the causal attention core of all 30 layers (scores, softmax, weighted sum; projections excluded): ours
  (models/layers.causal_attention, blockwise) against torch's scaled_dot_product_attention (a fused flash kernel).
- projections + MLP: every layer's q, k, v, o, gate, up and down matmuls with the SwiGLU, attention replaced by
  identity, so this is the dense work around it.
- LM head + loss: cross-entropy over the vocabulary at every position from final hidden states: ours (the chunked
  fused kernel, no [tokens, vocab] logits) against torch's logits + F.cross_entropy.
- optimizer: one AdamW update of all 135M parameters (optax, with global-norm clipping, against torch.optim.AdamW
  with clip_grad_norm_).
- whole step: our trainer's SFT step against transformers' LlamaForCausalLM + AdamW.

Medians of `--repeats` timed calls after a warm-up, the two frameworks alternating so load hits both alike.
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

from porch_jax.runtime import tune_malloc  # noqa: E402

tune_malloc()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from porch_jax.models.presets import preset  # noqa: E402

HF = preset("smollm2-135m")
L, H, NQ, NKV, D, FF, V = (HF[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                           "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size"))  # fmt: skip


def once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def jax_parts(batch: int, seq: int) -> dict:
    from porch_jax.models.layers import causal_attention
    from porch_jax.train.losses import token_cross_entropy_from_hidden

    key = jax.random.key(0)
    ks = jax.random.split(key, 8)
    g = NQ // NKV
    q = jax.random.normal(ks[0], (L, batch, seq, NKV, g, D)) * 0.1
    k = jax.random.normal(ks[1], (L, batch, seq, NKV, D))
    v = jax.random.normal(ks[2], (L, batch, seq, NKV, D))

    @jax.jit
    def attention(q, k, v):
        def loss(q, k, v):
            return sum(jnp.sum(causal_attention(q[i], k[i], v[i])) for i in range(L))

        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    std = 0.02
    w = {
        "qkv": jax.random.normal(ks[3], (L, H, (NQ + 2 * NKV) * D)) * std,
        "o": jax.random.normal(ks[4], (L, NQ * D, H)) * std,
        "gate_up": jax.random.normal(ks[5], (L, H, 2 * FF)) * std,
        "down": jax.random.normal(ks[6], (L, FF, H)) * std,
    }
    x = jax.random.normal(ks[7], (batch * seq, H))

    @jax.jit
    def dense(w, x):
        def loss(w, x):
            for i in range(L):
                qkv = x @ w["qkv"][i]
                x = x + qkv[:, : NQ * D] @ w["o"][i]  # attention as identity on the queries
                gu = x @ w["gate_up"][i]
                x = x + (jax.nn.silu(gu[:, :FF]) * gu[:, FF:]) @ w["down"][i]
            return jnp.sum(x)

        return jax.grad(loss)(w, x)

    head = jax.random.normal(ks[0], (H, V)) * std
    hidden = jax.random.normal(ks[1], (batch, seq, H))
    targets = jax.random.randint(ks[2], (batch, seq), 0, V)
    mask = jnp.ones((batch, seq), bool)

    @jax.jit
    def lm_head(hidden, head):
        def loss(hidden, head):
            total, count = token_cross_entropy_from_hidden(hidden, head, targets, mask)
            return total / count

        return jax.grad(loss, argnums=(0, 1))(hidden, head)

    params = {"embed": jax.random.normal(ks[3], (V, H)) * std, **w}
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4, b1=0.9, b2=0.95, weight_decay=0.01))
    state = tx.init(params)
    grads = jax.tree.map(lambda p: p * 1e-3, params)

    @jax.jit
    def optimizer(params, state):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return {
        "attention": lambda: jax.block_until_ready(attention(q, k, v)),
        "projections + MLP": lambda: jax.block_until_ready(dense(w, x)),
        "LM head + loss": lambda: jax.block_until_ready(lm_head(hidden, head)),
        "optimizer": lambda: jax.block_until_ready(optimizer(params, state)),
        "whole step": jax_step(batch, seq),
    }


def jax_step(batch: int, seq: int):
    from benchmarks.train_steps import StepSpec, build
    from porch_jax.train.mesh import make_mesh

    built = build(StepSpec("smollm2_135m", "sft", batch, seq, 64, "float32"), make_mesh((1, 1, 1)))
    return lambda: jax.block_until_ready(built())


def torch_parts(batch: int, seq: int) -> dict:
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(2)
    q = (torch.randn(L, batch, NQ, seq, D) * 0.1).requires_grad_()
    k = torch.randn(L, batch, NKV, seq, D).requires_grad_()
    v = torch.randn(L, batch, NKV, seq, D).requires_grad_()

    def attention():
        out = sum(
            F.scaled_dot_product_attention(q[i], k[i], v[i], is_causal=True, enable_gqa=True).sum() for i in range(L)
        )
        out.backward()

    std = 0.02
    w = {
        "qkv": (torch.randn(L, H, (NQ + 2 * NKV) * D) * std).requires_grad_(),
        "o": (torch.randn(L, NQ * D, H) * std).requires_grad_(),
        "gate_up": (torch.randn(L, H, 2 * FF) * std).requires_grad_(),
        "down": (torch.randn(L, FF, H) * std).requires_grad_(),
    }
    x0 = torch.randn(batch * seq, H)

    def dense():
        x = x0
        for i in range(L):
            qkv = x @ w["qkv"][i]
            x = x + qkv[:, : NQ * D] @ w["o"][i]
            gu = x @ w["gate_up"][i]
            x = x + (F.silu(gu[:, :FF]) * gu[:, FF:]) @ w["down"][i]
        x.sum().backward()

    head = (torch.randn(V, H) * std).requires_grad_()
    hidden = torch.randn(batch * seq, H, requires_grad=True)
    targets = torch.randint(0, V, (batch * seq,))

    def lm_head():
        F.cross_entropy(hidden @ head.T, targets).backward()

    params = [torch.nn.Parameter(torch.randn(V, H) * std)] + [
        torch.nn.Parameter(t.detach().clone()) for t in w.values()
    ]
    for p in params:
        p.grad = p.detach() * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)

    def optimizer():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    fields = {k: val for k, val in HF.items() if k not in ("model_type",)}
    model = LlamaForCausalLM(LlamaConfig(**fields, attn_implementation="sdpa"))
    model.train()
    full_opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)
    ids = torch.randint(0, V, (batch, seq))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        full_opt.step()
        full_opt.zero_grad(set_to_none=True)

    return {
        "attention": attention,
        "projections + MLP": dense,
        "LM head + loss": lm_head,
        "optimizer": optimizer,
        "whole step": step,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    ours, theirs = jax_parts(args.batch, args.seq), torch_parts(args.batch, args.seq)
    rows = {}
    for name in ours:
        a, b = [], []
        ours[name]()  # compile / warm up
        theirs[name]()
        for _ in range(args.repeats):
            a.append(once(ours[name]))
            b.append(once(theirs[name]))
        rows[name] = {"jax_s": statistics.median(a), "torch_s": statistics.median(b)}
        rows[name]["ratio_torch_over_jax"] = rows[name]["torch_s"] / rows[name]["jax_s"]
        print(f"{name}: ours {rows[name]['jax_s']:.3f} s, torch {rows[name]['torch_s']:.3f} s "
              f"(torch/ours {rows[name]['ratio_torch_over_jax']:.2f})", flush=True)  # fmt: skip
    out = {"batch": args.batch, "seq": args.seq, "load_average_1min": os.getloadavg()[0], "parts": rows}
    print("| part | ours s | torch s | torch / ours |\n|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['jax_s']:.3f} | {r['torch_s']:.3f} | {r['ratio_torch_over_jax']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
