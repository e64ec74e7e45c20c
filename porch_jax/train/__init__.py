"""Training: one loop (`trainer.Trainer`) with a method and a batch source plugged in.

Modules (imported on use, so `porch_jax.train.losses` stays light):
  config        typed settings: `TrainConfig` (optimizer, method, checkpoint, log, export_every, mesh), `SamplingConfig`
                (with `SamplerConfig`: embedded or vLLM-served samples, push cadence, gap bound, timeouts)
  methods       `Method` = loss parts + coefficients; `METHODS` registry (sft, rwr, opod, opd, grpo, dagrpo)
  sources       batch sources on one base (`BatchSource`): `PackedSource` (packed or one-span decision rows),
                `OpdSource` / `GroupSource` (on-policy, one `ActionSampler` or a served one), `RecordedGroups`
                (offline GRPO), `CombinedViews`; accumulation and several hosts (`place`)
  served_sampler `ServedActionSampler`: on-policy samples from a vLLM server the student is pushed into, the
                logprob-gap rule (`check_logprob_gap`), `served_action_sampler` (the factory from a config)
  step          `TrainStep` (jitted, generic, exact gradient accumulation, donation), `init_train_state`
  trainer       `Trainer` (state, checkpoints, metrics, finite guard, exports), `selection_candidates`
  views         the typed views a batch holds (`TokenView`, `SampledView`, `GroupView`, `ActionsView`)
  packing       the one row format: token rows with target spans (`SeqRow`), one-action rows (`OpdRow`,
                `ExpertContext`, `RecordedGroup`), as fixed-shape arrays; `DataError`
  overlong      rows over the largest bucket: drop, cut or error, and their counts
  mesh          the (data, fsdp, tensor) mesh and every sharding a step needs
  optim         AdamW + warmup/cosine schedule + global-norm clipping
  losses        pure (sum, count) losses; fused_kl: chunked LM-head kernels
  checkpoint    `Checkpointer` (async Orbax, keep-N, mesh-agnostic restore, damaged-step fallback), `export_hf`
  metrics       TensorBoard + progress line, `NonFiniteError`
  distributed   jax.distributed from flags or environment
"""
