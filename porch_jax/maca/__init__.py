"""MACA (structure-guided orchestration): agent pools, sentence encoders, the GraphSpec prior
(relevance Eq. 4, edge policy Eq. 5, edge MLP Eq. 6, P_prior Eq. 7), the masked token-aware policy
maths (Eq. 11, 12), the orchestration rollout, GRPO training with the Table 3 variants, evaluation and
analyses, and a synthetic agent world for CPU-scale learning.

Callers import the submodules (`porch_jax.maca.train`, `.experiment`, ...): this package file imports nothing,
so reading MACA's config schema does not load JAX through it."""
