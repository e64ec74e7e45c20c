"""One process of tests/train/test_multiprocess.py's packed-source run: SFT and RWR on packed rows, OPOD with
on-policy OPD, DA-GRPO and GRPO replaying recorded groups over 2 accumulation steps, a few steps each, on the tiny
model loaded per slice onto a mesh over every process's devices; writes each method's per-step metrics, the tokens
its sampler drew and the final parameters' norm as JSON.

    python multiprocess_worker.py MODEL_DIR OUT.json MESH                        # one process, e.g. MESH 1,1,1
    python multiprocess_worker.py MODEL_DIR OUT.json MESH ADDRESS PROCESS_ID N   # process PROCESS_ID of N
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tiny_data, when run as a script

import tiny_data  # noqa: E402

from porch_jax.train import distributed  # noqa: E402

STEPS = 3
BUCKETS = (256,)
BATCH = 4  # rows per step: 2 over each of the 2 batch shards of a (1, 2, 2) mesh
SAMPLING = dict(max_new_tokens=8, temperature=1.0, top_p=1.0)


class Recorded:
    """An ActionSampler that keeps the token ids it returned, step by step."""

    def __init__(self, inner):
        self.inner, self.cfg, self.samples = inner, inner.cfg, []

    @property
    def stats(self):
        return self.inner.stats

    def __call__(self, student, prompts, step, *, seeds=None):
        out = self.inner(student, prompts, step, seeds=seeds)
        self.samples.append([c.token_ids for c in out])
        return out

    def check_step(self, step, metrics):
        self.inner.check_step(step, metrics)


def _reply(text: str) -> str:
    """DA-GRPO's reading of a sampled reply: the untrained tiny model writes no tool call, so its text picks one of
    two calls (one matching the expert's), which gives each group rewards that differ with the samples."""
    from porch_jax.protocol import render_call

    name = "delegate" if sum(map(ord, text)) % 2 else "finish"
    return render_call({"name": name, "arguments": {}})


def main() -> None:
    model_dir, out, mesh_arg = sys.argv[1:4]
    multi = len(sys.argv) > 4
    cfg = distributed.DistributedConfig(
        coordinator_address=sys.argv[4] if multi else None,
        process_id=int(sys.argv[5]) if multi else None,
        num_processes=int(sys.argv[6]) if multi else None,
        timeout_s=120,
        cpu_devices=2 if multi else 1,
    )
    distributed.initialize(cfg)

    import dataclasses

    import jax
    import optax
    from transformers import AutoTokenizer

    from porch_jax.models import from_pretrained
    from porch_jax.opod import rows as episode_rows
    from porch_jax.opod.rewards import dagrpo_reward
    from porch_jax.rows import records
    from porch_jax.train import mesh as mesh_lib
    from porch_jax.train import sources
    from porch_jax.train.config import CheckpointConfig, LogConfig, OptimizerConfig, SamplingConfig, TrainConfig
    from porch_jax.train.methods import MethodConfig, make_method
    from porch_jax.train.trainer import Trainer

    shape = tuple(int(x) for x in mesh_arg.split(","))
    tok = AutoTokenizer.from_pretrained(model_dir)
    eps = tiny_data.episodes(tok=tok)
    sampling = SamplingConfig(seed=7, **SAMPLING)
    contexts = [dataclasses.replace(c, decode=_reply) for c in episode_rows.expert_contexts(eps, tok, "full")]
    recorded = records.recorded_groups(tiny_data.groups(6, size=2, tok=tok), tok)

    def plan(method, mesh):
        if method == "sft":
            return sources.PackedSource(
                episode_rows.packed_rows(eps, tok, "full", BUCKETS[-1]), BATCH, BUCKETS, 1, mesh
            )
        rwr_rows = episode_rows.packed_rows(eps, tok, "full", BUCKETS[-1], weight=lambda ep: float(ep.outcome.success))
        if method == "rwr":
            return sources.PackedSource(rwr_rows, BATCH, BUCKETS, 2, mesh)
        if method == "opod":
            opd = sources.OpdSource(
                episode_rows.opd_rows(eps, tiny_data.hints(eps), tok, "full"), tok, sampling, BATCH, BUCKETS, mesh
            )
            return sources.CombinedViews(sources.PackedSource(rwr_rows, BATCH, BUCKETS, 3, mesh, "rwr"), opd)
        if method == "grpo":  # 2 groups of 2 a step, one group per accumulation step: 1 row per batch shard
            return sources.RecordedGroups(recorded, BATCH // 2, BUCKETS, 4, mesh, accum_steps=2)
        return sources.GroupSource(
            contexts, tok, sampling, BATCH // 2, 2, BUCKETS, dagrpo_reward(tiny_data.TOOLS), mesh
        )

    results = {}
    for method in ("sft", "rwr", "opod", "dagrpo", "grpo"):
        mesh = mesh_lib.make_mesh(shape)
        source = plan(method, mesh)
        samplers = [s for s in getattr(source, "sources", (source,)) if hasattr(s, "sampler")]
        for s in samplers:
            s.sampler = Recorded(s.sampler)
        train = TrainConfig(
            steps=STEPS,
            optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1, weight_decay=0.0),
            method=MethodConfig(name=method),
            mesh=shape,
            checkpoint=CheckpointConfig(every=100),
            log=LogConfig(every=100),
        )
        model = from_pretrained(model_dir, mesh=mesh)  # each process reads only its devices' slices
        trainer = Trainer(train, model, make_method(train.method), source, None, tokenizer=tok, stream=None)
        history = trainer.run().history
        norm = jax.jit(optax.global_norm, out_shardings=mesh_lib.replicated(mesh))(trainer.state["params"])
        results[method] = {
            "metrics": history,
            "samples": [s.sampler.samples for s in samplers],
            "param_norm": float(jax.device_get(norm)),
        }
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
