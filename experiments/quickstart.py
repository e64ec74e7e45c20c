"""The OPOD quickstart: POrchestra's loop (the paper: /work/shared/seeds/000_cf3e1ad19b41208e.txt, OPOD =
RWR + lambda * OPD) in miniature on a CPU.

    python -m launch.pipeline --config=experiments/quickstart.py [--config.run_dir=runs/qs2]
    python -m launch.pipeline --config=experiments/quickstart_seeds.py   # eight seed sets, ~8x the time

~17 minutes on 2 shared CPU cores (one seed set, with the learning-rate grid; the grid is about half of
it); seed sets multiply that. porch_jax/opod (rows) and launch/pipeline.py (stages) run it; measured
results and how the settings were chosen are in docs/results/opod_quickstart.md.

What each part sets and what it trades off:
- suite: three-clause workplace tasks whose success hinges on the first delegation's harness; budgets leave
  1-2 steps of slack (slack), so a mid-run revision costs success, not only steps. More slack makes every
  method look alike; none makes every slip fatal.
- suite.expert: rare random slips (p_*; imitation averages them away) and three systematic blind spots
  (blind_spots) that imitation copies. BLIND_RATE is the share of relevant delegations on which each acts:
  archive and long_file at 0.6 leave successful SFT rollouts that sometimes carry the fix, so outcome
  supervision (RWR) has something to reweight; handover_2back at 1.0 is never fixed by the policy, so only
  attribution (OPD) reaches it. Rates nearer 1 remove RWR's signal; nearer 0 remove the blind spot.
- policy: a 0.45M-parameter Qwen3 (model: 2 layers, 128 wide, tied embeddings) trained from scratch in the
  "dsl" view (porch_jax/envs/views.py): it reads and writes the suite's compact action-and-state language
  (~10-token actions with pointers instead of copied names and values), so contexts are ~100-250 tokens and
  training, sampling and evaluation are ~10x cheaper than in the "full" (Hermes JSON) view. buckets: padded
  prompt lengths (one compilation each); max_len: the sampler's cache (prompt + action).
- sft: 1000 steps on expert episodes plus hint-following rows (hint_rows per episode row: expert contexts +
  the judge's hint -> the corrected action, so the self-teacher can follow a hint at all) and, with
  empty_hint_rows, the same decisions under an empty hint with the action unchanged (so OPD with empty hints is
  a clean control).
- rwr / opod / opd_empty / dagrpo: start from the SFT weights. RWR, OPOD and OPD-with-empty-hints share
  steps, batch, seed and learning-rate grid, so at each rate OPOD differs from RWR only by opd_weight * OPD.
  lr_grid: each method trains at every rate listed (it must hold the section's learning_rate, which wins
  ties); more rates cost time linearly. opd: the on-policy OPD batch (rows per step, sampled action length,
  temperature). export_every: the candidates of checkpoint selection; fewer exports are cheaper and coarser.
- selection: every trained method's candidates (rates x exports) run greedily on 100 validation tasks (seeds
  disjoint from training, rollouts and held-out evaluation); the best is evaluated, the same rule for every
  method. It adds ~10-15% to the run and guards against mid-run drift.
- eval: 200 held-out tasks with new seeds (names, values, pages, years) under a reweighted mixture (1.5x
  history tasks); greedy.
- seed_sets (experiments/quickstart_seeds.py): run the whole loop once per seed set (porch_jax/eval/seed_sets.py) and report the sets' mean
  and paired differences with t-intervals over sets (RUN_DIR/seed_sets.md).
"""

from ml_collections import ConfigDict

BLIND_SPOTS = ("handover_2back", "archive", "long_file")
# The share of relevant delegations on which each blind spot acts (docstring: "Expert").
BLIND_RATE = {"archive": 0.6, "long_file": 0.6, "handover_2back": 1.0}
TEMPLATES = {"history": 1.0, "mail_text": 1.0, "file_text": 1.0}


def _trainer(steps: int, batch: int, learning_rate: float, warmup: int, seed: int, **extra) -> ConfigDict:
    return ConfigDict(
        {"steps": steps, "batch": batch, "learning_rate": learning_rate, "warmup_steps": warmup, "seed": seed, **extra}
    )


def _opd(batch: int, seed: int) -> ConfigDict:
    return ConfigDict({"batch": batch, "max_new_tokens": 24, "temperature": 1.0, "top_p": 1.0, "seed": seed})


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.run_dir = "runs/quickstart"
    c.seed = 0
    c.methods = ("sft", "rwr", "opod", "opd_empty", "dagrpo")

    c.suite = ConfigDict(
        {
            "mixture": {"templates": TEMPLATES, "p_change": 0.0, "p_distract": 0.0, "slack": (1, 2), "spare_agents": 2},
            "expert": {
                "p_omit_context": 0.05,
                "p_omit_tool": 0.05,
                "p_misscope": 0.05,
                "p_underbudget": 0.05,
                "blind_spots": BLIND_SPOTS,
                "blind_rate": BLIND_RATE,
                "budget_margin": 1,
                "file_budget": 4,
            },
            "subagent": {
                "p_misread": 0.3,
                "p_detour": 0.3,
                "p_persist": 0.5,
                "slip_base": 0.01,
                "slip_tools": 0.5,
                "slip_history": 0.2,
                "max_asks": 2,
            },
            "max_decisions": 12,
            "max_evidence_chars": 160,
        }
    )
    c.expert_rollouts = ConfigDict({"num_tasks": 400, "seed_start": 0, "prefix": "train"})
    c.rollouts = ConfigDict({"num_tasks": 300, "seed_start": 20_000, "prefix": "roll", "temperature": 1.0})
    c.eval = ConfigDict(
        {
            "tasks": {
                "num_tasks": 200,
                "seed_start": 100_000,
                "prefix": "heldout",
                "mixture": {
                    "templates": {"history": 1.5, "mail_text": 1.0, "file_text": 1.0},
                    "p_change": 0.0,
                    "p_distract": 0.0,
                    "slack": (1, 2),
                    "spare_agents": 2,
                },
            },
            "temperature": 0.0,
            "max_tokens": 24,
            "concurrency": 64,
            "seed": 0,
        }
    )

    # Checkpoint selection, the same rule for every method trained after SFT: each exports every
    # `export_every` steps; the export with the most successes on these validation tasks (training
    # mixture, seeds disjoint from training, rollouts and held-out evaluation) is the one evaluated.
    c.selection = ConfigDict({"enabled": True, "tasks": {"num_tasks": 100, "seed_start": 50_000, "prefix": "val"}})

    c.model = ConfigDict(
        {
            "seed": 0,
            "vocab_size": 512,
            "hf": {
                "hidden_size": 128,
                "intermediate_size": 384,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "max_position_embeddings": 512,
                "rope_theta": 10_000.0,
                "initializer_range": 0.02,
            },
        }
    )
    # buckets: padded prompt lengths (one compilation each); max_len: the sampler's cache (prompt + action).
    c.policy = ConfigDict({"view": "dsl", "max_new_tokens": 24, "buckets": (128, 256), "max_len": 288})

    c.optimizer = ConfigDict(
        {
            "learning_rate": 1e-3,
            "warmup_steps": 10,
            "final_lr_ratio": 0.1,
            "weight_decay": 0.01,
            "b1": 0.9,
            "b2": 0.95,
            "eps": 1e-8,
            "max_grad_norm": 1.0,
            "checkpoint_every": 50,
            "log_every": 10,
        }
    )
    # hint_rows: hint-following rows per episode row; empty_hint_rows: add their empty-hint contrast rows
    c.sft = _trainer(1000, 4, 3e-3, 30, 1, hint_rows=0.3, empty_hint_rows=True)
    # The methods after SFT share steps, learning-rate grid, RWR batch and seed: at each rate OPOD differs from RWR
    # only by λ·OPD.
    # lr_grid: each method is also trained at these rates, and checkpoint selection picks rate and step on the
    # validation tasks (the configured rate wins ties; porch_jax/opod/experiment.py `learning_rates`).
    grid = (1e-4, 3e-4, 1e-3)
    c.rwr = _trainer(100, 8, 3e-4, 5, 2, export_every=25, lr_grid=grid)
    c.opod = _trainer(100, 8, 3e-4, 5, 2, export_every=25, lr_grid=grid, opd_weight=1.0, opd=_opd(16, 3))
    c.opd_empty = _trainer(100, 8, 3e-4, 5, 2, export_every=25, lr_grid=grid, opd_weight=1.0, opd=_opd(16, 3))
    c.dagrpo = _trainer(
        40,
        0,
        1e-3,
        5,
        4,
        export_every=10,
        lr_grid=(3e-4, 1e-3, 3e-3),
        clip_eps=0.2,
        group=ConfigDict(
            {"contexts_per_step": 4, "group_size": 4, "max_new_tokens": 24, "temperature": 1.0, "top_p": 1.0, "seed": 4}
        ),
    )
    return c
