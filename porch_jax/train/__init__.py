"""Training: one loop (`trainer.Trainer`) with a method and a batch source plugged in.

Modules (imported on use, so `porch_jax.train.losses` stays light):
  config        typed settings: `TrainConfig` (optimizer, method, checkpoint, log, export_every, mesh), `SamplingConfig`
                (with `SamplerConfig`: embedded or vLLM-served samples, push cadence, gap bound, timeouts)
  methods       `Method` = loss parts + coefficients; `METHODS` registry (sft, rwr, opod, opd, grpo, dagrpo)
  sources       batch sources: `RecordSource` (data.py records, accumulation, hosts), `PackedSource`,
                `OpdSource` / `GroupSource` (on-policy, one `ActionSampler` or a served one), `CombinedViews`
  served_sampler `ServedActionSampler`: on-policy samples from a vLLM server the student is pushed into, the
                logprob-gap rule (`check_logprob_gap`), `served_action_sampler` (the factory from a config)
  step          `TrainStep` (jitted, generic, exact gradient accumulation, donation), `init_train_state`
  trainer       `Trainer` (state, checkpoints, metrics, finite guard, exports), `selection_candidates`
  records       launch/train.py's typed schema (`RecordsConfig`) and `records_trainer`
  data          trajectory records -> one-decision examples, buckets, the resumable host-sharded `BatchIterator`
  packing       packed decision rows and one-action rows as fixed-shape arrays
  mesh          the (data, fsdp, tensor) mesh and every sharding a step needs
  optim         AdamW + warmup/cosine schedule + global-norm clipping
  losses        pure (sum, count) losses; fused_kl: chunked LM-head kernels
  checkpoint    `Checkpointer` (async Orbax, keep-N, mesh-agnostic restore, damaged-step fallback), `export_hf`
  metrics       TensorBoard + progress line, `NonFiniteError`
  distributed   jax.distributed from flags or environment
"""
