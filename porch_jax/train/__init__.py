"""Training: records -> token batches -> sharded SFT / RWR / OPOD / GRPO steps -> Orbax checkpoints.

Modules (imported on use, so `porch_jax.train.losses` stays light):
  data          trajectory records -> examples (prompt = rendered context, target = decision + eos),
                buckets, the resumable host-sharded `BatchIterator`
  mesh          the (data, fsdp, tensor) mesh and every sharding a step needs
  optim         AdamW + warmup/cosine schedule + global-norm clipping
  losses        pure (sum, count) losses; fused_kl: chunked LM-head kernels
  step          `TrainStep` (jitted, exact gradient accumulation, donation), `init_train_state`
  checkpoint    `Checkpointer` (async Orbax, keep-N, mesh-agnostic restore, damaged-step fallback), `export_hf`
  metrics       TensorBoard + progress line, `NonFiniteError`
  distributed   jax.distributed from flags or environment
  trainer       `Trainer` (the loop), `SamplerHook` (on-policy OPD sampling)
"""
