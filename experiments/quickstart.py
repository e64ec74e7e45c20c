"""The OPOD quickstart: POrchestra's loop (the paper: /work/shared/seeds/000_cf3e1ad19b41208e.txt, OPOD =
RWR + lambda * OPD) in miniature on a CPU.

    python -m launch.pipeline --config=experiments/quickstart.py [--config.run_dir=runs/qs2]
    python -m launch.pipeline --config=experiments/quickstart.py:seed_set=3    # seed set 3 alone
    python -m launch.pipeline --config=experiments/quickstart.py:seed_sets=8   # sets 0-7 and their report

~17 minutes on 2 shared CPU cores for POrchestra (one seed set, with the learning-rate grid; the grid is about half
of it), and the two other frameworks (`frameworks`) add about 45% to that: 875 s of a 2,873 s run measured on 2
cores shared with another training job (a quiet run is not yet timed); `seed_sets=N` takes N times a run (~100 min on 2 cores for 8 sets
of POrchestra alone with the grid, ~50 min without).
porch_jax/opod (rows, stages) and launch/pipeline.py (flags) run it; measured results and how the settings
were chosen are in docs/results/opod_quickstart.md.

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
- frameworks: the other two orchestration frameworks the paper trains, beside POrchestra (whose methods are
  `methods`): Orchestra-o1 (`delegate_all`: several subtasks run concurrently to their end, results joined) and the
  lifecycle orchestrator (AOrchestra-style: re-orchestration only when a sub-agent returns). Each gets the scripted
  expert playing its own action set (400 episodes), SFT from the same initial model with the sft section, rollouts
  of its SFT policy under its own engine, and RWR and DA-GRPO from its SFT with the rwr and dagrpo sections (grid,
  selection and held-out evaluation included), through the same trainer; results.md reports them as
  sft@orchestra_o1, rwr@lifecycle, ... beside POrchestra's rows, and OPOD / OPD as not applicable to them (no
  mid-run feedback: their sub-agents only return when done). Both together cost about 45% of POrchestra's time;
  `frameworks=()` (`--config.frameworks="()"`) trains POrchestra alone, whose rows do not change with it (the
  measured run's POrchestra rows equal those recorded before the frameworks existed).
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
- the argument (`get_config(arg)`, typed_config.parse_arg): no argument is the quickstart as written, in
  runs/quickstart. `seed_set=k`: seed set k, in runs/quickstart_seeds/seed_set_k: every seed + 10k (initial
  weights, batch order, OPD and GRPO samples, rollout and evaluation sampling) and the SFT rollouts' task seeds
  + 1,000k; expert data, validation and held-out tasks stay, so sets are compared on the same tasks.
  `seed_sets=N`: sets 0..N-1 in runs/quickstart_seeds/seed_set_k (the same folders, so a single set's run is
  resumed, not redone) and runs/quickstart_seeds/seed_sets.{md,json,png}: each method's mean held-out success
  and spread over the sets and the paired differences (OPOD - RWR, ...) with 95% t-intervals over sets
  (porch_jax/eval/seed_sets.py). Single runs move with float-level rounding; the mean over sets is the claim
  to check. Four sets left OPOD - RWR's interval including zero; eight exclude it (README). Each extra set
  narrows the intervals and costs one more quickstart run.
"""

from ml_collections import ConfigDict

from porch_jax.opod.config import ROLLOUT_SEED_STRIDE, SEED_SET_STRIDE
from porch_jax.typed_config import ConfigError, parse_arg

BLIND_SPOTS = ("handover_2back", "archive", "long_file")
# The share of relevant delegations on which each blind spot acts (docstring: "Expert").
BLIND_RATE = {"archive": 0.6, "long_file": 0.6, "handover_2back": 1.0}
TEMPLATES = {"history": 1.0, "mail_text": 1.0, "file_text": 1.0}


def _trainer(steps: int, batch: int, learning_rate: float, warmup: int, seed: int, **extra) -> ConfigDict:
    return ConfigDict(
        {"steps": steps, "batch": batch, "learning_rate": learning_rate, "warmup_steps": warmup, "seed": seed, **extra}
    )


def _opd(batch: int, seed: int) -> ConfigDict:
    return ConfigDict(
        {"batch": batch, "sampling": {"max_new_tokens": 24, "temperature": 1.0, "top_p": 1.0, "seed": seed}}
    )


def get_config(arg: str | None = None) -> ConfigDict:
    a = parse_arg(arg, seed_set=-1, seed_sets=0)
    if a.seed_set < -1 or a.seed_sets < 0 or (a.seed_sets and a.seed_set >= 0):
        raise ConfigError(f"config argument {arg!r}: seed_set=k (k >= 0) or seed_sets=N (N >= 1), not both")
    k = max(a.seed_set, 0)
    s = SEED_SET_STRIDE * k  # every seed of set k is its set-0 seed + s (porch_jax/opod/config.py with_seed_set)
    c = ConfigDict()
    c.run_dir = "runs/quickstart" if a.seed_set < 0 and not a.seed_sets else "runs/quickstart_seeds"
    if a.seed_set >= 0:
        c.run_dir += f"/seed_set_{k}"
    c.seed_sets = tuple(range(a.seed_sets))
    c.seed = 0 + s
    c.methods = ("sft", "rwr", "opod", "opd_empty", "dagrpo")
    # The other frameworks trained beside POrchestra: their sft, rwr and dagrpo (porch_jax/opod/config.py FRAMEWORKS)
    c.frameworks = ("orchestra_o1", "lifecycle")

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
    c.rollouts = ConfigDict(
        {"num_tasks": 300, "seed_start": 20_000 + ROLLOUT_SEED_STRIDE * k, "prefix": "roll", "temperature": 1.0}
    )
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
            "seed": 0 + s,
        }
    )

    # Checkpoint selection, the same rule for every method trained after SFT: each exports every
    # `export_every` steps; the export with the most successes on these validation tasks (training
    # mixture, seeds disjoint from training, rollouts and held-out evaluation) is the one evaluated.
    c.selection = ConfigDict({"enabled": True, "tasks": {"num_tasks": 100, "seed_start": 50_000, "prefix": "val"}})

    c.model = ConfigDict(
        {
            "seed": 0 + s,
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
    # buckets: padded prompt lengths (one compilation each); max_len: the sampler's cache (prompt + action);
    # overlong: a training row over the largest bucket, "drop" | "cut" | "error" (porch_jax/train/overlong.py).
    c.policy = ConfigDict(
        {"view": "dsl", "max_new_tokens": 24, "buckets": (128, 256), "max_len": 288, "overlong": "drop"}
    )

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
        }
    )
    c.checkpoint = ConfigDict({"every": 50, "keep": 1, "async_save": False})
    c.log = ConfigDict({"every": 10, "tensorboard": False})
    # hint_rows: hint-following rows per episode row; empty_hint_rows: add their empty-hint contrast rows
    c.sft = _trainer(1000, 4, 3e-3, 30, 1 + s, hint_rows=0.3, empty_hint_rows=True)
    # The methods after SFT share steps, learning-rate grid, RWR batch and seed: at each rate OPOD differs from RWR
    # only by λ·OPD.
    # lr_grid: each method is also trained at these rates, and checkpoint selection picks rate and step on the
    # validation tasks (the configured rate wins ties; porch_jax/opod/experiment.py `learning_rates`).
    grid = (1e-4, 3e-4, 1e-3)
    c.rwr = _trainer(100, 8, 3e-4, 5, 2 + s, export_every=25, lr_grid=grid)
    c.opod = _trainer(100, 8, 3e-4, 5, 2 + s, export_every=25, lr_grid=grid, opd_weight=1.0, opd=_opd(16, 3 + s))
    c.opd_empty = _trainer(100, 8, 3e-4, 5, 2 + s, export_every=25, lr_grid=grid, opd_weight=1.0, opd=_opd(16, 3 + s))
    c.dagrpo = _trainer(
        40,
        0,
        1e-3,
        5,
        4 + s,
        export_every=10,
        lr_grid=(3e-4, 1e-3, 3e-3),
        clip_eps=0.2,
        group=ConfigDict(
            {
                "contexts_per_step": 4,
                "group_size": 4,
                "sampling": {"max_new_tokens": 24, "temperature": 1.0, "top_p": 1.0, "seed": 4 + s},
            }
        ),
    )
    return c
